"""One provider limit for a whole Ray cluster: a named, detached limiter actor hands out permits.

N Ray workers each with an in-process :class:`Limiter` would send N times the provider's limit.
Here every worker asks one actor (``gradekit-limiter`` in namespace ``gradekit``) for its
permits, so the cluster as a whole keeps ``limits.rps``/``limits.tpm`` and every Retry-After hold.

The actor is a scheduler, not a gate: a call ``reserve(budget, n)`` books the next ``n`` request
times of the budget, spaced ``1/rps`` apart (GCRA: a theoretical arrival time that only moves
forward), and answers with how long from now the first one starts. The worker sleeps until each
of its times locally, so one actor call pays for a small batch of requests and the actor is
never on the request path itself. The batch is as large as the number of this worker's
requests waiting right now, at most ``lease_s`` worth of the rate, so a worker never books time
that others could use. Tokens are leased the same way: a worker books a chunk of the tokens per
minute and spends its estimates and actual usage from it locally.

What stays per worker process: the concurrency cap and Retry-After holds of its own requests (an
inner :class:`Limiter`). A hold is also told to the actor, which pushes the budget's next free
time past it, so every worker's next booking waits it out; permits a worker booked before the
hold are at most one lease (``lease_s``) of the rate.

The actor restarts when it dies (``max_restarts=-1``) and calls in flight are retried; its state
is only the budgets' next free times, rebuilt from the next calls, which carry the told limits.
A learnt rate (self-pacing) can be set on a budget with :meth:`RayLimiter.set_rate`; it
overrides the told one until cleared.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from gradekit._extras import require

from ._limiter import Limiter
from ._pacing import Pacer, PacingMode, SharedPace

ACTOR_NAME = "gradekit-limiter"
NAMESPACE = "gradekit"
LEASE_S = 0.1  # a batch of permits or tokens covers at most this much of the budget's rate
STALE_S = 0.5  # a booked permit unused this long after its time is dropped, never sent late in a burst


class _Budget:
    """One budget's schedule: the next free request time and the token bucket's arrival time."""

    def __init__(self, rps: float | None, tpm: float | None) -> None:
        self.rps, self.tpm = rps, tpm
        self.learnt_rps: float | None = None
        self.learnt_tpm: float | None = None
        self.next_request = 0.0
        self.token_tat = 0.0  # GCRA: the time the bucket would be empty at the full rate
        self.hold_until = 0.0
        self.granted = 0
        self.calls = 0


class LimiterActor:
    """The state behind :class:`RayLimiter`; wrapped with ``ray.remote`` by :func:`limiter_actor`.

    All times are this actor's ``time.monotonic()``; callers get durations, never times, so nodes'
    clocks need not agree.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._budgets: dict[str, _Budget] = {}
        self._clock = clock  # tests step a clock of their own: the schedule is arithmetic, not timing

    def _budget(self, budget: str, rps: float | None, tpm: float | None) -> _Budget:
        state = self._budgets.get(budget)
        if state is None:
            state = self._budgets[budget] = _Budget(rps, tpm)
        state.calls += 1
        return state

    def reserve(self, budget: str, rps: float | None, tpm: float | None, requests: int, tokens: float) -> tuple[float, float, float]:
        """Book ``requests`` request times and ``tokens`` tokens.

        Returns ``(delay, interval, hold)``: the first request may go ``delay`` seconds from now,
        each next one ``interval`` later; the tokens are available after ``delay`` too; ``hold``
        is how much of a Retry-After hold is left (0 if none).
        """
        state = self._budget(budget, rps, tpm)
        now = self._clock()
        start = max(now, state.hold_until)
        interval = 0.0
        rate = state.learnt_rps or state.rps
        if requests and rate:
            interval = 1.0 / rate
            start = max(start, state.next_request)
            state.next_request = start + requests * interval
        per_s = (state.learnt_tpm or state.tpm or 0) / 60
        if tokens and per_s:
            # A bucket of one minute's tokens (as the in-process Limiter's): a burst up to tpm goes at once.
            state.token_tat = max(state.token_tat, now) + tokens / per_s
            start = max(start, state.token_tat - 60.0)
        state.granted += requests
        return start - now, interval, max(0.0, state.hold_until - now)

    def hold(self, budget: str, seconds: float) -> None:
        """A Retry-After: no booking of this budget starts before it ends."""
        state = self._budgets.setdefault(budget, _Budget(None, None))
        state.hold_until = max(state.hold_until, self._clock() + seconds)

    def set_rate(self, key: str, rps: float | None = None, tpm: float | None = None) -> None:
        """Set (or clear with None) a learnt rate on every budget of ``key``, overriding the told one."""
        for name, state in self._budgets.items():
            if name.rsplit("|", 2)[0] == key:  # budgets are named key|rps|tpm
                state.learnt_rps, state.learnt_tpm = rps, tpm

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per budget: permits granted, calls served, the rates in force (for benchmarks and debugging)."""
        return {name: {"granted": s.granted, "calls": s.calls, "rps": s.learnt_rps or s.rps, "tpm": s.learnt_tpm or s.tpm}
                for name, s in self._budgets.items()}

    def ping(self) -> bool:
        return True


def limiter_actor(name: str = ACTOR_NAME, namespace: str = NAMESPACE) -> Any:
    """The cluster's limiter actor, created on first use: named, detached, restarted when it dies.

    ``num_cpus=0`` so it never takes a CPU a judge worker could use; calls in flight when it
    dies are retried on the restarted actor.
    """
    import ray

    actor_class = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=1)(LimiterActor)
    return actor_class.options(name=name, namespace=namespace, lifetime="detached", get_if_exists=True).remote()


async def _ray_result(ref: Any) -> Any:
    # A future of the ObjectRef, wrapped for whichever loop runs now: works from a new loop per call.
    return await asyncio.wrap_future(ref.future())


class RayLimiter(SharedPace):
    """A limiter whose rates and Retry-After holds are shared by every process of a Ray cluster.

    Same interface as :class:`Limiter`. Processes share a budget when they use the same ``key``
    and the same ``rps``/``tpm`` (the limits are part of the budget's name, as in Redis).

    Args:
        rps: requests per second for the whole cluster.
        tpm: tokens per minute for the whole cluster.
        concurrency: requests in flight at once, per process.
        key: names the budget (the CLI uses ``base_url|model``).
        lease_s: the largest batch a process books at once, in seconds of the rate.
        actor_name, namespace: where the limiter actor lives.
    """

    def __init__(self, *, rps: float | None = None, tpm: float | None = None, concurrency: int = 16, burst: float = 2.0,
                 key: str = "default", lease_s: float = LEASE_S, actor_name: str = ACTOR_NAME, namespace: str = NAMESPACE,
                 adapt: bool = True) -> None:
        # Validates the numbers; keeps the per-process concurrency cap and local Retry-After holds.
        self._local = Limiter(rps=rps, tpm=tpm, concurrency=concurrency, burst=burst, adapt=False)
        # Self-pacing: each worker learns from its own replies and hands a changed rate to the actor,
        # which paces every worker of the key to it (below a told rps, never above).
        self.pacer = Pacer(ceiling=rps, adapt=adapt)
        self._published_version = self.pacer.version
        self._local.rps = self._local.tpm = None  # the pacing is the actor's
        self.rps, self.tpm, self.key, self.lease_s = rps, tpm, key, lease_s
        self.budget = f"{key}|{rps}|{tpm}"
        self.actor_name, self.namespace = actor_name, namespace
        self._actor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._permits: deque[float] = deque()  # booked request times, this process's monotonic clock
        self._tokens = 0.0  # leased tokens not yet spent (negative: spent beyond the lease)
        self._waiting = 0
        self._hold_checked = 0.0
        self.held_seconds = 0.0
        self.calls = 0  # actor calls made: the cost side of the batching

    @property
    def concurrency(self) -> int:
        return self._local.concurrency

    def __repr__(self) -> str:
        return f"RayLimiter(rps={self.rps}, tpm={self.tpm}, key={self.key!r})"

    def _handle(self) -> Any:
        if self._actor is None:
            import ray

            if not ray.is_initialized():
                ray.init(address="auto", namespace=self.namespace, include_dashboard=False, log_to_driver=False)
            self._actor = limiter_actor(self.actor_name, self.namespace)
        return self._actor

    def check(self, timeout: float = 30.0) -> None:
        """Reach the actor now (creating it if needed); raise ConnectionError if Ray or the actor does not answer."""
        require("ray", "the Ray limiter")
        try:
            import ray

            ray.get(self._handle().ping.remote(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 -- Ray's many failure types all mean: no cluster limiter
            raise ConnectionError(f"the Ray limiter actor {self.namespace}/{self.actor_name} is unreachable: {exc}") from exc

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # locks belong to one loop: the sync façade runs its own
            self._loop = loop
            self._booking = asyncio.Lock()

    async def _reserve(self, requests: int, tokens: float) -> tuple[float, float]:
        self.calls += 1
        ref = self._handle().reserve.remote(self.budget, self.rps, self.tpm, requests, tokens)
        delay, interval, hold = await _ray_result(ref)
        if hold > 0:
            self._local.hold(hold)
        return time.monotonic() + delay, interval

    async def _request_time(self) -> float:
        """The time this request may go: a booked permit, booking a batch when none is left."""
        self._waiting += 1
        try:
            async with self._booking:  # one booking call per process at a time; the others take its permits
                now = time.monotonic()
                while self._permits and self._permits[0] < now - STALE_S:
                    self._permits.popleft()
                if not self._permits:
                    batch = max(1, min(self._waiting, math.floor(self.rps * self.lease_s)))  # type: ignore[operator]
                    start, interval = await self._reserve(batch, 0)
                    self._permits.extend(start + i * interval for i in range(batch))
                return self._permits.popleft()
        finally:
            self._waiting -= 1

    async def _take_tokens(self, amount: float) -> None:
        async with self._booking:
            if self._tokens >= amount:
                self._tokens -= amount
                return
            lease = max(amount - self._tokens, self.tpm * self.lease_s / 60)  # type: ignore[operator]
            start, _ = await self._reserve(0, lease)
            self._tokens += lease - amount
        await _sleep_until(start)

    @asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[None]:
        """Hold one request slot: local cap, the cluster's tokens and request time, local holds."""
        async with self._local.slot():
            self._bind()
            if self.tpm and estimated_tokens:
                await self._take_tokens(min(float(estimated_tokens), self.tpm))
            if self.rps:
                await _sleep_until(await self._request_time())
            elif not self.tpm and time.monotonic() - self._hold_checked > self.lease_s:
                # No rates: only learn of a cluster-wide hold, at most once a lease, not once a request.
                self._hold_checked = time.monotonic()
                await self._reserve(0, 0)
            await self._local._wait_out_hold(None)  # a 429 elsewhere in this process while this one waited
            yield

    async def settle(self, estimated_tokens: int, actual_tokens: int) -> None:
        """Charge the tokens the server says the request cost beyond the estimate (from the lease)."""
        if self.tpm and actual_tokens > estimated_tokens:
            self._tokens -= actual_tokens - estimated_tokens  # the next lease books the debt too

    def hold(self, seconds: float) -> None:
        """Pause new requests of every process for ``seconds`` (the server's Retry-After)."""
        self._local.hold(seconds)
        self._permits.clear()  # booked before the pause: not to be sent into it
        try:
            self._handle().hold.remote(self.budget, seconds)  # fire and forget: the local hold stands meanwhile
        except Exception:  # noqa: BLE001 -- a missing actor must not turn a 429 into a crash; the local hold stands
            pass

    def _share(self, mode: PacingMode, rps: float | None) -> None:
        """Hand a changed learnt rate to the actor, for the whole cluster (SharedPace.observe)."""
        try:
            self._handle().set_rate.remote(self.key, rps, None)  # fire and forget, like a hold
        except Exception:  # noqa: BLE001 -- a missing actor must not turn a reply into a crash; the told rate stands
            pass

    def set_rate(self, rps: float | None = None, tpm: float | None = None) -> None:
        """Override the told rates of this key's budgets with learnt ones, cluster-wide (None clears)."""
        import ray

        ray.get(self._handle().set_rate.remote(self.key, rps, tpm))


async def _sleep_until(when: float) -> None:
    if (delay := when - time.monotonic()) > 0:
        await asyncio.sleep(delay)
