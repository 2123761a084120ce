"""One rate limit shared by several processes: request and token windows kept in Redis.

Several `gradekit grade` processes, or replicas of a reward server, that talk to one provider
share that provider's limit. The in-process :class:`Limiter` cannot see the others; this one
counts every process's requests in Redis through the ``limits`` library (imported lazily, so
the judge core never needs it unless a ``redis://`` limiter is asked for).

What is shared and what stays local:

- requests per second: ``limits``' moving window (a Redis list of the last R timestamps). It is
  exact: no 1-second window of acquisitions holds more than R, whichever process made them.
- tokens per minute: ``limits``' sliding window counter (two counters per minute). A moving
  window would keep one list entry per *token* (a million entries for 1M tpm); the counter is
  O(1) per request and approximates the moving minute, like the token estimate it counts.
- Retry-After: a Redis key with that expiry, so one 429 pauses every process, not only the one
  that got it.
- the concurrency cap and the smooth local pacing (``burst``) stay per process: an inner
  :class:`Limiter` does them, so a single process behaves as it does without Redis.
- the learnt rate (self-pacing, judge._pacing): each process's :class:`Pacer` learns from its own
  replies and publishes what it learns to a Redis hash; every process adopts the latest one
  (read at most every quarter second), and all of them take their send times from one GCRA
  schedule in Redis (a Lua script on Redis's clock), so the learnt rate is one budget for all.

A slot that is not free is waited for, never failed: the waiter sleeps until the window's reset
time (when the oldest request leaves the moving window; for tokens at least the time the deficit
needs at the full rate), then tries again. One coroutine per process polls Redis at a time.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from gradekit._extras import require

from ._limiter import Limiter
from ._pacing import FIRST_REPLY_WAIT_S, Pacer, PacingMode, SharedPace

_SCHEMES = ("redis", "rediss", "redis+unix")
_KEY_PREFIX = "gradekit"
_MIN_POLL = 0.005  # never poll Redis faster than this, whatever a reset time says
_PACE_REFRESH = 0.25  # seconds between reads of the shared learnt rate
_FIRST_REPLY_POLL = 0.02  # how often a first wave looks for its first reply (or a rate another process published)
_PACE_TTL_MS = 600_000  # a learnt rate nobody confirms for ten minutes is forgotten
# The next send instant at a rate that may change per call (GCRA), on Redis's clock for every process.
_GCRA_SCRIPT = """
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('get', KEYS[1]) or '0')
local start = math.max(tat, now - (tonumber(ARGV[2]) - 1) * interval)
if start > now then
    return string.format('%.6f', start - now)
end
redis.call('set', KEYS[1], string.format('%.6f', start + interval), 'PX', ARGV[3])
return '0'

"""
# Atomically lengthen (never shorten) the shared Retry-After hold.
_HOLD_SCRIPT = """
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('set', KEYS[1], '1', 'PX', ARGV[1])
end
return 0
"""


def _redact(url: str) -> str:
    """The URL with any password replaced, fit for an error message."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _per_window(rps: float) -> tuple[int, int]:
    """Requests per window of whole seconds (the ``limits`` granularity), never above ``rps``."""
    for seconds in range(1, 61):
        amount = rps * seconds
        if amount >= 1 - 1e-9 and abs(amount - round(amount)) < 1e-9:
            return round(amount), seconds
    seconds = max(1, math.ceil(1 / rps))
    return max(1, math.floor(rps * seconds)), seconds


