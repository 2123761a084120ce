"""Bounded work: ``max_workers`` computations at once, ``queue_size`` requests waiting, 503 beyond.

Admission counts HTTP requests, not items: a DashScope group or an OpenRLHF batch is one request
(refusing part of a batch would fail a whole training step), while each of its items takes a
worker in turn. A refused request is answered at once, so a saturated server never hangs a
client: it says "busy" and the client's own retry spreads the load.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Busy(Exception):
    """Every worker is taken and the queue is full."""


class WorkPool:
    """Sync callables run on a thread pool; coroutine functions on the event loop under a semaphore."""

    def __init__(self, max_workers: int, queue_size: int) -> None:
        if max_workers < 1 or queue_size < 0:
            raise ValueError("max_workers must be at least 1 and queue_size at least 0")
        self.max_workers, self.queue_size = max_workers, queue_size
        self.admitted = 0
        self._semaphore: asyncio.Semaphore | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def capacity(self) -> int:
        return self.max_workers + self.queue_size

    def start(self) -> None:
        """Make the loop-bound parts; called from the app's lifespan, on the serving loop."""
        self._semaphore = asyncio.Semaphore(self.max_workers)
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="gradekit-reward")

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def admit(self) -> None:
        """Take a place for one request or raise Busy; no await between the check and the count,
        so concurrent requests on the loop cannot both take the last place."""
        if self.admitted >= self.capacity:
            raise Busy(f"{self.admitted} requests in flight, capacity {self.max_workers} workers + {self.queue_size} queued")
        self.admitted += 1

    def leave(self) -> None:
        self.admitted -= 1

    async def run(self, fn: Callable[[Any], T | Awaitable[T]], arg: Any) -> T:
        """``fn(arg)`` on a worker: the thread pool for a plain function, the semaphore for a coroutine function."""
        if self._semaphore is None or self._executor is None:
            raise RuntimeError("the work pool is not started (the app's lifespan did not run)")
        if inspect.iscoroutinefunction(fn):
            async with self._semaphore:
                return await fn(arg)  # type: ignore[no-any-return, misc]
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, fn, arg)
        if inspect.isawaitable(result):  # a plain def that returned a coroutine
            async with self._semaphore:
                return await result  # type: ignore[no-any-return]
        return result  # type: ignore[return-value]
