"""Where graded code runs: bubblewrap around a zygote, or namespaces without it, or rlimits alone.

The policy (``sandbox:`` in a grader config) is ``auto`` (bubblewrap when it works; otherwise,
as root, new namespaces and an unprivileged user through util-linux ``unshare``/``setpriv``, or
refuse when even that cannot run; not root, rlimits only; a one-time warning names what is not
enforced), ``strict`` (bubblewrap or refuse: :class:`SandboxUnavailable`, exit status 2 on the
command line) or ``none`` (trusted code: rlimits and the per-call fork only, said loudly by
``gradekit validate``).

Why auto never runs code as root in the host's namespaces: a root sample can ptrace the zygote
or open its pipe to the host through ``/proc/<zygote>/fd`` (and forge later samples' replies),
``kill -9 -1`` the machine, and reach every socket of the host. Without bubblewrap, as root
(the usual container), the worker therefore enters new pid, net, ipc, uts and mount namespaces
(``unshare``), gets private tmpfs mounts at ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (HOME is a
folder there) and a tmpfs over every folder on the interpreter's path that ``nobody`` could not
traverse (``/root``), and only then becomes ``nobody`` with no capabilities (``setpriv``).

Under bubblewrap a worker gets new user, pid, network, IPC, UTS and cgroup namespaces, a
cleared environment, a read-only view of the interpreter, its standard library and the
packages the grader declares, a fresh ``/proc`` of its own pid namespace, a small writable
tmpfs for per-call temp dirs, ``--die-with-parent`` and ``--new-session``. Running as root, the
sandbox switches to ``nobody`` first (a private mount namespace makes the interpreter readable
to it), because the kernel does not apply ``RLIMIT_NPROC`` to uid 0: without the switch a fork
bomb would not be stopped. Whether all this works is probed once per process.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Policy = Literal["auto", "strict", "none"]
POLICIES: tuple[str, ...] = ("auto", "strict", "none")
NOBODY = 65534
PACKAGE = "bubblewrap"  # the Debian/Ubuntu/Fedora package that installs bwrap
SITE = "/gradekit/site"  # where declared packages appear inside the sandbox
SCRATCH_MB = 256  # the sandbox's writable tmpfs


class SandboxUnavailable(ValueError):
    """``sandbox: strict`` and bubblewrap cannot run here; the message names the package."""


class SandboxWarning(RuntimeWarning):
    """Graded code runs with less isolation than bubblewrap gives (``sandbox: auto`` without it)."""


@dataclass(frozen=True)
class Isolation:
    """What a worker actually gets, for reports and ``validate``."""

    kind: Literal["bubblewrap", "namespaces", "rlimits", "none"]
    as_nobody: bool = False  # root switched to nobody so that RLIMIT_NPROC applies
    network: bool = False
    not_enforced: tuple[str, ...] = ()
    reason: str = ""  # why bubblewrap is not used

    def describe(self) -> str:
        if self.kind == "bubblewrap":
            text = "bubblewrap (namespaces: user, pid, net, ipc, uts; read-only filesystem; fork per call)"
            if self.network:
                text += "; network ALLOWED by the config"
            if self.not_enforced:
                text += "; not enforced: " + ", ".join(self.not_enforced)
            return text
        if self.kind == "namespaces":
            text = "namespaces without bubblewrap (as nobody; new pid, net, ipc, uts, mount namespaces; private /tmp, /dev/shm, HOME; fork per call)"
            if self.network:
                text += "; network ALLOWED by the config"
            return text + "; not enforced: " + ", ".join(self.not_enforced)
        if self.kind == "none":
            return "NONE: sandbox: none, the code runs unisolated (rlimits and a fork per call only); use only for trusted code"
        return f"rlimits only ({self.reason}); not enforced: " + ", ".join(self.not_enforced)


NAMESPACE_GAPS = ("filesystem isolation for reads (world-readable host files are readable)",
                  "writes to world-writable host folders other than /tmp, /var/tmp and /dev/shm")
RLIMIT_ONLY_GAPS = ("network isolation", "filesystem isolation (reads and writes outside the temp dir)",
                    "a private /proc (other processes' command lines are readable)",
                    "killing processes that leave the call's session")


@dataclass
class _Probe:
    lock: threading.Lock = field(default_factory=threading.Lock)
    results: dict[tuple[bool, str | None], tuple[list[str] | None, bool, str]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    namespaces: dict[tuple, str] = field(default_factory=dict)
    pid1: dict[str, bool] = field(default_factory=dict)
    stage: str | None = None


_PROBE = _Probe()


def _python() -> tuple[str, list[str]]:
    """The real interpreter (a venv's python is a symlink to it) and the folders it needs."""
    exe = os.path.realpath(sys.executable)
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if not any(exe.startswith(root + os.sep) for root in roots):
        roots.add(os.path.dirname(exe))
    return exe, sorted(roots)


@functools.lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    import importlib.metadata

    return importlib.metadata.packages_distributions()


def _dist_info(distribution: str) -> str | None:
    """The installed ``*.dist-info`` folder of a distribution (what ``importlib.metadata.version`` reads)."""
    import importlib.metadata

    try:
        path = getattr(importlib.metadata.distribution(distribution), "_path", None)
    except importlib.metadata.PackageNotFoundError:
        return None
    return os.path.realpath(path) if path is not None and os.path.isdir(path) else None


def package_paths(packages: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Each declared top-level package's folder (or single file), found without importing it."""
    found: dict[str, str] = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise ValueError(f"packages: {name!r} is not installed in this environment")
        if spec.submodule_search_locations:
            path = os.path.realpath(list(spec.submodule_search_locations)[0])
        elif spec.origin and os.path.exists(spec.origin):
            path = os.path.realpath(spec.origin)
        else:
            continue  # built in: nothing to bind
        found[name] = path
        for dist in _distributions().get(name, ()):  # its metadata too: a package may read its own or a peer's version
            meta = _dist_info(dist)
            if meta is not None:
                found[os.path.basename(meta)] = meta
        libs = os.path.join(os.path.dirname(path), f"{name}.libs")  # wheels' bundled shared libraries
        if os.path.isdir(libs):
            found[f"{name}.libs"] = os.path.realpath(libs)
    return found


def _as_pid_1() -> bool:
    """Whether this bwrap can start the zygote as pid 1 of its namespace (bubblewrap >= 0.4): then,
    as in the namespace mode, no process of a call can signal the zygote (pid 1 has no default
    signal actions), so a call cannot take its worker down under the next sample."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    if exe not in _PROBE.pid1:
        try:
            shown = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            shown = ""
        _PROBE.pid1[exe] = "--as-pid-1" in shown
    return _PROBE.pid1[exe]


def _bwrap_argv(binds: list[tuple[str, str]], env: dict[str, str], network: bool) -> list[str]:
    argv = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if _as_pid_1():
        argv.append("--as-pid-1")
    if not network:
        argv.append("--unshare-net")
    for name in ("usr", "lib", "lib64", "lib32", "bin", "sbin"):
        path = f"/{name}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--ro-bind-try", "/etc/localtime", "/etc/localtime"]
    if network:
        for path in ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates"):
            argv += ["--ro-bind-try", path, path]
    for source, dest in binds:
        argv += ["--ro-bind", source, dest]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(SCRATCH_MB << 20), "--tmpfs", "/tmp",
             "--size", str(64 << 20), "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue", "--chdir", "/tmp"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv


def _stage_dir() -> str:
    """An empty, world-traversable folder whose subfolders are mount points in a private mount namespace."""
    if _PROBE.stage is None:
        stage = tempfile.mkdtemp(prefix="gradekit-sandbox-")
        os.chmod(stage, 0o755)
        _PROBE.stage = stage
        atexit.register(shutil.rmtree, stage, True)
    return _PROBE.stage


def _as_nobody(argv: list[str], binds: list[tuple[str, str]]) -> list[str]:
    """Root: bind the sources into a private mount namespace where nobody can reach them, then
    become nobody and start bubblewrap there (its own user namespace maps nobody, not root)."""
    stage = _stage_dir()
    script, staged = [], []
    for i, (source, dest) in enumerate(binds):
        point = os.path.join(stage, str(i))
        os.makedirs(point, exist_ok=True)
        if os.path.isfile(source):
            point += ".file"
            Path(point).touch()
        script.append(f"mount --bind {shlex.quote(source)} {shlex.quote(point)}")
        staged.append((point, dest))
    args = []
    it = iter(range(len(argv)))
    for i in it:  # swap each --ro-bind SOURCE for its staged mount point
        args.append(argv[i])
        if argv[i] == "--ro-bind" and (argv[i + 1], argv[i + 2]) in binds:
            point, dest = staged[binds.index((argv[i + 1], argv[i + 2]))]
            args += [point, dest]
            next(it)
            next(it)
    script.append("exec setpriv --reuid=%d --regid=%d --clear-groups -- \"$@\"" % (NOBODY, NOBODY))
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", "; ".join(script), "sandbox", *args]


def command(python_args: list[str], *, packages: dict[str, str], env: dict[str, str], network: bool,
            as_nobody: bool) -> list[str]:
    """The argv that starts ``python python_args`` inside bubblewrap."""
    exe, roots = _python()
    binds = [(root, root) for root in roots] + [(path, f"{SITE}/{os.path.basename(path)}") for path in packages.values()]
    argv = _bwrap_argv(binds, env, network) + ["--", exe, *python_args]
    return _as_nobody(argv, binds) if as_nobody else argv


TOOLS = ("unshare", "setpriv", "mount", "mkdir", "sh")  # util-linux and a shell: the namespace mode's parts
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable host folders that get a private tmpfs each


def under_private(path: str) -> str | None:
    """The private place (/tmp, /var/tmp, /dev/shm) ``path`` lies under, or None."""
    return next((place for place in PRIVATE if path == place or path.startswith(place + os.sep)), None)


def kept_in_private(sources: list[str]) -> list[str]:
    """The entries of the private places that hold bound sources: a call's wipe leaves them (they are read-only
    binds, and walking a venv to fail to delete it would cost every call)."""
    return sorted({os.path.join(place, os.path.relpath(source, place).split(os.sep)[0])
                   for source in sources if (place := under_private(source)) is not None and source != place})


def _tools() -> dict[str, str] | None:
    found = {name: shutil.which(name) for name in TOOLS}
    # Resolved: a PATH entry that is a link in /tmp would vanish under the private /tmp.
    return None if None in found.values() else {name: os.path.realpath(path) for name, path in found.items()}  # type: ignore[arg-type]


def _closed_ancestor(path: str) -> str | None:
    """The outermost folder above ``path`` that others may not enter (``/root``, 0700), if any."""
    current = "/"
    for part in Path(path).parts[1:-1]:
        current = os.path.join(current, part)
        try:
            if not os.stat(current).st_mode & 0o001:
                return current
        except OSError:
            return None
    return None


def namespace_command(python_args: list[str], *, sources: list[str], network: bool, tools: dict[str, str]) -> list[str]:
    """The argv that starts ``python python_args`` as nobody in new namespaces, without bubblewrap.

    In a private mount namespace (still root): each folder above the interpreter (or a package
    folder) that nobody could not enter gets an empty tmpfs, and the folder itself is bound back
    read-only at its own path (so absolute RUNPATHs keep working), ``/tmp``, ``/var/tmp`` and
    ``/dev/shm`` get private tmpfs mounts and ``/dev/mqueue`` the new IPC namespace's queues;
    then ``setpriv`` drops to nobody with no capabilities and no new privileges. The
    interpreter is pid 1 of its pid namespace: nothing inside can signal it (no handler) and the
    whole namespace dies with it.
    """
    exe, _ = _python()
    q = shlex.quote
    stage = _stage_dir()
    covers: list[str] = []
    rebind: list[tuple[str, str]] = []
    for source in sources:
        if under_private(source):
            continue  # bound into its place's private tmpfs below
        cover = _closed_ancestor(source)
        if cover is not None:
            if not any(cover == c or cover.startswith(c + os.sep) for c in covers):
                covers = [c for c in covers if not c.startswith(cover + os.sep)] + [cover]
            rebind.append((source, os.path.join(stage, f"ns{len(rebind)}")))
    script = ["cd /"]
    # Each private place's tmpfs is made beside the host's (under the stage), gets what the interpreter and the
    # packages need from that place bound in read-only at the same path (a venv under /tmp, /var/tmp or /dev/shm),
    # and only then is moved over the place: mounted over it first, it would hide them.
    fresh: list[tuple[str, str]] = []
    for i, (place, size) in enumerate(zip(PRIVATE, (SCRATCH_MB, 64, 64))):
        if not os.path.isdir(place):
            continue
        point = os.path.join(stage, f"private{i}")
        script.append(f"{q(tools['mkdir'])} -p {q(point)}; {q(tools['mount'])} -t tmpfs -o mode=1777,size={size}m,nosuid,nodev "
                      f"gradekit {q(point)}")
        for source in sources:
            if under_private(source) == place:
                inside = os.path.join(point, os.path.relpath(source, place))
                script.append(f"{q(tools['mkdir'])} -p {q(inside)}; {q(tools['mount'])} --bind -o ro {q(source)} {q(inside)}")
        fresh.append((point, place))
    for source, point in rebind:
        script.append(f"{q(tools['mkdir'])} -p {q(point)}; {q(tools['mount'])} --bind {q(source)} {q(point)}")
    for cover in covers:
        script.append(f"{q(tools['mount'])} -t tmpfs -o mode=0755,size=1m,nosuid,nodev gradekit {q(cover)}")
    for source, point in rebind:
        script.append(f"{q(tools['mkdir'])} -p {q(source)}; {q(tools['mount'])} --bind -o ro {q(point)} {q(source)}")
    for point, place in sorted(fresh, key=lambda f: f[1] == "/tmp"):  # /tmp last: the stage itself lives under it
        script.append(f"{q(tools['mount'])} --move {q(point)} {place}")
    script.append(f"if [ -d /dev/mqueue ]; then {q(tools['mount'])} -t mqueue gradekit /dev/mqueue || true; fi")
    script.append(f"exec {q(tools['setpriv'])} --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all "
                  "--bounding-set=-all --no-new-privs --pdeathsig=KILL -- \"$@\"")
    namespaces = ["--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--propagation", "private", "--ipc", "--uts"]
    if not network:
        namespaces.append("--net")
    # The outer setpriv ties unshare to the grading process: when that dies, unshare dies, and with it
    # (the inner --pdeathsig) the zygote, pid 1 of the namespace, and so every process in it.
    return [tools["setpriv"], "--pdeathsig=KILL", "--", tools["unshare"], *namespaces, "--", tools["sh"], "-ec",
            "\n".join(script), "sandbox", exe, *python_args]


def _try(argv: list[str], expect: str = "2 ok") -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if done.returncode == 0 and done.stdout.strip() == expect:
        return ""
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def probe_namespaces(network: bool = False) -> str:
    """Why the namespace mode (root, no bubblewrap) cannot run here ("" when it can), tried once."""
    tools = _tools()
    key = (network, "namespaces", tuple(sorted(tools.items())) if tools else None)
    with _PROBE.lock:
        if key not in _PROBE.namespaces:
            if os.geteuid() != 0:
                why = "not root"
            elif tools is None:
                why = "util-linux unshare/setpriv (and mount, mkdir, sh) are not all on PATH"
            else:
                exe, roots = _python()
                why = _try(namespace_command(["-I", "-S", "-c", "import os; print(os.getuid() and 2, 'ok')"],
                                             sources=roots, network=network, tools=tools))
            _PROBE.namespaces[key] = why
        return _PROBE.namespaces[key]


def probe(network: bool = False) -> tuple[bool, bool, str]:
    """(bubblewrap works, runs as nobody, why not) for this process, tried once and remembered."""
    key = (network, shutil.which("bwrap"))  # PATH decides which bwrap (if any) a worker would start
    with _PROBE.lock:
        if key in _PROBE.results:
            argv, nobody, why = _PROBE.results[key]
            return argv is not None, nobody, why
        check = ["-I", "-S", "-c", "import os; print(os.getpid(), 'ok')"]
        why = ""
        result: tuple[list[str] | None, bool, str] = (None, False, "")
        if key[1] is None:
            why = "bwrap is not installed"
        else:
            attempts = []
            if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("setpriv"):
                attempts.append(True)
            attempts.append(False)
            for nobody in attempts:
                argv = command(check, packages={}, env={}, network=network, as_nobody=nobody)
                why = _try(argv, "1 ok" if _as_pid_1() else "2 ok")  # the zygote's pid there
                if not why:
                    result = (argv, nobody, "")
                    break
        _PROBE.results[key] = result if result[0] is not None else (None, False, why)
        argv, nobody, why = _PROBE.results[key]
        return argv is not None, nobody, why


def resolve(policy: Policy, *, network: bool = False, label: str = "graded code") -> Isolation:
    """The isolation a grader gets under ``policy``; warns once per process when auto falls back."""
    if policy not in POLICIES:
        raise ValueError(f"sandbox must be one of auto, strict, none; got {policy!r}")
    if policy == "none":
        return Isolation("none", network=True, not_enforced=("namespaces",) + RLIMIT_ONLY_GAPS, reason="sandbox: none")
    works, nobody, why = probe(network)
    if works:
        gaps = () if nobody or os.geteuid() != 0 else ("the process count limit (running as root; could not switch to nobody)",)
        isolation = Isolation("bubblewrap", as_nobody=nobody, network=network, not_enforced=gaps)
        if gaps and policy == "auto":
            _warn_once(f"gradekit sandbox: {label}: bubblewrap works, but {gaps[0]} is not enforced")
        return isolation
    if policy == "strict":
        raise SandboxUnavailable(f"{label}: sandbox: strict needs bubblewrap, which cannot run here ({why}); "
                                 f"install the '{PACKAGE}' package (apt-get install {PACKAGE}), or set sandbox: auto")
    if os.geteuid() == 0:
        # Root in the host's namespaces could take over the zygote and the machine: never that.
        broken = probe_namespaces(network)
        if broken:
            raise SandboxUnavailable(
                f"{label}: bubblewrap cannot run here ({why}), and running graded code as root without it is refused: "
                f"new namespaces as nobody (util-linux unshare/setpriv) failed too ({broken}); "
                f"apt-get install {PACKAGE} (the '{PACKAGE}' package), or set sandbox: none for trusted code only")
        isolation = Isolation("namespaces", as_nobody=True, network=network, not_enforced=NAMESPACE_GAPS,
                              reason=f"bubblewrap unavailable: {why}; install the '{PACKAGE}' package")
        _warn_once(f"gradekit sandbox: {label} runs with {isolation.describe()}")
        return isolation
    isolation = Isolation("rlimits", not_enforced=RLIMIT_ONLY_GAPS, reason=f"bubblewrap unavailable: {why}; install the '{PACKAGE}' package")
    _warn_once(f"gradekit sandbox: {label} runs with {isolation.describe()}")
    return isolation


def _warn_once(message: str) -> None:
    with _PROBE.lock:
        if message in _PROBE.warned:
            return
        _PROBE.warned.add(message)
    warnings.warn(message, SandboxWarning, stacklevel=3)


def zygote_source() -> str:
    return (Path(__file__).with_name("_zygote.py")).read_text(encoding="utf-8")


def zygote_argv(isolation: Isolation, *, settings: dict, packages: dict[str, str], env: dict[str, str],
                source: str | None = None) -> list[str]:
    """The command that starts one zygote (or another worker program, ``source``) under ``isolation``."""
    program = zygote_source() if source is None else source
    if isolation.kind == "bubblewrap":
        settings = {**settings, "isolated": True, "scratch": "/tmp", "wipe": ["/tmp", "/dev/shm", "/dev/mqueue"], "env": env}
        preamble = f"import sys; sys.path[:0] = {[SITE] if packages else []!r}\n"
        args = ["-I", "-S", "-c", preamble + program, json.dumps(settings)]
        return command(args, packages=packages, env={"LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"},
                       network=isolation.network, as_nobody=isolation.as_nobody)
    dirs = sorted({os.path.dirname(path) for path in packages.values()})
    preamble = f"import sys; sys.path[:0] = {dirs!r}\n"
    exe, roots = _python()
    if isolation.kind == "namespaces":
        tools = _tools()
        if tools is None:
            raise SandboxUnavailable("util-linux unshare/setpriv left PATH after the sandbox was probed")
        sources = sorted(set(roots) | set(dirs))
        settings = {**settings, "isolated": True, "scratch": "/tmp", "wipe": [*PRIVATE, "/dev/mqueue"], "env": env,
                    "keep": kept_in_private(sources)}
        args = ["-I", "-S", "-c", preamble + program, json.dumps(settings)]
        return namespace_command(args, sources=sources, network=isolation.network, tools=tools)
    settings = {**settings, "isolated": False, "env": env}
    return [exe, "-I", "-S", "-c", preamble + program, json.dumps(settings)]