class SharedLimiter(SharedPace):
    """A limiter whose request and token budgets, and Retry-After holds, are shared through Redis.

    Same interface as :class:`Limiter` (``slot``, ``settle``, ``hold``, ``concurrency``). Every
    process that should share one budget uses the same Redis, the same ``key`` and the same
    ``rps``/``tpm`` (the limits are part of the Redis key, so different limits never mix).

    Args:
        url: ``redis://[:password@]host:port/db``, ``rediss://...`` or ``redis+unix:///path?db=0``.
        rps: requests per second for all processes together.
        tpm: tokens per minute for all processes together.
        concurrency: requests in flight at once, per process.
        burst: per-process pacing bucket, as in :class:`Limiter`.
        key: names the budget in Redis; processes with different keys do not share.
        adapt: learn the provider's limit from replies, one learnt rate for every process.

    A Redis that does not answer raises :class:`ConnectionError` naming the URL: at once from
    :meth:`check` (which :func:`limiter_from_url` calls), else from the first ``slot``.
    """

    def __init__(
        self,
        url: str,
        *,
        rps: float | None = None,
        tpm: float | None = None,
        concurrency: int = 16,
        burst: float = 2.0,
        key: str = "default",
        adapt: bool = True,
    ) -> None:
        scheme = urllib.parse.urlsplit(url).scheme.removeprefix("async+")
        if scheme not in _SCHEMES:
            raise ValueError(f"a shared limiter needs a redis://, rediss:// or redis+unix:// URL, not {_redact(url)!r}")
        require("redis", "a redis:// limiter")
        # Validates rps, tpm, concurrency and burst, and does the per-process part of the work.
        # Its own learning is off: a per-process learnt rate would let each process take the whole limit.
        self._local = Limiter(rps=rps, tpm=None, concurrency=concurrency, burst=burst, adapt=False)
        self.pacer = Pacer(ceiling=rps, adapt=adapt)
        self._pace_key, self._gcra_key = f"{_KEY_PREFIX}:pace/{key}", f"{_KEY_PREFIX}:gcra/{key}"
        self._published_version = 0
        self._stamp = ""  # the shared rate's stamp last adopted or published, so our own is not re-adopted
        self._read_at = -math.inf
        self.url, self.rps, self.tpm, self.burst, self.key = url, rps, tpm, burst, key
        self._storage_url = "async+" + url.removeprefix("async+")
        self._client_url = url.removeprefix("async+").replace("redis+unix://", "unix://", 1)
        self._hold_key = f"{_KEY_PREFIX}:hold/{key}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publishing: set[asyncio.Task[None]] = set()
        self.held_seconds = 0.0
        self._first_sent: float | None = None  # when this process's first request went, pace unknown

    @property
    def concurrency(self) -> int:
        return self._local.concurrency

    def __repr__(self) -> str:
        return f"SharedLimiter({_redact(self.url)!r}, rps={self.rps}, tpm={self.tpm}, key={self.key!r})"

    # ---- connection -------------------------------------------------------------------------

    def _client(self, timeout: float | None = None) -> Any:
        import coredis  # the client ``limits[async-redis]`` installs and ``limits`` uses by default

        return coredis.Redis.from_url(self._client_url, connect_timeout=timeout, stream_timeout=timeout)

    def _unreachable(self, exc: BaseException) -> ConnectionError:
        return ConnectionError(f"the shared limiter's Redis at {_redact(self.url)} is unreachable: {exc}")

    def check(self, timeout: float = 5.0) -> None:
        """PING Redis now; raise ConnectionError naming the URL if it does not answer.

        Runs on its own thread and event loop, so it works from sync code and inside a running loop.
        The Redis client is imported first, on the caller's thread: on a busy machine the import alone
        can take seconds, and ``timeout`` is for Redis to answer, not for Python to load a module.
        """
        import coredis  # noqa: F401 -- loaded before the clock starts (see above)

        failure: list[BaseException] = []

        async def ping() -> None:
            client = self._client(timeout)
            try:
                await client.ping()
            finally:
                client.connection_pool.disconnect()  # this loop ends here; its sockets with it
                await asyncio.sleep(0)  # let the transports finish closing before the loop does

        def probe() -> None:
            try:
                asyncio.run(ping())
            except Exception as exc:  # noqa: BLE001 -- any failure is reported to the caller below
                failure.append(exc)

        thread = threading.Thread(target=probe, name="gradekit-limiter-check", daemon=True)
        thread.start()
        thread.join(timeout + 1)
        if thread.is_alive():
            raise self._unreachable(TimeoutError(f"no answer within {timeout:g} s"))
        if failure:
            raise self._unreachable(failure[0]) from failure[0]

    def _bind(self) -> None:
        # Redis clients and their connections belong to one event loop: rebuild them for a new one
        # (the sync façade runs its own loop), as Limiter does for its aiolimiter state.
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        from limits import RateLimitItemPerMinute, RateLimitItemPerSecond
        from limits.aio.storage import RedisStorage
        from limits.aio.strategies import (
            MovingWindowRateLimiter,
            SlidingWindowCounterRateLimiter,
        )

        storage = RedisStorage(self._storage_url, wrap_exceptions=True, key_prefix=_KEY_PREFIX)
        self._requests = self._tokens = None
        if self.rps:
            amount, seconds = _per_window(self.rps)
            self._requests = (MovingWindowRateLimiter(storage), RateLimitItemPerSecond(amount, seconds, namespace="limit"))
        if self.tpm:
            self._tokens = (SlidingWindowCounterRateLimiter(storage), RateLimitItemPerMinute(max(1, math.floor(self.tpm)), 1, namespace="limit"))
        if self._loop is not None:
            self._redis.connection_pool.disconnect()  # the previous loop's sockets
        self._redis = self._client()
        self._request_poll, self._token_poll, self._pace_lock = asyncio.Lock(), asyncio.Lock(), asyncio.Lock()
        self._loop = loop

    async def _redis_call(self, call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except (ConnectionError, TimeoutError) as exc:  # already ours, or an OSError from the socket
            raise self._unreachable(exc) from exc
        except Exception as exc:
            from coredis.exceptions import RedisError
            from limits.errors import StorageError

            if isinstance(exc, (RedisError, StorageError)):
                raise self._unreachable(exc) from exc
            raise

    # ---- the Limiter interface --------------------------------------------------------------

    def hold(self, seconds: float) -> None:
        """Pause new requests of every process for ``seconds`` (the server's Retry-After)."""
        self._local.hold(seconds)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no Redis: the local hold is all there is
        self._bind()
        task = asyncio.ensure_future(self._publish_hold(seconds))
        self._publishing.add(task)  # keep a reference until it is done
        task.add_done_callback(self._published)

    def _published(self, task: asyncio.Task[None]) -> None:
        self._publishing.discard(task)
        if not task.cancelled():
            task.exception()  # a Redis failure here resurfaces at the next slot(); the local hold stands

    async def _publish_hold(self, seconds: float) -> None:
        ms = max(1, math.ceil(seconds * 1000))
        await self._redis_call(lambda: self._redis.eval(_HOLD_SCRIPT, keys=[self._hold_key], args=[ms]))

    async def _wait_for_shared_hold(self) -> None:
        while (ms := await self._redis_call(lambda: self._redis.pttl(self._hold_key))) > 0:
            self.held_seconds += ms / 1000
            await asyncio.sleep(ms / 1000)

    async def _acquire(self, limit: Any, lock: asyncio.Lock, what: str, cost: int, *, after_hold: bool = False) -> None:
        """Take ``cost`` from a shared window, sleeping until its reset time while it is full.

        With ``after_hold``, a Retry-After hold is waited out right before every attempt: a request
        that waited for the window while another process met a 429 must not go out into that pause.
        """
        strategy, item = limit
        cost = min(cost, item.amount)  # as Limiter does: one request never waits for more than the whole budget
        async with lock:  # one poller per process; the others queue here, not at Redis
            while True:
                if after_hold:
                    await self._wait_for_shared_hold()
                if await self._redis_call(lambda: strategy.hit(item, what, self.key, cost=cost)):
                    return
                stats = await self._redis_call(lambda: strategy.get_window_stats(item, what, self.key))
                # The reset time is when the next unit frees (exactly, for the moving window). Several
                # missing tokens need longer: the sliding counter's weighted count falls by at most
                # amount per window, so asking before deficit / amount windows would be a wasted poll.
                wait = stats.reset_time - time.time()
                if (deficit := cost - stats.remaining) > 1:
                    wait = max(wait, deficit * item.get_expiry() / item.amount)
                await asyncio.sleep(max(_MIN_POLL, wait))

    @asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[None]:
        """Hold one request slot: local cap and pacing, then the shared hold, tokens and requests."""
        async with self._local.slot():
            self._bind()
            await self._wait_for_shared_hold()
            # Tokens first: their wait can be long, and the request timestamp should be taken last,
            # right before the request goes out, so the moving window sees when it really left.
            if self._tokens is not None and estimated_tokens:
                await self._acquire(self._tokens, self._token_poll, "tpm", math.ceil(estimated_tokens))
            if self._requests is not None:
                await self._acquire(self._requests, self._request_poll, "rps", 1, after_hold=True)
            elif self._tokens is not None:
                await self._wait_for_shared_hold()
            await self._pace()
            yield

    # ---- self-pacing: one learnt rate, one schedule, for every process ------------------------

    def _ready_to_share(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._bind()
        return True

    def _share(self, mode: PacingMode, rps: float | None) -> None:
        """Publish a changed learnt rate to the other processes, in the background (SharedPace.observe)."""
        self._stamp = f"{os.getpid()}:{id(self)}:{self._published_version}"
        mapping = {"mode": mode, "rps": repr(rps), "stamp": self._stamp}
        task = asyncio.ensure_future(self._redis_call(lambda: self._publish_rate(mapping)))
        self._publishing.add(task)
        task.add_done_callback(self._published)

    async def _publish_rate(self, mapping: dict[str, str]) -> None:
        await self._redis.hset(self._pace_key, mapping)
        await self._redis.pexpire(self._pace_key, _PACE_TTL_MS)

    async def _adopt_shared_rate(self) -> None:
        """Take the rate another process learnt, if it published one since we last looked."""
        now = time.monotonic()
        if now - self._read_at < _PACE_REFRESH:
            return
        self._read_at = now
        shared = await self._redis_call(lambda: self._redis.hgetall(self._pace_key))
        fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in (shared or {}).items()}
        if not fields or fields.get("stamp") == self._stamp:
            return
        try:
            rps = float(fields["rps"])
        except (KeyError, ValueError):
            return
        if fields.get("mode") in ("headers", "aimd") and rps > 0:
            self._stamp = fields.get("stamp", "")
            self.pacer.adopt(fields["mode"], rps)  # type: ignore[arg-type]

    async def _pace(self) -> None:
        """Wait for this request's instant in the shared schedule at the learnt rate (below a told one).

        Before anything is learnt (no told rps, no reply here, no rate in Redis), one request per
        process goes first and the others wait for its reply (at most ``FIRST_REPLY_WAIT_S``): a
        shared limit is met by every process's first wave at once, processes x concurrency
        requests, which no provider's bucket holds. A single process's first wave (a local
        :class:`Limiter`) is its concurrency, and goes out together.
        """
        if not self.pacer.adapt:
            return
        async with self._pace_lock:  # one waiter per process asks Redis; the others queue here
            while True:
                await self._adopt_shared_rate()
                rate = self.pacer.rate()
                if rate is None and self.rps is None and not self.pacer.heard:
                    now = time.monotonic()
                    if self._first_sent is None:
                        self._first_sent = now
                        return
                    if now - self._first_sent < FIRST_REPLY_WAIT_S:
                        self._read_at = -math.inf  # another process's reply counts as much as our own
                        await asyncio.sleep(_FIRST_REPLY_POLL)
                        continue
                if rate is None or (self.rps is not None and rate >= self.rps):
                    return
                # A fifth of a second's worth may go together: two processes' wake-up delays on a busy
                # machine add up, and the schedule reclaims them instead of losing them (the
                # learnt rate keeps a reserve in the provider's bucket for exactly this).
                args = [f"{1 / rate:.6f}", repr(max(self.burst, rate * 0.2)), _PACE_TTL_MS]
                delay = float(await self._redis_call(lambda: self._redis.eval(_GCRA_SCRIPT, keys=[self._gcra_key], args=args)))
                if delay <= 0:
                    return
                await asyncio.sleep(max(_MIN_POLL, min(delay, _PACE_REFRESH / 2)))  # then ask again, at the rate then

    async def settle(self, estimated_tokens: int, actual_tokens: int) -> None:
        """Charge what the server's usage says the request really cost beyond the estimate."""
        if self._tokens is None or actual_tokens <= estimated_tokens:
            return
        self._bind()
        await self._acquire(self._tokens, self._token_poll, "tpm", math.ceil(actual_tokens - estimated_tokens))
