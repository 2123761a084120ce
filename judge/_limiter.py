"""One limiter per process: requests per second, tokens per minute and a concurrency cap."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

from aiolimiter import AsyncLimiter

from ._pacing import Pacer, Pacing
from ._tokens import cjk_characters



_MEDIA_TOKENS = 1_000  # an image or clip in a prompt, whatever its bytes: its base64 is not text the model reads


def estimate_tokens(text: str | list) -> int:
    """A cheap upper-ish estimate: one token per CJK character, one per four other characters.

    Content parts (a list) count their text parts so, each image as OpenAI bills it (judge._media.image_tokens:
    its size and detail), and each audio part as ``_MEDIA_TOKENS``.
    """
    if isinstance(text, list):
        return sum(_part_tokens(p) for p in text)
    if text.isascii():  # most prompts: no CJK to look for
        return math.ceil(len(text) / 4)
    cjk = cjk_characters(text)
    return cjk + math.ceil((len(text) - cjk) / 4)


def _part_tokens(part: Any) -> int:
    if not isinstance(part, dict):
        return _MEDIA_TOKENS
    if part.get("type") == "text":
        return estimate_tokens(part.get("text") or "")
    image = part.get("image_url")
    if part.get("type") == "image_url" and isinstance(image, dict):
        from ._media import image_tokens

        return image_tokens(str(image.get("url") or ""), image.get("detail"))
    return _MEDIA_TOKENS


class RequestLimiter(Protocol):
    """What a Judge needs from a limiter: the in-process Limiter and the Redis-backed SharedLimiter."""

    @property
    def concurrency(self) -> int: ...

    def slot(self, estimated_tokens: int = 0) -> AbstractAsyncContextManager[None]: ...

    async def settle(self, estimated_tokens: int, actual_tokens: int) -> None: ...

    def hold(self, seconds: float) -> None: ...

    def observe(self, status: int, headers: Mapping[str, str], *, sent_at: float | None = None, tokens: int = 0) -> None:
        """Learn the provider's limit from one reply (status, rate-limit headers); see judge._pacing."""

    def pacing(self) -> Pacing:
        """How the limiter paces now: ``headers``, ``aimd`` or ``fixed``, and the rate it holds."""
        ...


class Gcra:
    """Send instants at a rate that may change between requests (GCRA, a virtual clock).

    aiolimiter's bucket has one rate for life; a learnt rate moves with every reply. A request
    takes the next free instant only when it has come (``take``), so a waiter that slept on an
    old, slower rate asks again at the new one instead of keeping a reservation made at the old
    one. ``burst`` requests may go together after an idle spell, so the event loop's wake-up
    delays are not lost.
    """

    def __init__(self, burst: float = 2.0) -> None:
        self.burst = burst
        self._next = 0.0

    def take(self, rate: float, now: float, *, reserve: bool = False) -> float:
        """0 if the request may go now (the instant is taken), else the seconds until it may.

        With ``reserve`` the instant is taken even when it lies ahead (the caller will wait for it).
        """
        interval = 1.0 / rate
        start = max(self._next, now - (self.burst - 1) * interval)
        if start > now and not reserve:
            return start - now
        self._next = start + interval
        return max(0.0, start - now)


_RECHECK_S = 0.1  # a pacing waiter looks at the learnt rate again at least this often


