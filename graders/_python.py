"""The python grader: a user's ``evaluate(example, response)`` (Vertex) or ``grade(sample, item)``
(OpenAI) run in sandboxed workers, each call in a fresh fork of a warm one.

Why this shape:

- **A zygote per worker, a fork per call.** Each worker is one ``python -I -S`` started once
  (inside bubblewrap when it works, see :mod:`graders._sandbox`) that loads the grader's code,
  imports included, and then forks a child for every call (:mod:`graders._zygote`). A call
  costs a fork and a pipe round trip, not an interpreter start, and nothing a sample changes
  (a patched ``json.dumps``, a global, a file, a process) reaches the next sample.
- **Limits the child cannot undo.** Address space, CPU time, process count and file size are
  rlimits set in the child before user code runs; the zygote enforces the wall-clock timeout
  and, at it, the host kills the whole sandbox (its pid namespace with it) and starts a fresh
  worker on the next call.
- **No credentials.** The child's environment is an allowlist (PATH, locale, TZ) plus what the
  caller passes explicitly; under bubblewrap the parent is not even visible in ``/proc``.
- **A result channel per call.** Only the call's own framed reply on its own pipe counts; what
  user code prints comes back as debug lines, and a write to the channel out of turn voids the
  call (``forged``) instead of shifting other samples' scores.

A worker belongs to one thread of the grader's own thread pool, so the pool size is the number
of calls that run at once; calls beyond it queue in the executor without blocking other threads.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ._sample import Grade, Sample, to_openai_item, to_openai_sample, to_vertex_content, to_vertex_example
from ._sandbox import Isolation, Policy, package_paths, resolve, zygote_argv

DEFAULT_TIMEOUT = 100.0  # Vertex: 100 s per evaluate call
DEFAULT_MEMORY_MB = 1024  # Vertex: 1 GB per invocation
DEFAULT_PROCESSES = 32  # RLIMIT_NPROC of a call: room for a subprocess or a pool, not for a fork bomb
DEFAULT_FILE_MB = 64  # RLIMIT_FSIZE: the largest file a call may write
DEFAULT_CPUS = 1  # CPUs a call may run on (affinity), as on Vertex
BACKSTOP = 5.0  # seconds the host waits past the timeout for the zygote's own answer
ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
_CHILD_ENV = {
    # One CPU per call, as on Vertex; also keeps BLAS from reserving per-core buffers under the cap.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}

Flavour = Literal["vertex", "openai"]
ENTRY = {"vertex": "evaluate", "openai": "grade"}


class _Timeout(Exception):
    pass


class _Died(Exception):
    pass


class _Worker:
    """One child process and its two pipes."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, cwd=cwd, start_new_session=True)  # own group: kill grandchildren too
        self.pid = self.proc.pid
        self._buffer = bytearray()
        self.load_error: str | None = None

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        data = (json.dumps(message, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _Died(self._how_it_died()) from e
        return json.loads(self._read_line(time.monotonic() + timeout))

    def _read_line(self, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout()
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Died(self._how_it_died())
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def _how_it_died(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "it closed its pipe"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _shutdown(live: dict[int, _Worker], executor: ThreadPoolExecutor, home: tempfile.TemporaryDirectory[str]) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
    for worker in list(live.values()):
        worker.kill()
    live.clear()
    home.cleanup()


def detect_flavour(source: str, filename: str) -> Flavour:
    """Vertex or OpenAI, read from which function the file defines (without running it)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise ValueError(f"{filename}: line {e.lineno}: {e.msg}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = [flavour for flavour, entry in ENTRY.items() if entry in defined]
    if len(found) != 1:
        which = "both evaluate() and grade()" if found else "neither evaluate(example, response) nor grade(sample, item)"
        raise ValueError(f"{filename} defines {which}; pass flavour='vertex' or 'openai' to choose")
    return found[0]  # type: ignore[return-value]


def scrubbed_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: an allowlist, never the parent's secrets."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.update(_CHILD_ENV)
    env["HOME"] = env["TMPDIR"] = home
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Limits:
    """What every call of a sandboxed worker may use."""

    timeout: float = DEFAULT_TIMEOUT
    memory_mb: int | None = DEFAULT_MEMORY_MB
    processes: int = DEFAULT_PROCESSES
    file_mb: int = DEFAULT_FILE_MB
    cpus: int = DEFAULT_CPUS

    def check(self, where: str) -> None:
        if self.timeout <= 0:
            raise ValueError(f"{where}: timeout must be positive")
        if self.memory_mb is not None and self.memory_mb < 32:
            raise ValueError(f"{where}: memory_mb={self.memory_mb} is too small to start python (use >= 32 or None)")
        if self.processes < 1 or self.file_mb < 1 or self.cpus < 1:
            raise ValueError(f"{where}: processes, file_mb and cpus must be at least 1")


class ZygotePool:
    """Sandboxed zygotes, one per thread of its own pool; the python and code_tests graders share it."""

    def __init__(self, *, name: str, limits: Limits, workers: int, env: Mapping[str, str] | None, sandbox: Policy,
                 network: bool, packages: tuple[str, ...] | list[str], load: dict[str, Any]) -> None:
        self.limits, self.workers, self.name = limits, workers, name
        self.spawned = 0  # zygotes started so far: reuse shows as spawned staying at the pool size
        self.isolation: Isolation = resolve(sandbox, network=network, label=name)
        self._packages = package_paths(tuple(packages))
        self._load = load
        self._home = tempfile.TemporaryDirectory(prefix="gradekit-python-")
        self._env = scrubbed_env(self._home.name, env)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"gradekit-python-{name}")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: dict[int, _Worker] = {}
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._live, self._executor, self._home)

    @property
    def worker_pids(self) -> list[int]:
        with self._lock:
            return list(self._live)

    async def submit(self, message: dict[str, Any], backstop: float) -> dict[str, Any]:
        """Send one request to this thread's zygote; a dead or stuck zygote becomes an error reply."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._request, message, backstop)

    def _settings(self) -> dict[str, Any]:
        limits = self.limits
        cpus = None
        if self._cpus and limits.cpus < len(self._cpus):
            start = (self.spawned * limits.cpus) % len(self._cpus)
            cpus = [self._cpus[(start + i) % len(self._cpus)] for i in range(limits.cpus)]
        return {"parent": os.getpid(), "scratch": self._home.name, "cpus": cpus,
                "limits": {"memory": (limits.memory_mb or 0) * 2**20, "processes": limits.processes,
                           "file_size": limits.file_mb * 2**20}}

    def _spawn(self) -> _Worker:
        with self._lock:
            argv = zygote_argv(self.isolation, settings=self._settings(), packages=self._packages, env=self._env)
        worker = _Worker(argv, self._env, self._home.name)
        with self._lock:
            self._live[worker.pid] = worker
            self.spawned += 1
        try:
            reply = worker.request({"op": "load", **self._load}, max(self.limits.timeout, 30.0))
        except _Timeout:
            self._discard(worker)
            worker.load_error = f"loading took longer than {max(self.limits.timeout, 30.0):g} s"
        except _Died as e:
            self._discard(worker)
            worker.load_error = f"the sandboxed worker died while starting ({e})"
        else:
            worker.load_error = reply.get("error")
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.pop(worker.pid, None)
        if getattr(self._local, "worker", None) is worker:
            self._local.worker = None

    def _request(self, message: dict[str, Any], backstop: float) -> dict[str, Any]:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None or worker.proc.poll() is not None:
            if worker is not None:
                self._discard(worker)
            worker = self._local.worker = self._spawn()
        if worker.load_error is not None:
            error = worker.load_error
            if worker.pid not in self._live:
                self._local.worker = None  # it died loading: try a fresh one next time
            return {"ok": False, "kind": "load", "error": error}
        try:
            reply = worker.request(message, backstop)
        except _Timeout:
            self._discard(worker)
            return {"ok": False, "kind": "timeout", "error": f"no answer within {backstop:g} s; the sandbox was killed"}
        except _Died as e:
            self._discard(worker)
            return {"ok": False, "kind": "crashed", "error": f"the sandboxed worker died, {e}"}
        if reply.get("kind") in ("timeout", "memory"):
            # At a timeout the whole sandbox goes, pid namespace and all; a heap that hit its cap is not trusted.
            self._discard(worker)
        reply["worker"] = worker.pid
        return reply

    def close(self) -> None:
        self.closed = True
        self._finalizer()


class PythonGrader:
    """A python grader with its own pool of sandboxed zygotes; build it with :func:`python_grader`."""

    def __init__(self, source: str, *, filename: str, flavour: Flavour, entry: str, limits: Limits, workers: int,
                 env: Mapping[str, str] | None, name: str, sandbox: Policy = "auto", network: bool = False,
                 packages: tuple[str, ...] | list[str] = ()) -> None:
        self.source, self.filename, self.flavour, self.entry = source, filename, flavour, entry
        self.limits, self.workers, self.__name__ = limits, workers, name
        self.timeout, self.memory_mb = limits.timeout, limits.memory_mb
        self.sandbox, self.network, self.packages = sandbox, network, tuple(packages)
        self._pool = ZygotePool(name=f"python grader {name!r}", limits=limits, workers=workers, env=env, sandbox=sandbox,
                                network=network, packages=packages,
                                load={"source": source, "filename": filename, "entry": entry, "timeout": limits.timeout})
        self.isolation = self._pool.isolation

    @property
    def spawned(self) -> int:
        return self._pool.spawned

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.worker_pids

    def _label(self) -> str:
        return f"python grader {self.__name__!r} ({self.filename})"

    def _arguments(self, sample: Sample) -> list[Any]:
        if self.flavour == "vertex":
            return [to_vertex_example(sample), to_vertex_content(sample.response)]
        return [to_openai_sample(sample), to_openai_item(sample)]

    async def __call__(self, sample: Sample) -> Grade:
        if self._pool.closed:
            raise RuntimeError(f"{self._label()} is closed")
        args = json.loads(json.dumps(self._arguments(sample), ensure_ascii=False, default=str))
        started = time.perf_counter()
        reply = await self._pool.submit({"op": "call", "args": args, "timeout": self.timeout}, self.timeout + BACKSTOP)
        elapsed = time.perf_counter() - started
        logs = [line for line in (reply.get("logs") or "").splitlines() if line.strip()]
        if not reply.get("ok"):
            kind = reply.get("kind") or "exception"
            error = reply.get("error")
            if kind == "crashed" and self.memory_mb:
                error = f"{error} (memory cap {self.memory_mb} MiB)"
            if kind == "timeout":
                error = f"timed out after {self.timeout:g} s; the sandbox and every process in it were killed"
            return Grade.failed("invalid", f"{self._label()}: {error}", error_kind=kind, debug=logs,
                                metrics={"python_s": elapsed})
        value = float(reply["value"])
        note = "" if -1.0 <= value <= 1.0 else f", clamped to {max(-1.0, min(1.0, value)):g}"
        debug = [f"{self.__name__}: {self.entry}() returned {value:g}{note} (worker {reply.get('worker')}, {elapsed * 1000:.1f} ms)", *logs]
        return Grade.scored(value, debug=debug, metrics={"python_s": elapsed})

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Kill every worker (and its sandbox) and remove the scratch directory."""
        self._pool.close()


def python_grader(
    source: str | None = None,
    *,
    file: str | Path | None = None,
    flavour: Flavour | None = None,
    entry: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    workers: int | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    sandbox: Policy = "auto",
    network: bool = False,
    packages: tuple[str, ...] | list[str] = (),
    processes: int = DEFAULT_PROCESSES,
    file_mb: int = DEFAULT_FILE_MB,
    cpus: int = DEFAULT_CPUS,
) -> PythonGrader:
    """A grader that runs user python in a sandbox, each call forked from a warm, reused worker.

    Args:
        source: the code (Vertex's ``pythonCodeSnippet``, OpenAI's ``source``); or give ``file``.
        file: a ``.py`` file defining ``evaluate(example, response)`` or ``grade(sample, item)``.
        flavour: "vertex" (``evaluate`` gets a ReinforcementTuningExample and a Content) or
            "openai" (``grade`` gets OpenAI's sample and item); read from the code when omitted.
        entry: the function name, if not the flavour's default.
        timeout: wall-clock seconds per call; the call's sandbox is killed and replaced after it.
        memory_mb: the address-space cap of each call (None: no cap).
        workers: zygotes in the pool (default: up to 4, one per CPU).
        env: variables to give the child on top of the allowlist (PATH, locale, TZ).
        name: the grader's name in grades and errors.
        sandbox: "auto" (bubblewrap when it works, else rlimits only, with a warning),
            "strict" (bubblewrap or :class:`~graders._sandbox.SandboxUnavailable`), "none".
        network: give the code the network (bubblewrap shares the host's network namespace).
        packages: top-level packages the code may import beyond the standard library.
        processes: RLIMIT_NPROC of each call; file_mb: RLIMIT_FSIZE; cpus: CPUs per call.

    A raised exception, a timeout, a crash or a non-number is an ``invalid`` Grade naming the
    reason; a number is clamped to [-1, 1].
    """
    if (source is None) == (file is None):
        raise ValueError("python_grader needs exactly one of source= or file=")
    if file is not None:
        path = Path(file)
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"python grader file {path}: {e.strerror or e}") from e
        filename = str(path)
    else:
        filename = f"<{name or 'python grader'}>"
    assert source is not None
    if flavour is None:
        flavour = detect_flavour(source, filename)
    elif flavour not in ENTRY:
        raise ValueError(f"{filename}: flavour must be 'vertex' or 'openai', not {flavour!r}")
    else:
        try:
            ast.parse(source, filename)
        except SyntaxError as e:
            raise ValueError(f"{filename}: line {e.lineno}: {e.msg}") from None
    limits = Limits(timeout=timeout, memory_mb=memory_mb, processes=processes, file_mb=file_mb, cpus=cpus)
    limits.check(filename)
    count = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    if count < 1:
        raise ValueError(f"{filename}: workers must be at least 1")
    return PythonGrader(source, filename=filename, flavour=flavour, entry=entry or ENTRY[flavour], limits=limits, workers=count,
                        env=env, name=name or (Path(file).stem if file else "python"), sandbox=sandbox, network=network,
                        packages=packages)
