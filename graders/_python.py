"""The python grader: a user's ``evaluate(example, response)`` (Vertex) or ``grade(sample, item)``
(OpenAI) run in separate, reusable worker processes.

Why this shape:

- **A process per worker, not per call.** Each worker is a bare ``python -I`` started once and
  fed JSON lines over pipes, so a cheap function costs a pipe round trip, not an interpreter
  start. The child runs :func:`_child_main`, which imports only the standard library: it does
  not import gradekit (or openai, pandas ...), which keeps its start fast and its memory small.
- **Limits the child cannot undo.** The memory cap is ``RLIMIT_AS``, set by the child on itself
  before any user code runs; the wall-clock timeout is enforced by the parent, which kills the
  worker's whole process group and starts a fresh worker on the next call.
- **No credentials.** The child's environment is built from an allowlist (PATH, locale, TZ) plus
  what the caller passes explicitly: ``OPENAI_API_KEY`` and the like are never inherited, not
  even in ``/proc/self/environ``.
- **Nothing the user code prints can corrupt the protocol.** The child answers on a private
  duplicate of its stdout and points fd 1 elsewhere; ``print`` output comes back as debug lines.

A worker belongs to one thread of the grader's own thread pool, so the pool size is the number
of calls that run at once; calls beyond it queue in the executor without blocking other threads.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from ._sample import Grade, Sample, to_openai_item, to_openai_sample, to_vertex_content, to_vertex_example

DEFAULT_TIMEOUT = 100.0  # Vertex: 100 s per evaluate call
DEFAULT_MEMORY_MB = 1024  # Vertex: 1 GB per invocation
ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
_CHILD_ENV = {
    # One CPU per call, as on Vertex; also keeps BLAS from reserving per-core buffers under the cap.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}
_MAX_LOG_CHARS = 4000

Flavour = Literal["vertex", "openai"]
ENTRY = {"vertex": "evaluate", "openai": "grade"}


def _child_main() -> None:
    """The worker loop. Runs in the child from its source text: standard library only."""
    import asyncio as _asyncio
    import contextlib
    import io
    import json as _json
    import math
    import numbers
    import os as _os
    import resource
    import sys as _sys
    import traceback

    cap, parent = int(_sys.argv[1]), int(_sys.argv[2])
    try:  # Linux: die with the parent thread instead of lingering as an orphan
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:
        pass
    if _os.getppid() != parent:
        _os._exit(0)
    if cap > 0:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    reply_to = _os.fdopen(_os.dup(1), "w", encoding="utf-8")
    _os.dup2(2, 1)  # anything written to fd 1 from now on goes to stderr, never into the protocol
    requests = _sys.stdin.buffer

    def send(obj: dict) -> None:
        reply_to.write(_json.dumps(obj) + "\n")
        reply_to.flush()

    def describe(exc: BaseException, filename: str) -> str:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        where = f" (line {frames[-1].lineno}, in {frames[-1].name})" if frames else ""
        text = str(exc)
        return f"{type(exc).__name__}{': ' + text if text else ''}{where}"

    fn = None
    filename = "<grader>"
    load_error = None
    while True:
        line = requests.readline()
        if not line:
            return
        msg = _json.loads(line)
        logs = io.StringIO()
        reply: dict = {}
        out_of_memory = False
        try:
            with contextlib.redirect_stdout(logs), contextlib.redirect_stderr(logs):
                if msg["op"] == "load":
                    filename = msg["filename"]
                    namespace = {"__name__": "__gradekit_grader__", "__file__": filename}
                    try:
                        exec(compile(msg["source"], filename, "exec"), namespace)
                        fn = namespace.get(msg["entry"])
                        if not callable(fn):
                            load_error = f"{filename} defines no function {msg['entry']!r}"
                    except BaseException as e:  # noqa: BLE001 - user code may raise anything, SystemExit included
                        load_error = f"loading {filename} failed: {describe(e, filename)}"
                    reply = {"ok": load_error is None, "error": load_error, "pid": _os.getpid()}
                elif load_error is not None:
                    reply = {"ok": False, "kind": "load", "error": load_error}
                else:
                    assert fn is not None
                    value = fn(*msg["args"])
                    if _asyncio.iscoroutine(value):
                        value = _asyncio.run(value)
                    if isinstance(value, bool) or not isinstance(value, numbers.Real):
                        shown = repr(value)
                        reply = {"ok": False, "kind": "not_a_number",
                                 "error": f"returned {type(value).__name__} {shown[:80]}{'...' if len(shown) > 80 else ''}, not a number"}
                    elif not math.isfinite(float(value)):
                        reply = {"ok": False, "kind": "not_a_number", "error": f"returned {float(value)}, not a finite number"}
                    else:
                        reply = {"ok": True, "value": float(value)}
        except MemoryError:
            out_of_memory = True  # build the reply after the except block, once the hog's frames are freed
        except BaseException as e:  # noqa: BLE001
            reply = {"ok": False, "kind": "exception", "error": describe(e, filename)}
        if out_of_memory:
            reply = {"ok": False, "kind": "memory", "error": f"MemoryError: the grader exceeded its memory cap of {cap // 2**20} MiB"}
        reply["logs"] = logs.getvalue()[-4000:]
        send(reply)
        if out_of_memory:
            return  # a fresh worker is cheaper than trusting a heap that just hit its cap


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


class PythonGrader:
    """A python grader with its own pool of worker processes; build it with :func:`python_grader`."""

    def __init__(self, source: str, *, filename: str, flavour: Flavour, entry: str, timeout: float,
                 memory_mb: int | None, workers: int, env: Mapping[str, str] | None, name: str) -> None:
        self.source, self.filename, self.flavour, self.entry = source, filename, flavour, entry
        self.timeout, self.memory_mb, self.workers, self.__name__ = timeout, memory_mb, workers, name
        self.spawned = 0  # processes started so far: reuse shows as spawned staying at the pool size
        self._home = tempfile.TemporaryDirectory(prefix="gradekit-python-")
        self._env = scrubbed_env(self._home.name, env)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"gradekit-python-{name}")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: dict[int, _Worker] = {}
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._live, self._executor, self._home)

    @property
    def worker_pids(self) -> list[int]:
        with self._lock:
            return list(self._live)

    def _label(self) -> str:
        return f"python grader {self.__name__!r} ({self.filename})"

    def _arguments(self, sample: Sample) -> list[Any]:
        if self.flavour == "vertex":
            return [to_vertex_example(sample), to_vertex_content(sample.response)]
        return [to_openai_sample(sample), to_openai_item(sample)]

    async def __call__(self, sample: Sample) -> Grade:
        if self._closed:
            raise RuntimeError(f"{self._label()} is closed")
        args = self._arguments(sample)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._grade_blocking, args)

    def _spawn(self) -> _Worker:
        cap = (self.memory_mb or 0) * 2**20
        argv = [sys.executable, "-I", "-c", _child_source(), str(cap), str(os.getpid())]
        worker = _Worker(argv, self._env, self._home.name)
        with self._lock:
            self._live[worker.pid] = worker
            self.spawned += 1
        try:
            reply = worker.request({"op": "load", "source": self.source, "filename": self.filename, "entry": self.entry}, self.timeout)
        except _Timeout:
            self._discard(worker)
            worker.load_error = f"loading {self.filename} took longer than {self.timeout:g} s"
        except _Died as e:
            self._discard(worker)
            worker.load_error = f"the worker died while loading {self.filename} ({e})"
        else:
            worker.load_error = reply.get("error")
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.pop(worker.pid, None)
        if getattr(self._local, "worker", None) is worker:
            self._local.worker = None

    def _grade_blocking(self, args: list[Any]) -> Grade:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None or worker.proc.poll() is not None:
            if worker is not None:
                self._discard(worker)
            worker = self._local.worker = self._spawn()
        if worker.load_error is not None:
            error = worker.load_error
            if worker.pid not in self._live:
                self._local.worker = None  # it died loading: try a fresh one next time
            return Grade.failed("invalid", f"{self._label()}: {error}", error_kind="load")
        started = time.perf_counter()
        try:
            reply = worker.request({"op": "call", "args": args}, self.timeout)
        except _Timeout:
            self._discard(worker)
            return Grade.failed("invalid", f"{self._label()}: timed out after {self.timeout:g} s; the worker was killed",
                                error_kind="timeout")
        except _Died as e:
            self._discard(worker)
            cap = f" (memory cap {self.memory_mb} MiB)" if self.memory_mb else ""
            return Grade.failed("invalid", f"{self._label()}: the worker process died, {e}{cap}", error_kind="crashed")
        elapsed = time.perf_counter() - started
        logs = [line for line in (reply.get("logs") or "").splitlines() if line.strip()]
        if reply.get("kind") == "memory":
            self._discard(worker)
        if not reply.get("ok"):
            return Grade.failed("invalid", f"{self._label()}: {reply.get('error')}", error_kind=reply.get("kind") or "exception",
                                debug=logs, metrics={"python_s": elapsed})
        value = float(reply["value"])
        note = "" if -1.0 <= value <= 1.0 else f", clamped to {max(-1.0, min(1.0, value)):g}"
        debug = [f"{self.__name__}: {self.entry}() returned {value:g}{note} (worker pid {worker.pid}, {elapsed * 1000:.1f} ms)", *logs]
        return Grade.scored(value, debug=debug, metrics={"python_s": elapsed})

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Kill every worker and remove the scratch directory."""
        self._closed = True
        self._finalizer()