class Limiter:
    """Paces every judge request of a process.

    aiolimiter's leaky bucket does the pacing; its state is rebuilt when a new event loop uses
    the limiter (the sync façade runs its own loop), because aiolimiter futures belong to one loop.
    A Retry-After from the server pauses every request, not only the one that got the 429.
    Without a told ``rps`` (or below it) the limiter paces at the rate its :class:`Pacer` learns
    from the replies (``adapt=False`` turns that off).
    """

    def __init__(
        self,
        rps: float | None = None,
        tpm: float | None = None,
        concurrency: int = 16,
        burst: float = 2.0,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        adapt: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1:
            raise ValueError("burst must be at least one request")
        if rps is not None and rps <= 0:
            raise ValueError("rps must be positive")
        if tpm is not None and tpm <= 0:
            raise ValueError("tpm must be positive")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.rps, self.tpm, self.concurrency, self.burst = rps, tpm, concurrency, burst
        # Tests record Retry-After holds and learnt-pace waits instead of waiting, or run it on a virtual clock
        # (``clock``: the same clock the caller's ``sent_at`` is on; an event loop of virtual time passes loop.time).
        self._sleep = sleep if sleep is not None else asyncio.sleep
        self._clock = clock
        self.pacer = Pacer(ceiling=rps, adapt=adapt, clock=clock)
        self._schedule = Gcra(burst)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resume_at = 0.0
        self.held_seconds = 0.0

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._semaphore = asyncio.Semaphore(self.concurrency)
        self._pace_lock = asyncio.Lock()
        # Near-steady pacing: a bucket of two requests absorbs the event loop's wake-up delays (with
        # one, each delay is lost and the pace falls ~4% short), while staying far below a provider's
        # own burst, so network jitter does not meet 429s at the edge of a burst as large as its.
        self._requests = AsyncLimiter(self.burst, self.burst / self.rps) if self.rps else None
        self._tokens = AsyncLimiter(self.tpm, 60) if self.tpm else None

    def hold(self, seconds: float) -> None:
        """Pause all new requests for ``seconds`` (the server's Retry-After)."""
        self._resume_at = max(self._resume_at, self._clock() + seconds)

    @asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[None]:
        """Hold one request slot for the duration of the request."""
        self._bind()
        async with self._semaphore:
            seen = await self._wait_out_hold(None)
            if self._requests is not None:
                await self._requests.acquire()
            if self._tokens is not None and estimated_tokens:
                await self._tokens.acquire(min(float(estimated_tokens), self._tokens.max_rate))
            await self._pace()
            await self._wait_out_hold(seen)  # a 429 may have paused the process while this one waited to be paced
            yield

    async def _pace(self) -> None:
        """Wait for the learnt rate, where it is below the told one (which aiolimiter already keeps).

        One waiter at a time (the others queue on the lock, in order), re-reading the rate while it waits.
        Unpaced (nothing learnt or told below ``rps``), no lock is taken: nothing to wait for, once per request.
        """
        if (rate := self.pacer.rate()) is None or (self.rps is not None and rate >= self.rps):
            if not self._pace_lock.locked():
                return
        async with self._pace_lock:
            while (rate := self.pacer.rate()) is not None and (self.rps is None or rate < self.rps):
                # An injected sleep (tests) does not pass time: reserve the instant and "wait" once.
                recorded = self._sleep is not asyncio.sleep
                delay = self._schedule.take(rate, self._clock(), reserve=recorded)
                if delay <= 0 or recorded:
                    if delay > 0:
                        await self._sleep(delay)
                    return
                await asyncio.sleep(min(delay, _RECHECK_S))

    def observe(self, status: int, headers: Mapping[str, str], *, sent_at: float | None = None, tokens: int = 0) -> None:
        """Learn the provider's limit from one reply (see judge._pacing)."""
        self.pacer.observe(status, headers, sent_at=sent_at, tokens=tokens)

    def pacing(self) -> Pacing:
        return self.pacer.pacing()

    async def _wait_out_hold(self, waited_for: float | None) -> float:
        """Sleep until a Retry-After hold ends, unless it is the hold this request already waited out."""
        resume = self._resume_at
        if resume != waited_for and (delay := resume - self._clock()) > 0:
            self.held_seconds += delay
            await self._sleep(delay)
        return resume

    async def settle(self, estimated_tokens: int, actual_tokens: int) -> None:
        """Charge what the server's usage says the request really cost beyond the estimate."""
        if self._tokens is None or actual_tokens <= estimated_tokens:
            return
        self._bind()
        await self._tokens.acquire(min(float(actual_tokens - estimated_tokens), self._tokens.max_rate))
