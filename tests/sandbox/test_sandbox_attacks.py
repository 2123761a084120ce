"""Graded code is hostile: every attack of issue 12, as a sample the grader executes.

The grader under attack runs the response as code (``exec``), the way a code reward does, and
returns the ``result`` the code leaves (0.0 unless it sets one). Each attack is a sample that
tries to raise a reward, read a secret or escape; each must end ``invalid`` or scored by its own
returned value, and the sample after it must get exactly its own value.

Two modes: ``bubblewrap`` (the sandbox; CI installs it, so there it must run) and ``no_bwrap``
(``sandbox: auto`` on a machine without bubblewrap, made here by a PATH without ``bwrap``). As
root (CI, the usual container) no_bwrap is the ``namespaces`` isolation (nobody, new pid, net,
ipc, uts and mount namespaces through util-linux); not root it is ``rlimits`` only. The
fixture ``mode`` is the isolation kind the grader must report. Attacks that only the stronger
modes stop are skipped in the weaker ones with the reason; docs/sandbox.md's table says the
same. Attacks that would send real traffic or a real fork bomb unconfined are never run
unconfined.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gradekit.graders import Grade, PythonGrader, Sample, python_grader
from gradekit.graders.sandbox import SandboxWarning, probe

ROOT = Path(__file__).resolve().parents[2]
EXEC_GRADER = """
def evaluate(example, response):
    ns = {"result": 0.0}
    exec(response["parts"][0]["text"], ns)
    return ns["result"]
