"""The worker pool: sandboxed zygotes, one per thread, that the python and code_tests graders share.

A worker is one zygote (:mod:`gradekit.graders.sandbox._zygote`) started under the isolation the policy
resolved (:mod:`gradekit.graders.sandbox._policy`). It belongs to one thread of the pool's own thread
pool, so the pool size is the number of calls that run at once; calls beyond it queue in the
executor without blocking other threads. A zygote that times out, dies or hits its memory cap
is killed with its whole sandbox and replaced on the next call.
"""

from __future__ import annotations

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
from typing import Any

from ._policy import Isolation, Policy, package_paths, resolve, zygote_argv

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


class _Timeout(Exception):
    pass


class _Died(Exception):
    pass


def json_line(value: Any) -> bytes:
    """One JSON line for a worker's pipe, UTF-8. Text a Python str may hold but UTF-8 cannot (a lone surrogate such
    as "\\ud800" in a response) goes as a JSON escape instead, so the worker reads the very str it was given and the
    caller meets no UnicodeEncodeError; every other text stays unescaped (no cost for CJK rows)."""
    try:
        return (json.dumps(value, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(value, ensure_ascii=True, default=str) + "\n").encode("ascii")


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a worker with its whole process group (its own session: grandchildren too), close its pipes, reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
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
        if "args" in message:  # a call: its header line, then its arguments (which only the call's child decodes)
            header = {key: value for key, value in message.items() if key != "args"}
            data = json_line(header) + json_line({"args": message["args"]})
        else:
            data = json_line(message)
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
        kill_group(self.proc)


def _shutdown(live: dict[int, _Worker], executor: ThreadPoolExecutor, home: tempfile.TemporaryDirectory[str]) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
    for worker in list(live.values()):
        worker.kill()
    live.clear()
    home.cleanup()

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

    timeout: float  # wall-clock seconds per call
    memory_mb: int | None  # address-space cap per call (None: none)
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

