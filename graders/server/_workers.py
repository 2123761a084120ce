"""Worker processes for a plain ``def`` reward class: a call past its deadline is killed and replaced.

A thread cannot be stopped: a hung ``compute_reward`` on the thread pool kept its worker for ever,
so after ``max_workers`` hung requests every request answered 504. Here each call runs in a worker
process forked from the server once the computer is built, so the worker holds the instance as it
was constructed (``__init__``'s state, a loaded model; nothing is pickled but the request and the
reply). A worker serves call after call, keeping what the instance learns between them, as a
thread would, but per worker: ``max_workers`` workers are ``max_workers`` copies. A call that is
cancelled (``server.request_timeout_s``, a group deadline, shutdown) kills its worker; the next
call forks a fresh one from the instance as constructed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger("gradekit.server")


class WorkerDied(RuntimeError):
    """The worker process ended without answering (killed by the system, a crash in native code)."""


def _serve(fn: Callable[[Any], Any], conn: Connection) -> None:
    """The worker's loop: one request in, one ``(ok, value)`` out, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server ends its workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)  # the server loop's wakeup pipe is not ours
    except (ValueError, OSError):
        pass
    while True:
        try:
            arg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            value = fn(arg)
            if inspect.isawaitable(value):  # a plain def that returned a coroutine
                value = asyncio.run(value)  # type: ignore[arg-type]
            reply: tuple[bool, Any] = (True, value)
            payload = pickle.dumps(reply)
        except BaseException as e:  # the user's code may raise anything; the server answers 500 with it
            try:
                payload = pickle.dumps((False, e))
            except Exception:
                payload = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        try:
            conn.send_bytes(payload)
        except (BrokenPipeError, OSError):
            return


class _Worker:
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(fn, child), name="gradekit-reward-worker", daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        if self.process.is_alive():
            try:
                os.kill(self.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            except ProcessLookupError:
                pass
        self.process.join(5)
        self.conn.close()


class ProcessWorkers:
    """Up to ``max_workers`` forked workers for one ``fn``; idle ones are reused, cancelled ones killed."""

    def __init__(self, fn: Callable[[Any], Any], max_workers: int) -> None:
        self.fn, self.max_workers = fn, max_workers
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._semaphore: asyncio.Semaphore | None = None
        self.killed = 0  # workers ended because their call was cancelled (a deadline)

    async def run(self, arg: Any) -> Any:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_workers)
        async with self._semaphore:
            worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.process.is_alive():
                if worker is not None:
                    self._drop(worker)
                worker = _Worker(self.fn)
                self._all.add(worker)
            try:
                worker.conn.send(arg)
                reply = await self._reply(worker)
            except BaseException:
                self._drop(worker)  # cancelled (a deadline) or broken: it may be running on, so it ends here
                raise
            self._idle.append(worker)
        ok, value = reply
        if ok:
            return value
        raise value

    async def _reply(self, worker: _Worker) -> tuple[bool, Any]:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        fd = worker.conn.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            return pickle.loads(worker.conn.recv_bytes())  # type: ignore[no-any-return]
        except (EOFError, OSError) as e:
            raise WorkerDied(f"the reward worker process ended without answering (exit code {worker.process.exitcode})") from e

    def _drop(self, worker: _Worker) -> None:
        self._all.discard(worker)
        if worker.process.is_alive():
            self.killed += 1
            logger.warning("reward worker %s killed: its call was cancelled (server.request_timeout_s or a deadline); "
                           "the next call starts a new one", worker.process.pid)
        worker.kill()

    def close(self) -> None:
        for worker in list(self._all):
            worker.conn.close()  # its loop ends on EOF
        for worker in list(self._all):
            worker.process.join(2)
            worker.kill()
        self._all.clear()
        self._idle.clear()
