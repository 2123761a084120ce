"""Virtual time for pacing tests: an event loop whose clock only moves when every task waits, and a
provider's token bucket on that clock.

A run of hundreds of rows at 20 requests per second takes no wall time and comes out the same on a
loaded machine as on a quiet one: assertions count what the simulated server accepted and refused,
never how long the test took. The limiter under test runs unchanged; it only reads ``loop.time``
(``Limiter(clock=loop.time)``) and sleeps with ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

from gradekit.judge import Limiter, RetryPolicy
from gradekit.judge._retry import retry_after_seconds

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """Polls real file descriptors without blocking; a wait for a timer moves the virtual clock instead."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("every task waits and no timer is set: the simulation would never end")
        self._loop.now += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time: ``time()`` starts at 1000 and jumps to the next timer when all wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now


def run_virtual(main: Callable[[VirtualLoop], Coroutine[Any, Any, T]]) -> T:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


@dataclass
class Bucket:
    """A provider's request limit: a token bucket of ``burst`` refilled at ``rps``, as the fake provider keeps it.

    A refused request is answered at once with the wait until a token is due (``retry-after-ms``,
    ``Retry-After`` in whole seconds); an accepted one after ``latency``. ``headers``: every reply
    also carries OpenAI's ``x-ratelimit-*`` headers.
    """

    rps: float
    burst: float
    clock: Callable[[], float]
    latency: float = 0.2
    headers: bool = False
    accepted: list[float] = field(default_factory=list)  # when each accepted request arrived
    refused: list[float] = field(default_factory=list)  # when each refused one did
    _tokens: float = -1.0
    _at: float = 0.0

    async def ask(self) -> tuple[int, dict[str, str]]:
        now = self.clock()
        if self._tokens < 0:
            self._tokens, self._at = self.burst, now
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rps)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            self.accepted.append(now)
            headers = self._limit_headers()
            await asyncio.sleep(self.latency)
            return 200, headers
        self.refused.append(now)
        wait = (1 - self._tokens) / self.rps
        headers = {**self._limit_headers(), "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
                   "retry-after": str(max(1, math.ceil(wait)))}
        await asyncio.sleep(0.001)
        return 429, headers

    def _limit_headers(self) -> dict[str, str]:
        if not self.headers:
            return {}
        reset = (self.burst - self._tokens) / self.rps
        return {"x-ratelimit-limit-requests": str(round(self.rps * 60)),
                "x-ratelimit-remaining-requests": str(max(0, math.floor(self._tokens))),
                "x-ratelimit-reset-requests": f"{round(reset * 1000)}ms"}

    def accepted_rate(self) -> float:
        """Accepted requests per second, first to last (the figure benchmarks/pacing.py prints)."""
        times = self.accepted
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def _refusal(headers: Mapping[str, str]) -> Any:
    """What the retry policy reads of a 429: its response's headers (the SDK's RateLimitError carries them so)."""
    return SimpleNamespace(response=SimpleNamespace(headers=dict(headers)))


async def grade_rows(limiter: Limiter, server: Bucket, rows: int, clock: Callable[[], float],
                     retry: RetryPolicy | None = None) -> None:
    """Every row through the limiter as the judge sends one (judge._fleet: a slot, the request, observe; on a
    429 the endpoint is held for its hint and the row waits its rate-limited backoff, then asks again)."""
    policy = retry or RetryPolicy()

    async def row() -> None:
        refused = 0
        while True:
            async with limiter.slot():
                sent_at = clock()
                status, headers = await server.ask()
                limiter.observe(status, headers, sent_at=sent_at)
            if status == 200:
                return
            refused += 1
            exc = _refusal(headers)
            hint = retry_after_seconds(exc)
            if hint:
                limiter.hold(hint)
            await asyncio.sleep(policy.rate_limited_wait(exc, refused))

    await asyncio.gather(*(row() for _ in range(rows)))


def simulate(*, rps: float = 20, burst: float = 20, latency: float = 0.2, concurrency: int = 64, rows: int = 400,
             headers: bool = False, seed: int = 0) -> tuple[Bucket, Limiter]:
    """A cold start of ``rows`` rows against a ``rps`` limit; the server and the limiter afterwards."""
    random.seed(seed)  # the retry policy's jitter: the same run every time

    async def main(loop: VirtualLoop) -> tuple[Bucket, Limiter]:
        limiter = Limiter(concurrency=concurrency, clock=loop.time)
        server = Bucket(rps=rps, burst=burst, clock=loop.time, latency=latency, headers=headers)
        await grade_rows(limiter, server, rows, loop.time)
        return server, limiter

    return run_virtual(main)