"""
HAVE_BWRAP = shutil.which("bwrap") is not None and probe()[0]
SECRET = "sk-gradekit-attack-" + uuid.uuid4().hex


def sample(code: str) -> Sample:
    return Sample(messages="run this", response=textwrap.dedent(code), references={"answer": "x"})


def own_value_or_invalid(grade: Grade, own: float = 0.0) -> bool:
    return grade.status == "invalid" or (grade.status == "ok" and grade.score == own)


@pytest.fixture(params=["bubblewrap", "no_bwrap"])
def mode(request, monkeypatch: pytest.MonkeyPatch, path_without_bwrap: str) -> str:
    if request.param == "bubblewrap" and not HAVE_BWRAP:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap is missing or does not work; .ci/run installs the 'bubblewrap' package")
        pytest.skip("bubblewrap is not installed here")
    if request.param == "bubblewrap":
        return "bubblewrap"
    monkeypatch.setenv("PATH", path_without_bwrap)  # sandbox: auto finds no bwrap and falls back
    return "namespaces" if os.geteuid() == 0 else "rlimits"


@pytest.fixture
async def attacked(mode: str) -> AsyncIterator[Callable[..., PythonGrader]]:
    made: list[PythonGrader] = []

    def build(**kwargs) -> PythonGrader:
        kwargs.setdefault("workers", 1)
        kwargs.setdefault("timeout", 10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SandboxWarning)
            grader = python_grader(EXEC_GRADER, **kwargs)
        assert grader.isolation.kind == mode
        made.append(grader)
        return grader

    yield build
    for grader in made:
        grader.close()


def only_bubblewrap(mode: str, why: str) -> None:
    if mode != "bubblewrap":
        pytest.skip(f"the {mode} variant, skipped by design: {why} is enforced by bubblewrap only")


def only_isolated(mode: str, why: str) -> None:
    """Enforced by bubblewrap and by the namespaces mode (root without bubblewrap), not by rlimits."""
    if mode == "rlimits":
        pytest.skip(f"the rlimits variant (not root, no bubblewrap), skipped by design: {why} is not enforced there")


async def next_sample_gets_its_own_value(grader: PythonGrader) -> None:
    follow = await grader(sample("result = 0.25"))
    assert follow.status == "ok" and follow.score == 0.25, follow


# ---- the result channel and state across samples ----------------------------------------------


async def test_forge_own_score_through_a_side_channel(attacked) -> None:
    grader = attacked()
    grade = await grader(sample("""
        import os
        line = b'{"ok": true, "value": 1.0, "logs": ""}\\n'
        for fd in range(1, 1100):
            try:
                os.write(fd, line)
            except OSError:
                pass
    """))
    assert own_value_or_invalid(grade), grade
    assert grade.status == "invalid" and grade.error_kind == "forged", "a write on the result channel voids the call"
    await next_sample_gets_its_own_value(grader)


async def test_forge_by_ending_the_call_early_with_a_made_up_reply(attacked) -> None:
    grader = attacked()
    grade = await grader(sample("""
        import os
        for fd in range(3, 1100):
            try:
                os.write(fd, b'0123456789abcdef0123456789abcdef\\n{"ok": true, "value": 1.0}\\n')
            except OSError:
                pass
        os._exit(0)
    """))
    assert grade.status == "invalid", grade
    await next_sample_gets_its_own_value(grader)


async def test_write_to_the_result_channel_after_the_frame(attacked) -> None:
    """The verdict is given as soon as the harness's frame is whole, before the call's processes
    are reaped: a grandchild that holds the result fd and keeps writing to it, before and after
    the frame, voids this call at most and reaches no later call."""
    grader = attacked()
    for _ in range(3):
        grade = await grader(sample("""
            import os
            if os.fork() == 0:
                line = b'0123456789abcdef0123456789abcdef\\n{"ok": true, "value": 1.0}\\n'
                while True:
                    for fd in range(3, 1100):
                        try:
                            os.write(fd, line)
                        except OSError:
                            pass
            result = -0.5
        """))
        assert own_value_or_invalid(grade, -0.5), grade
        await next_sample_gets_its_own_value(grader)


@pytest.mark.parametrize("planted", ['["ok", 1.0]', '{"ok": true, "value": "1.0"}', '{"ok": true, "value": 1.0, "logs": []}'],
                         ids=["not_an_object", "value_a_string", "logs_a_list"])
async def test_a_planted_frame_with_the_real_nonce_but_a_bad_reply(attacked, planted: str) -> None:
    """The nonce is in the harness's frame locals, so a sample can find it and write a whole
    frame of its own: it may set its own reward that way, but a reply of another shape is void
    (``forged``), never an error in the grading process."""
    grader = attacked()
    grade = await grader(sample(f"""
        import os, sys
        frame = sys._getframe()
        while frame is not None and "nonce" not in frame.f_locals:
            frame = frame.f_back
        os.write(1000, (frame.f_locals["nonce"] + "\\n" + {planted!r} + "\\n").encode())
        os._exit(0)
    """))
    assert grade.status == "invalid" and grade.error_kind == "forged", grade
    await next_sample_gets_its_own_value(grader)


async def test_change_a_later_samples_score(attacked) -> None:
    grader = attacked()
    grade = await grader(sample("""
        import json, builtins, math
        json.dumps = lambda *a, **k: '{"ok": true, "value": 1.0}'
        json.loads = lambda *a, **k: {"ok": True, "value": 1.0}
        builtins.float = lambda *a: 1.0
        math.isfinite = lambda x: True
        import sys
        sys.modules["__main__"].__dict__["Zygote"] = None
    """))
    assert own_value_or_invalid(grade), grade
    for _ in range(3):
        await next_sample_gets_its_own_value(grader)


async def test_files_and_ipc_do_not_cross_samples(attacked, mode: str) -> None:
    """The call's own temp dir goes in every mode; with private mounts (bubblewrap, namespaces)
    every writable place and System V IPC go too (under rlimits, /tmp is the host's and not ours to empty)."""
    grader = attacked()
    everywhere = mode != "rlimits"
    await grader(sample(f"""
        import ctypes, os
        open(os.path.join(os.environ["HOME"], "planted"), "w").write("1")
        if {everywhere!r}:
            open("/tmp/planted", "w").write("1")
            open("/dev/shm/planted", "w").write("1")
            ctypes.CDLL(None).shmget(0x5eed, 4096, 0o1666)  # IPC_CREAT | 0666
    """))
    grade = await grader(sample(f"""
        import glob, os
        found = glob.glob(os.path.join(os.environ["HOME"], "..", "*", "planted"))
        if {everywhere!r}:
            found += glob.glob("/tmp/planted") + glob.glob("/dev/shm/planted") + open("/proc/sysvipc/shm").read().splitlines()[1:]
        print("found", found)
        result = 1.0 if found else 0.0
    """))
    assert grade.score == 0.0, grade


# ---- secrets -----------------------------------------------------------------------------------

LEAK_PROBE = """
import os, glob
secret = %r
found = secret in str(dict(os.environ))
for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline") + ["/proc/%%d/environ" %% os.getppid()]:
    try:
        found = found or secret.encode() in open(path, "rb").read()
    except OSError:
        pass
result = 1.0 if found else 0.0
""" % SECRET


def test_read_the_api_key_from_env_parent_proc_and_command_line(mode: str, tmp_path: Path) -> None:
    """A real grading process started with the key in its environment and ``--api-key`` in its argv."""
    script = tmp_path / "grade_one.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, json, sys, warnings
        warnings.simplefilter("ignore")
        from gradekit.graders._python import python_grader
        from gradekit.graders._sample import Sample
        async def main():
            grader = python_grader({EXEC_GRADER!r}, workers=1, timeout=10)
            grade = await grader(Sample(messages="q", response={LEAK_PROBE!r}))
            grader.close()
            print(json.dumps({{"kind": grader.isolation.kind, "score": grade.score, "status": grade.status}}))
        asyncio.run(main())
    """))
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), "--api-key", SECRET], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kind"] == mode
    if mode == "rlimits":
        # The environment is still scrubbed, but the host's /proc shows the parent's command line.
        assert result["status"] == "ok"
        return
    assert result == {"kind": mode, "score": 0.0, "status": "ok"}, result


async def test_the_environment_itself_is_clean_in_both_modes(attacked, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    grader = attacked()
    grade = await grader(sample(f"""
        import os
        result = 1.0 if {SECRET!r} in str(dict(os.environ)) or "OPENAI_API_KEY" in os.environ else 0.0
        try:
            result = 1.0 if {SECRET!r}.encode() in open("/proc/self/environ", "rb").read() else result
        except OSError:
            pass
    """))
    assert grade.score == 0.0, grade


# ---- the filesystem ------------------------------------------------------------------------------


async def test_read_files_outside_the_sandbox(attacked, mode: str, tmp_path: Path) -> None:
    only_bubblewrap(mode, "filesystem isolation")
    grader = attacked()
    in_home = Path.home() / f".gradekit-attack-{uuid.uuid4().hex}"  # a file in the home folder, removed below
    in_tmp = tmp_path / "secret.txt"
    targets = ["/etc/passwd", "/etc/shadow", str(in_home), str(in_tmp), str(ROOT / "pyproject.toml"), str(Path(__file__))]
    try:
        in_home.write_text(SECRET)
        in_tmp.write_text(SECRET)
        grade = await grader(sample(f"""
            import os
            readable = []
            for path in {targets!r}:
                try:
                    open(path, "rb").read(1)
                    readable.append(path)
                except OSError:
                    pass
            print("readable", readable)
            result = 1.0 if readable else 0.0
        """))
    finally:
        in_home.unlink(missing_ok=True)
    assert grade.score == 0.0, grade.debug


async def test_write_outside_the_temp_dir(attacked, mode: str, tmp_path: Path) -> None:
    only_isolated(mode, "filesystem isolation")
    grader = attacked()
    outside = [tmp_path / "escaped", ROOT / f"escaped-{uuid.uuid4().hex}", Path("/tmp") / f"escaped-{uuid.uuid4().hex}"]
    grade = await grader(sample(f"""
        import os
        wrote = []
        for path in {[str(p) for p in outside]!r} + ["/usr/escaped", "/escaped", os.__file__]:
            try:
                with open(path, "a") as f:
                    f.write("x")
                wrote.append(path)
            except OSError:
                pass
        print("wrote", wrote)
    """))
    assert own_value_or_invalid(grade), grade
    for path in outside:
        assert not path.exists(), f"{path} was written from inside the sandbox"


# ---- the network -------------------------------------------------------------------------------


class _Listener:
    """A real TCP server on the host's loopback that counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


async def test_connect_to_loopback_and_to_an_outside_address(attacked, mode: str) -> None:
    only_isolated(mode, "network isolation (and this attack would send real traffic)")
    listener = _Listener()
    try:
        grader = attacked()
        grade = await grader(sample(f"""
            import socket
            reached = []
            # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed, and the sandbox has no route anyway.
            for host, port in (("127.0.0.1", {listener.port}), ("192.0.2.1", 80), ("localhost", {listener.port})):
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect((host, port))
                    reached.append(host)
                except OSError as e:
                    print(host, e)
                finally:
                    s.close()
            result = 1.0 if reached else 0.0
        """))
        assert grade.score == 0.0, grade.debug
        assert listener.accepted == 0
    finally:
        listener.close()


async def test_network_true_shares_the_hosts_network(mode: str) -> None:
    only_isolated(mode, "network isolation")
    listener = _Listener()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        grader = python_grader(EXEC_GRADER, workers=1, timeout=10, network=True)
    try:
        grade = await grader(sample(f"""
            import socket
            socket.create_connection(("127.0.0.1", {listener.port}), timeout=5).close()
            result = 1.0
        """))
        assert grade.score == 1.0, grade
    finally:
        grader.close()
        listener.close()
    assert listener.accepted == 1


# ---- processes -----------------------------------------------------------------------------------


def host_processes_named(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == tag:
                    found.append(int(entry))
            except OSError:
                pass
    return found


async def test_a_subprocess_that_outlives_the_call(attacked, mode: str) -> None:
    only_isolated(mode, "killing processes that leave the call's session")
    tag = "gk" + uuid.uuid4().hex[:10]
    grader = attacked()
    grade = await grader(sample(f"""
        import ctypes, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(15, {tag.encode()!r}, 0, 0, 0)  # PR_SET_NAME
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
    """))
    assert own_value_or_invalid(grade), grade
    later = await grader(sample(f"""
        import glob
        names = []
        for path in glob.glob("/proc/[0-9]*/comm"):
            try:
                names.append(open(path).read().strip())
            except OSError:
                pass
        result = 1.0 if {tag!r} in names else 0.0
    """))
    assert later.score == 0.0, "the daemon of the earlier call is gone before the next call"
    assert host_processes_named(tag) == []
    grader.close()
    assert host_processes_named(tag) == []


async def test_fork_bomb(attacked, mode: str) -> None:
    isolation = probe()
    only_isolated(mode, "the process count limit (uid 0 ignores RLIMIT_NPROC); not run unconfined")
    if mode == "bubblewrap" and os.geteuid() == 0 and not isolation[1]:
        pytest.skip("root could not switch to nobody here: RLIMIT_NPROC would not hold")
    grader = attacked(processes=16)
    grade = await grader(sample("""
        import os, time
        started = 0
        for _ in range(300):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            started += 1
        print("started", started)
        result = 1.0 if started >= 16 else 0.0
    """))
    assert grade.score == 0.0, grade.debug
    await next_sample_gets_its_own_value(grader)


async def test_threads_run_on_one_cpu(attacked) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU here")
    grade = await attacked()(sample("""
        import os, threading
        cpus = os.sched_getaffinity(0)
        threads = [threading.Thread(target=sum, args=(range(10**5),)) for _ in range(64)]
        for t in threads: t.start()
        for t in threads: t.join()
        result = 0.0 if len(cpus) == 1 else 1.0
    """))
    assert grade.score == 0.0, grade


# ---- resources -----------------------------------------------------------------------------------


async def test_exhaust_memory(attacked) -> None:
    grader = attacked(memory_mb=200)
    grade = await grader(sample("""
        blocks = []
        while True:
            blocks.append(bytearray(16 * 2**20))
    """))
    assert grade.status == "invalid" and grade.error_kind in ("memory", "crashed"), grade
    await next_sample_gets_its_own_value(grader)


async def test_spin_forever(attacked) -> None:
    grader = attacked(timeout=1.5)
    grade = await grader(sample("while True:\n    pass\n"))
    assert grade.status == "invalid" and grade.error_kind == "timeout", grade
    await next_sample_gets_its_own_value(grader)


async def test_print_gigabytes_and_fill_the_disk(attacked) -> None:
    grader = attacked(timeout=60, file_mb=8)
    grade = await grader(sample("""
        import os, sys
        block = "x" * (1 << 20)
        for _ in range(256):
            print(block)
        os.write(1, b"y" * (64 << 20))
        wrote = 0
        try:
            with open("big", "wb") as f:
                for _ in range(64):
                    f.write(b"z" * (1 << 20))
                    f.flush()
                    wrote += 1
        except OSError as e:
            print("stopped at", wrote, "MiB:", e)
        result = 0.0
    """))
    assert grade.score == 0.0, grade
    assert sum(len(line) for line in grade.debug) < 10_000, "what a sample prints is kept bounded"
    assert any("stopped at 8 MiB" in line for line in grade.debug), grade.debug


def test_killing_the_grading_process_mid_call_leaves_nothing_behind(mode: str, tmp_path: Path) -> None:
    """SIGKILL the process that grades while a call (and a detached grandchild) runs: the sandbox goes with it."""
    tag = "gk" + uuid.uuid4().hex[:10]
    started = tmp_path / "started"
    script = tmp_path / "grade_forever.py"
    code = textwrap.dedent(f"""
        import ctypes, os, time
        ctypes.CDLL(None).prctl(15, {tag.encode()!r}, 0, 0, 0)
        if os.fork() == 0:
            os.setsid()
            time.sleep(120)
            os._exit(0)
        time.sleep(120)
    """)
    script.write_text(textwrap.dedent(f"""
        import asyncio, warnings
        warnings.simplefilter("ignore")
        from gradekit.graders._python import python_grader
        from gradekit.graders._sample import Sample
        async def main():
            grader = python_grader({EXEC_GRADER!r}, workers=1, timeout=300)
            await grader(Sample(messages="q", response="result = 0.5"))
            open({str(started)!r}, "w").close()
            await grader(Sample(messages="q", response={code!r}))
        asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        for _ in range(600):  # wait (up to a minute on a busy machine) for the tagged processes to exist
            if (started.exists() and len(host_processes_named(tag)) >= 2) or proc.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert len(host_processes_named(tag)) >= 2, "the call and its grandchild are running"
    finally:
        proc.kill()
        proc.wait()
    # Without bubblewrap the grandchild that left its session is expected to survive (README); the call must not.
    allowed = 1 if mode == "rlimits" else 0
    for _ in range(300):  # death by PDEATHSIG / the pid namespace is asynchronous: wait for it, up to 30 s
        if len(host_processes_named(tag)) <= allowed:
            break
        threading.Event().wait(0.1)
    survivors = host_processes_named(tag)
    for pid in survivors:
        os.kill(pid, 9)
    assert len(survivors) <= allowed, survivors
    if survivors:
        pytest.skip("not enforced without bubblewrap: a grandchild that left the call's session survives")


# ---- issue 21: root without bubblewrap, and what a call inherits ---------------------------------


async def honest_samples_get_their_own(grader: PythonGrader, count: int = 2) -> None:
    """After an attack, honest samples that return -1.0 score exactly -1.0 (never a forged 1.0)."""
    for _ in range(count):
        honest = await grader(sample("result = -1.0"))
        assert honest.status == "ok" and honest.score == -1.0, honest


async def test_forge_later_replies_through_the_zygotes_proc_fd(attacked) -> None:
    """A root sample could open the zygote's pipes through /proc/<zygote>/fd and write replies the
    host would take for the next samples'. The zygote must be out of its reach in every mode."""
    grader = attacked()
    grade = await grader(sample("""
        import os
        zygote = os.getppid()
        line = b'{"ok": true, "value": 1.0, "logs": ""}\\n'
        wrote = []
        try:
            fds = os.listdir(f"/proc/{zygote}/fd")
        except OSError as e:
            fds = []
            print("no fd listing:", e)
        for fd in fds:
            path = f"/proc/{zygote}/fd/{fd}"
            try:
                if os.readlink(path).startswith("pipe:"):
                    w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(w, line * 3)
                    os.close(w)
                    wrote.append(fd)
            except OSError:
                pass
        print("wrote to the zygote's fds", wrote)
        result = -1.0
    """))
    assert own_value_or_invalid(grade, -1.0), grade
    await honest_samples_get_their_own(grader)


async def test_kill_every_process(attacked, mode: str) -> None:
    """``kill -9 -1`` from a call reaches only its own pid namespace: a host process of the same
    user survives, the next sample gets its own value, and the zygote survives too: it is pid 1 of
    its namespace (bubblewrap's --as-pid-1, or unshare), which no process inside can signal."""
    only_isolated(mode, "a pid namespace (kill(-1) would reach every process of the user)")
    victim_argv = ["sleep", "120"]
    if os.geteuid() == 0:  # a host process of the sandbox's own user: the one kill(-1) could reach
        victim_argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *victim_argv]
    victim = subprocess.Popen(victim_argv)
    try:
        grader = attacked()
        await grader(sample("result = 0.0"))
        before = grader.worker_pids
        host_ns = os.readlink("/proc/self/ns/pid")
        grade = await grader(sample(f"""
            import os, signal
            if os.readlink("/proc/self/ns/pid") == {host_ns!r}:
                result = 1.0  # the host's pid namespace: kill(-1) would take the machine down, so it is not sent
            else:
                os.kill(-1, signal.SIGKILL)
                result = -0.5
        """))
        assert own_value_or_invalid(grade, -0.5), grade
        await next_sample_gets_its_own_value(grader)
        assert grader.worker_pids == before, "the zygote (pid 1 of its namespace) survives its call's kill(-1)"
        assert victim.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        victim.kill()
        victim.wait()


async def test_ptrace_attach_the_zygote(attacked) -> None:
    grader = attacked()
    grade = await grader(sample("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        zygote = os.getppid()
        attached = libc.ptrace(16, zygote, None, None) == 0  # PTRACE_ATTACH
        print("attach", attached, "errno", ctypes.get_errno())
        if attached:
            os.waitpid(zygote, 0x40000000)  # __WALL: the stop of the attach
            libc.ptrace(17, zygote, None, None)  # PTRACE_DETACH
        result = 1.0 if attached else 0.0
    """))
    assert grade.status == "ok" and grade.score == 0.0, grade
    await next_sample_gets_its_own_value(grader)


async def test_connect_to_a_host_abstract_unix_socket(attacked, mode: str) -> None:
    only_isolated(mode, "a network namespace (abstract unix sockets belong to it)")
    name = "\0gradekit-attack-" + uuid.uuid4().hex
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen(4)
    server.setblocking(False)
    try:
        grader = attacked()
        grade = await grader(sample(f"""
            import socket
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect({name!r})
                result = 1.0
            except OSError as e:
                print("refused:", e)
                result = 0.0
        """))
        assert grade.score == 0.0, grade.debug
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


async def test_read_an_earlier_samples_files_from_another_worker(attacked, mode: str) -> None:
    """Files one sample leaves in /tmp, /var/tmp, /dev/shm or beside its HOME are not there for a
    later sample, on the same worker or on another grader's."""
    only_isolated(mode, "private /tmp, /var/tmp and /dev/shm")
    tag = "gk-planted-" + uuid.uuid4().hex
    places = ["/tmp", "/var/tmp", "/dev/shm"]
    writer, reader = attacked(), attacked()
    try:
        await writer(sample(f"""
            import os
            for folder in {places!r} + [os.environ["HOME"], os.path.dirname(os.environ["HOME"])]:
                try:
                    open(os.path.join(folder, {tag!r}), "w").write("secret")
                except OSError as e:
                    print(folder, e)
        """))
        look = f"""
            import glob, os
            found = []
            for folder in {places!r} + [os.environ["HOME"], os.path.dirname(os.environ["HOME"])]:
                found += glob.glob(os.path.join(folder, "**", {tag!r}), recursive=True)
            print("found", found)
            result = 1.0 if found else 0.0
        """
        for grader in (reader, writer):
            grade = await grader(sample(look))
            assert grade.status == "ok" and grade.score == 0.0, grade.debug
    finally:
        for folder in places:  # what an unconfined run (the old behaviour) would have left on the host
            Path(folder, tag).unlink(missing_ok=True)


MEMORY_SCAN = r"""
import gc, re, sys
pattern = re.compile(%r)
found, seen = set(), set()
def look(value, depth=0):
    if isinstance(value, str):
        found.update(pattern.findall(value))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        found.update(m.decode() for m in re.findall(pattern.pattern.encode(), bytes(value)))
    elif depth < 8 and id(value) not in seen and isinstance(value, (dict, list, tuple, set, frozenset)):
        seen.add(id(value))  # dicts of plain values are not tracked by the collector: walk into containers
        for item in (list(value.keys()) + list(value.values()) if isinstance(value, dict) else list(value)):
            look(item, depth + 1)
for obj in gc.get_objects():
    look(obj)
    if hasattr(obj, "__dict__") and isinstance(getattr(obj, "__dict__", None), dict):
        look(obj.__dict__)
frame = sys._getframe()
while frame is not None:
    look(dict(frame.f_locals))
    frame = frame.f_back
"""


async def test_a_call_finds_no_earlier_samples_request_in_its_memory(attacked) -> None:
    """The zygote holds no sample's data when it forks the next call: a sample that scans what it
    inherits (every object the collector knows, every frame up its stack) finds no earlier
    sample's arguments, in every mode."""
    grader = attacked()
    marker = "gk-mem-" + uuid.uuid4().hex
    first = await grader(sample(f"secret = {marker!r}\nresult = 0.0\n"))
    assert first.score == 0.0, first
    scan = MEMORY_SCAN % r"gk-mem-[0-9a-f]{32}" + "\nprint('found', sorted(found))\nresult = 1.0 if found else 0.0\n"
    for _ in range(2):  # the worker that served the first sample, forked ahead and forked on demand
        grade = await grader(sample(scan))
        assert grade.status == "ok" and grade.score == 0.0, grade.debug


async def test_a_code_tests_program_finds_no_expected_output_in_its_memory(mode: str) -> None:
    """An honest program's output (the expected output of the problem) stays with its own sample: a
    later program for the same problem that prints whatever looks like an answer in its inherited
    memory fails."""
    from gradekit.graders import code_tests_grader

    answer = "gk-out-" + uuid.uuid4().hex
    cases = [{"input": "", "output": answer + "\n"}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        grader = code_tests_grader(workers=1, timeout=10)
    try:
        assert grader.isolation.kind == mode
        honest = await grader(Sample(messages="q", response=f"print({answer!r})", references={"tests": cases}))
        assert honest.score == 1.0, honest.debug
        thief = MEMORY_SCAN % r"gk-out-[0-9a-f]{32}" + "\nprint(sorted(found)[0] if found else 'nothing')\n"
        for _ in range(2):
            grade = await grader(Sample(messages="q", response=thief, references={"tests": cases}))
            assert grade.score == -1.0, grade.debug
    finally:
        grader.close()


async def test_through_the_reward_server_no_request_finds_another_in_memory(attacked, serve) -> None:
    """The same through the reward server (``gradekit serve``'s app), with two workers: after one
    request, none of the next four (on either worker) finds its arguments."""
    import httpx

    url = serve(attacked(workers=2))
    marker = "gk-mem-" + uuid.uuid4().hex
    scan = MEMORY_SCAN % r"gk-mem-[0-9a-f]{32}" + "\nprint('found', sorted(found))\nresult = 1.0 if found else 0.0\n"
    async with httpx.AsyncClient(timeout=60) as client:
        first = (await client.post(f"{url}/compute_reward", json={"prompt": "q", "response": f"secret = {marker!r}\nresult = 0.5\n"})).json()
        assert first["score"] == 0.5, first
        for _ in range(4):
            body = (await client.post(f"{url}/compute_reward", json={"prompt": "q", "response": scan})).json()
            assert body["status"] == "success" and body["score"] == 0.0, body
