"""Long-lived checker workers: requests pipelined to warm processes, each answer under a hard deadline.

The math checker (:mod:`gradekit.graders.sandbox._checker`) is a library call on data, not a sample's
code, so a worker need not be forked per request: it stays up with math_verify loaded and
answers request lines in order. What must come from outside is the stop: a check can spin in C
(a huge power) or in a ``str()`` no alarm reaches, so this pool, not the worker, holds each
request's deadline. When the request at the head of a worker's line passes it, the pool kills
the worker's process group (its sandbox with it), answers that request ``timeout``, starts a new
worker and sends it the requests that were queued behind the killed one.

One I/O thread owns every pipe: it writes requests without blocking (a 200 KB request never
stalls the other workers' deadlines), reads replies, and wakes at the nearest deadline. Callers
get a :class:`concurrent.futures.Future`, so any thread, any event loop (asyncio, uvloop, a new
loop per call) and a Ray worker can wait on it; no signal is ever installed in the caller's
process. Standard library only.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._policy import Isolation, Policy, SandboxUnavailable, SandboxWarning, package_paths, resolve, zygote_argv
from ._pool import json_line, kill_group

DEPTH = 4  # requests in flight per worker: enough to hide the round trip, few to re-send after a kill
START_TIMEOUT = 60.0  # seconds a worker may take to load its libraries
LOAD_TRIES = 3  # per worker place: load deaths in a row (no worker loaded between them) before the requests fail
MARGIN = 0.5  # seconds past a request's own timeout before the host kills its worker


def checker_source() -> str:
    """The answer checker's program: its text rules (standard library only), then the worker itself."""
    here = Path(__file__).parent
    return "\n\n".join((here / name).read_text(encoding="utf-8") for name in ("_answer_rules.py", "_checker.py"))


@dataclass
class _Job:
    id: int
    payload: dict[str, Any]
    timeout: float
    future: Future
    data: bytes = b""
    sent_to: int = 0  # workers this request was sent to (a re-send after a kill counts again)


@dataclass
class _Slot:
    """One worker place: the running process (or none) and the requests it holds, oldest first."""

    index: int
    proc: subprocess.Popen | None = None
    ready: bool = False
    started: float = 0.0  # when the process was started (its load deadline)
    head_since: float = 0.0  # when the request at the head began (the previous reply, or the worker's ready line)
    inflight: collections.deque = field(default_factory=collections.deque)
    out: bytearray = field(default_factory=bytearray)
    buf: bytearray = field(default_factory=bytearray)