_SOURCE_CACHE: list[str] = []


def _child_source() -> str:
    if not _SOURCE_CACHE:
        _SOURCE_CACHE.append(textwrap.dedent(inspect.getsource(_child_main)) + "\n_child_main()\n")
    return _SOURCE_CACHE[0]


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
) -> PythonGrader:
    """A grader that runs user python in sandboxed, reused worker processes.

    Args:
        source: the code (Vertex's ``pythonCodeSnippet``, OpenAI's ``source``); or give ``file``.
        file: a ``.py`` file defining ``evaluate(example, response)`` or ``grade(sample, item)``.
        flavour: "vertex" (``evaluate`` gets a ReinforcementTuningExample and a Content) or
            "openai" (``grade`` gets OpenAI's sample and item); read from the code when omitted.
        entry: the function name, if not the flavour's default.
        timeout: wall-clock seconds per call; the worker is killed and replaced after it.
        memory_mb: the address-space cap of each worker (None: no cap).
        workers: processes in the pool (default: up to 4, one per CPU).
        env: variables to give the child on top of the allowlist (PATH, locale, TZ).
        name: the grader's name in grades and errors.

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
    if timeout <= 0:
        raise ValueError(f"{filename}: timeout must be positive")
    if memory_mb is not None and memory_mb < 32:
        raise ValueError(f"{filename}: memory_mb={memory_mb} is too small to start python (use >= 32 or None)")
    count = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    if count < 1:
        raise ValueError(f"{filename}: workers must be at least 1")
    return PythonGrader(source, filename=filename, flavour=flavour, entry=entry or ENTRY[flavour], timeout=timeout,
                        memory_mb=memory_mb, workers=count, env=env, name=name or (Path(file).stem if file else "python"))