class CheckerPool:
    """``workers`` checker processes behind one I/O thread; :meth:`submit` returns a Future of the reply."""

    def __init__(self, *, name: str, workers: int, memory_mb: int | None, sandbox: Policy, packages: tuple[str, ...],
                 source: str | None = None, cpus: int = 1, margin: float = MARGIN) -> None:
        self.name, self.workers, self.memory_mb, self.margin = name, workers, memory_mb, margin
        self._source = source if source is not None else checker_source()
        self._packages = package_paths(packages)
        try:
            with warnings.catch_warnings():
                # The checker runs a library on data, not a sample's code: where it runs is shown by
                # `gradekit validate` (sandbox:), not warned on every run as graded code's fallback is.
                warnings.simplefilter("ignore", SandboxWarning)
                self.isolation: Isolation = resolve(sandbox, label=name)
        except SandboxUnavailable:
            if sandbox != "auto":
                raise
            # Without any sandbox it still runs in its own process with its limits (memory, deadline, no
            # secrets in its environment), said once.
            self.isolation = resolve("none", label=name)
            warnings.warn(f"gradekit sandbox: {name}: no sandbox can run here; the checker runs as a plain process "
                          "(a library on data, with its memory cap and deadline)", SandboxWarning, stacklevel=3)
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._cpu_count = cpus
        self._home = tempfile.TemporaryDirectory(prefix="gradekit-checker-")
        from ._pool import scrubbed_env

        self._env = scrubbed_env(self._home.name)
        self._lock = threading.Lock()
        self._pending: collections.deque[_Job] = collections.deque()
        self._slots = [_Slot(i) for i in range(workers)]
        self._ids = itertools.count(1)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None
        self.closed = False
        self.load_error: str | None = None
        self.counts = collections.Counter()  # spawned, sent, answered, killed (deadline), died, stopped, resent
        self._load_deaths = 0  # workers that died or stalled while loading since one last loaded
        self._stopping = threading.Event()  # set by the shutdown, which may run while the I/O thread still runs (at exit)
        self._finalizer = weakref.finalize(self, CheckerPool._shutdown, self._slots, self._home, self._wake_w, self._stopping)

    # ---- the caller's side ----------------------------------------------------------------------

    def submit(self, payload: dict[str, Any], timeout: float) -> Future:
        """Queue one request; the Future gets the worker's reply dict, or an error reply the pool made."""
        future: Future = Future()
        job = _Job(next(self._ids), payload, timeout, future)
        job.data = json_line({**payload, "id": job.id, "timeout": timeout})
        refused = None
        with self._lock:
            if self.closed:
                refused = f"{self.name} is closed"
            elif self.load_error is not None:
                refused = self.load_error
            else:
                self._pending.append(job)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=f"gradekit-{self.name}", daemon=True)
                    self._thread.start()
        if refused is not None:
            future.set_result(_error("verifier_error", refused))  # outside the lock: its callbacks may take theirs
        else:
            self._wake()
        return future

    @property
    def worker_pids(self) -> list[int]:
        with self._lock:
            return [s.proc.pid for s in self._slots if s.proc is not None and s.ready]

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._finalizer()

    @staticmethod
    def _shutdown(slots: list[_Slot], home: tempfile.TemporaryDirectory, wake_w: int, stopping: threading.Event) -> None:
        stopping.set()
        for slot in slots:
            if slot.proc is not None:
                kill_group(slot.proc)
                slot.proc = None
        home.cleanup()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    # ---- the I/O thread -------------------------------------------------------------------------

    def _settings(self, index: int) -> dict[str, Any]:
        cpus = None
        if self._cpus and self._cpu_count < len(self._cpus):
            start = (index * self._cpu_count) % len(self._cpus)
            cpus = [self._cpus[(start + i) % len(self._cpus)] for i in range(self._cpu_count)]
        return {"parent": os.getpid(), "scratch": self._home.name, "cpus": cpus,
                "memory": (self.memory_mb or 0) * 2**20,
                "limits": {"memory": (self.memory_mb or 0) * 2**20, "processes": 32, "file_size": 2**20}}

    def _spawn(self, slot: _Slot) -> None:
        argv = zygote_argv(self.isolation, settings=self._settings(slot.index), packages=self._packages, env=self._env,
                           source=self._source)
        slot.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=self._env, cwd=self._home.name, start_new_session=True)
        assert slot.proc.stdin is not None and slot.proc.stdout is not None
        os.set_blocking(slot.proc.stdin.fileno(), False)
        os.set_blocking(slot.proc.stdout.fileno(), False)
        slot.ready, slot.started, slot.head_since = False, time.monotonic(), 0.0
        slot.out.clear()
        slot.buf.clear()
        for job in slot.inflight:  # a new worker gets what the old one held, in order
            slot.out += job.data
            job.sent_to += 1
        self.counts["spawned"] += 1

    def _retire(self, slot: _Slot, head_reply: dict[str, Any] | None, count: str) -> None:
        """Kill the slot's worker; the head request gets ``head_reply``; the rest go back to the queue front."""
        if slot.proc is not None:
            kill_group(slot.proc)
            slot.proc = None
        self.counts[count] += 1
        jobs = list(slot.inflight)
        slot.inflight.clear()
        slot.ready = False
        if head_reply is not None and jobs:
            _resolve(jobs.pop(0), head_reply)
        with self._lock:
            for job in reversed(jobs):
                self._pending.appendleft(job)
        self.counts["resent"] += len(jobs)

    def _fill(self) -> None:
        """Hand queued requests to workers with room, the least busy first; start workers as needed."""
        with self._lock:
            while self._pending:
                room = [s for s in self._slots if len(s.inflight) < DEPTH]
                if not room:
                    return
                slot = min(room, key=lambda s: (len(s.inflight), not s.ready))
                job = self._pending.popleft()
                if job.future.done():
                    continue
                if slot.proc is None:
                    slot.inflight.append(job)
                    self._spawn(slot)  # sends every inflight request, this one included
                    continue
                if not slot.inflight and slot.ready:
                    slot.head_since = time.monotonic()
                slot.inflight.append(job)
                slot.out += job.data
                job.sent_to += 1
                self.counts["sent"] += 1

    def _read(self, slot: _Slot) -> None:
        assert slot.proc is not None and slot.proc.stdout is not None
        try:
            chunk = os.read(slot.proc.stdout.fileno(), 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._died(slot)
            return
        slot.buf += chunk
        while b"\n" in slot.buf:
            line, _, rest = bytes(slot.buf).partition(b"\n")
            slot.buf = bytearray(rest)
            try:
                reply = json.loads(line)
            except ValueError:
                self._retire(slot, _error("verifier_error", "the checker wrote a line that is not JSON"), "died")
                return
            if not slot.ready:
                if reply.get("ready"):
                    slot.ready = True
                    self._load_deaths = 0
                    slot.head_since = time.monotonic()
                    continue
                error = f"{self.name}: the checker could not load ({reply.get('error')})"
                with self._lock:
                    self.load_error = error
                self._retire(slot, _error("verifier_error", error), "died")
                self._fail_all(error)
                return
            if not slot.inflight or slot.inflight[0].id != reply.get("id"):
                self._retire(slot, _error("verifier_error", "the checker answered out of turn"), "died")
                return
            job = slot.inflight.popleft()
            slot.head_since = time.monotonic()
            self.counts["answered"] += 1
            if reply.pop("restart", False):  # out of memory: its heap is not trusted with the next request
                self._retire(slot, None, "memory")
            _resolve(job, reply)
            if slot.proc is None:
                return

    def _died(self, slot: _Slot) -> None:
        proc = slot.proc
        how = "it closed its pipe"
        if proc is not None:
            try:
                code = proc.wait(timeout=2)
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            except (subprocess.TimeoutExpired, ValueError):
                pass
        if not slot.ready:
            self._load_failed(slot, f"{self.name}: the checker died while loading ({how})")
            return
        memory = f" (memory cap {self.memory_mb} MiB)" if self.memory_mb else ""
        self._retire(slot, _error("verifier_error", f"the checker died during the check, {how}{memory}; it was replaced", True), "died")

    def _load_failed(self, slot: _Slot, error: str) -> None:
        """A worker died or stalled before it loaded: no request reached it, so all it held goes to a new one.

        A slow first start (a cold import under a loaded machine, a memory cap hit while loading) says
        nothing about the requests. Only ``LOAD_TRIES`` such losses per worker place in a row, with no
        worker loading between them, fail what is queued; a pool that never loaded at all refuses from then on.
        """
        self._retire(slot, None, "died")
        self._load_deaths += 1
        if self._load_deaths < LOAD_TRIES * self.workers:
            return
        self._load_deaths = 0
        if not self.counts["answered"]:
            with self._lock:
                self.load_error = error
        self._fail_all(error)

    def _fail_all(self, error: str) -> None:
        """Answer every request with ``error``; stop each worker that held one or was still loading.

        Left running, such a worker would answer a request already answered here (out of turn), or die
        while loading and count as one more death after the pool gave up. An idle, loaded worker stays.
        """
        with self._lock:
            jobs = list(self._pending)
            self._pending.clear()
        for slot in self._slots:
            held = list(slot.inflight)
            slot.inflight.clear()
            jobs += held
            if slot.proc is not None and (held or not slot.ready):
                self._retire(slot, None, "stopped")  # holds nothing now: nothing goes back to the queue
        for job in jobs:
            _resolve(job, _error("verifier_error", error))

    def _deadlines(self, now: float) -> float | None:
        """Enforce every deadline that passed; return the seconds to the next one."""
        nearest: float | None = None
        for slot in self._slots:
            if slot.proc is None:
                continue
            if not slot.ready:
                deadline = slot.started + START_TIMEOUT
                if now >= deadline:
                    self._load_failed(slot, f"{self.name}: the checker did not load within {START_TIMEOUT:g} s")
                    continue
            elif slot.inflight:
                head = slot.inflight[0]
                deadline = slot.head_since + head.timeout + self.margin
                if now >= deadline:
                    self._retire(slot, _error("timeout", f"no answer within {head.timeout:g} s (+{self.margin:g} s); "
                                                         "the checker was killed and replaced"), "killed")
                    continue
            else:
                continue
            nearest = deadline - now if nearest is None else min(nearest, deadline - now)
        return nearest

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    closed = self.closed
                if closed:
                    break
                self._fill()
                wait = self._deadlines(time.monotonic())
                self._fill()
                readers = [self._wake_r]
                writers = []
                by_fd: dict[int, _Slot] = {}
                for slot in self._slots:
                    if slot.proc is None:
                        continue
                    assert slot.proc.stdout is not None and slot.proc.stdin is not None
                    readers.append(slot.proc.stdout.fileno())
                    by_fd[slot.proc.stdout.fileno()] = slot
                    if slot.out:
                        writers.append(slot.proc.stdin.fileno())
                        by_fd[slot.proc.stdin.fileno()] = slot
                r, w, _ = select.select(readers, writers, [], wait)
                if self._wake_r in r:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                for fd in w:
                    slot = by_fd[fd]
                    if slot.proc is None or not slot.out:
                        continue
                    try:
                        n = os.write(fd, slot.out)
                        del slot.out[:n]
                    except BlockingIOError:
                        pass
                    except OSError:
                        self._died(slot)
                for fd in r:
                    if fd == self._wake_r:
                        continue
                    slot = by_fd[fd]
                    stdout = slot.proc.stdout if slot.proc is not None else None
                    # a worker replaced earlier in this round (its write failed) has a closed pipe: not this fd any more
                    if stdout is not None and not stdout.closed and stdout.fileno() == fd:
                        self._read(slot)
        except BaseException as e:  # noqa: BLE001 - the thread must never leave a Future unanswered
            self._fail_all(f"{self.name}: the checker pool failed ({type(e).__name__}: {e})")
            if not self._stopping.is_set():  # a pipe the shutdown closed under this thread (an unclosed pool at exit) is no failure
                raise
        finally:
            self._fail_all(f"{self.name} is closed")
            for slot in self._slots:
                if slot.proc is not None:
                    kill_group(slot.proc)
                    slot.proc = None


def _error(kind: str, detail: str, transient: bool = False) -> dict[str, Any]:
    """A reply the pool makes; ``transient``: it says nothing about the request (a worker died under it)."""
    return {"outcome": "error", "error_kind": kind, "detail": detail, **({"transient": True} if transient else {})}


def _resolve(job: _Job, reply: dict[str, Any]) -> None:
    if not job.future.done():
        try:
            job.future.set_result(reply)
        except Exception:  # noqa: BLE001 - a cancelled future: nobody waits
            pass
