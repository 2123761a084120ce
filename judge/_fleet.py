"""A fleet: one judge model reached through several endpoints (replicas, keys, regions).

Each endpoint (:class:`Member`) has its own limiter (so its own self-pacing, :mod:`gradekit.judge._pacing`),
its own health breaker (:class:`~judge._breaker.EndpointBreaker`), its own SDK clients and its own
counts. A request goes to the usable endpoint with the shortest expected wait, ``(pending + 1) /
capacity``, where capacity is the rate its limiter paces at (told or learnt from headers and
429s) times its weight: join-the-shortest-expected-delay, so the fleet's throughput is the sum of
its members' limits and no endpoint queues work another could take now.

What stays one for the whole fleet: the model, the rubric, the request sent (the dialect is
shared, see :func:`gradekit.judge._dialect.dialect_of`) and so the cache key. A row's reply does not depend
on which replica answered it, so the cache cannot either.

A fleet of two or more hedges (:mod:`gradekit.judge._hedge`, :class:`_Race`): a request still unanswered
at its endpoint's deadline goes once more to another endpoint, and the first answer is the
attempt's, so one row still has one reply, one cache entry and one result.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._redact import check_base_url, redact, redact_url, remember, remember_url

import openai

from ._breaker import Breaker, EndpointBreaker, EndpointState, Trip
from ._deadline import RowClock, row_clock
from ._hedge import HedgeBudget, HedgePolicy, HedgeStats, LatencyTracker, deadlines
from ._limiters import endpoint_limiter
from ._pacing import FIRST_REPLY_WAIT_S, Pacing
from ._retry import RetryPolicy, is_local, retry_after_seconds
from ._fastwire import FastWire, open_wire
from ._native import NATIVE_ROUTES, post_native
from ._tiers import flex_capacity
from ._verdict import NO_USAGE, Usage
from ._sdk import sdk_http, whole_request_seconds
from ._wire import Failed, Route, breaker_failure, carrying, check_body, post, reply_usage, route_url, spent_by

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from ._limiter import RequestLimiter

log = logging.getLogger("gradekit.judge")

_HORIZON_S = 1.0
_PROBES_TO_GIVE_UP = 2
_ALL_OUT_POLL_S = 0.25  # how often a request waiting out an outage of every endpoint looks again
_UNPACED = 10_000.0  # the capacity of an endpoint nothing limits (requests per second): spread by pending count


_NOT_OPENED: Any = object()


class _Skipped(Exception):
    """The endpoint this request waited for went out of the fleet before it was sent: route it again."""


class _NoHedge(Exception):
    """No endpoint but the first request's own could take the hedge: it is not sent."""


class Endpoint(BaseModel):
    """One way to reach the judge model: an API root and its key, with what is known of its limit.

    ``api_key`` may name an environment variable (``$NAME`` or ``${NAME}``), so a config file need
    not hold the key itself. ``weight`` scales the endpoint's share while its limit is unknown (and
    its learnt capacity after). ``rps``/``tpm`` are told limits of this endpoint alone (ceilings;
    its replies may pace it lower).
    """

    model_config = ConfigDict(extra="forbid")

    base_url: str
    api_key: str | None = None
    weight: float = Field(1.0, gt=0)
    rps: float | None = Field(None, gt=0)
    tpm: float | None = Field(None, gt=0)

    def resolved_key(self) -> str | None:
        """The key itself: ``$NAME`` read from the environment (an unset variable is an error, not no key)."""
        key = key_from_env(self.api_key, f"endpoint {redact_url(self.base_url)}")
        remember(key)  # judge._redact: the key is masked wherever it would be shown
        return key


def key_from_env(key: str | None, owner: str) -> str | None:
    """A configured API key: ``$NAME`` / ``${NAME}`` is read from that environment variable (keys stay out of the
    files people share); anything else is the key itself. A named variable that is unset is an error naming ``owner``."""
    key = key.strip() if key else key
    if key and key.startswith("$"):
        name = key[2:-1] if key.startswith("${") and key.endswith("}") else key[1:]
        value = os.environ.get(name)
        if not value:
            raise ValueError(f"{owner}: api_key {key} names an environment variable that is not set")
        return value
    return key


class EndpointStats(BaseModel):
    """One endpoint's part of a run, for a run's summary (its ``endpoints``)."""

    base_url: str
    requests: int = 0  # requests sent to it (attempts, retries and failovers included)
    ok: int = 0  # answered 2xx
    rate_limited: int = 0  # answered 429
    errors: int = 0  # any other failure: connection, timeout, 5xx, 4xx
    rps: float = 0.0  # 2xx answers per second, from its first request to its last answer
    hedges: HedgeStats = Field(default_factory=HedgeStats)  # hedges sent to this endpoint, and how they ended
    state: EndpointState = "up"
    reason: str | None = None  # why it is out, when it is

    @field_validator("base_url", "reason")
    @classmethod
    def _no_secret(cls, text: str | None) -> str | None:
        return redact(text)  # the endpoints report is printed and put in a run's JSON: no URL credential, no echoed key


def endpoints_of(base_url: str | Sequence[str] | None, api_key: str | Sequence[str] | None,
                 endpoints: Iterable[Endpoint | Mapping[str, Any]] | None) -> list[Endpoint] | None:
    """The fleet a Judge's arguments describe, or None for the classic single endpoint.

    ``base_url`` and ``api_key`` may be lists: one key for all, or one per URL in the same order.
    """
    if endpoints is not None:
        if base_url:
            raise ValueError("give base_url or endpoints, not both")
        fleet = [e if isinstance(e, Endpoint) else Endpoint.model_validate(dict(e)) for e in endpoints]
        for endpoint in fleet:
            check_base_url(endpoint.base_url)
            remember_url(endpoint.base_url)
        if not fleet:
            raise ValueError("endpoints: give at least one endpoint")
        return _distinct(fleet)
    urls = [base_url] if isinstance(base_url, str) else [u for u in base_url or [] if u]
    keys = [api_key] if isinstance(api_key, str) else [k for k in api_key or [] if k]
    for url in urls:  # judge._redact: a URL without a scheme fails before any request; its credentials are masked
        check_base_url(url)
        remember_url(url)
    remember(*keys, os.environ.get("OPENAI_API_KEY"))
    if len(urls) <= 1 and len(keys) <= 1:
        return None
    if len(keys) > 1 and len(keys) != max(1, len(urls)):
        raise ValueError(f"{len(keys)} API keys for {max(1, len(urls))} base URL{'s' if len(urls) > 1 else ''}: "
                         "give one key for all endpoints or one per base URL, in the same order")
    paired = keys if len(keys) > 1 else [keys[0] if keys else None] * len(urls)
    fleet = _distinct([Endpoint(base_url=u, api_key=k) for u, k in zip(urls, paired)])
    return fleet if len(fleet) > 1 else None


def _distinct(fleet: list[Endpoint]) -> list[Endpoint]:
    """``fleet`` with each endpoint once: one URL given twice with one key is one server and one limit, and as
    "two endpoints" it would be hedged against itself. Said once per repeated URL."""
    seen: dict[tuple[str, str | None], int] = {}
    for endpoint in fleet:
        key = (endpoint.base_url.rstrip("/"), endpoint.api_key)
        seen[key] = seen.get(key, 0) + 1
    for (url, _), times in seen.items():
        if times > 1:
            log.warning("base_url %s is given %d times with the same key: one endpoint, not a fleet of %d (a fleet's "
                        "endpoints are other replicas, regions or keys)", redact_url(url), times, times)
    firsts: dict[tuple[str, str | None], Endpoint] = {}
    for endpoint in fleet:
        firsts.setdefault((endpoint.base_url.rstrip("/"), endpoint.api_key), endpoint)
    return list(firsts.values())


def member_id(base_url: str, api_key: str | None) -> str:
    """Names one endpoint for shared limiters: its URL, and a digest of its key (never the key)."""
    url = base_url.rstrip("/")
    return f"{url}#{hashlib.sha256(api_key.encode()).hexdigest()[:8]}" if api_key else url


def _new_client(options: Mapping[str, Any]) -> AsyncOpenAI:
    from openai import AsyncOpenAI  # here, not at import: `import judge` does not load openai

    return AsyncOpenAI(**options)


class Member:
    """One endpoint of a Judge at run time: its limiter, health, clients and counts."""

    def __init__(self, endpoint: Endpoint, api_key: str, limiter: RequestLimiter, client_options: Mapping[str, Any],
                 fast_wire: bool = True) -> None:
        self.endpoint = endpoint
        self.base_url = endpoint.base_url
        self.weight = endpoint.weight
        self.limiter = limiter
        self.breaker = EndpointBreaker()
        self.pending = 0  # requests routed here and not finished (waiting for a slot or in flight)
        self.answered = False  # any reply yet: until then its capacity is a guess
        self.latency = 0.0  # seconds per request, a moving average of its answers
        self.tracker = LatencyTracker()  # its recent 2xx latencies: when a request to it is hedged
        self.unarmed: list[tuple[_Race, int]] = []  # hedged races sent before the tracker could give a deadline
        self.hedge_policy: HedgePolicy | None = None  # set by a fleet that hedges
        self.stats = EndpointStats(base_url=endpoint.base_url)
        self._first_sent: float | None = None
        self._last_ok: float | None = None
        self._client_options = {**client_options, "base_url": endpoint.base_url, "api_key": api_key}
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncOpenAI] = weakref.WeakKeyDictionary()
        self._idle_client: AsyncOpenAI | None = None
        self.fast_wire = fast_wire
        # The fast wire of each loop (judge._fastwire), or the task opening it, or None (the SDK sends). A plain dict:
        # an aiohttp session holds its loop, so wires of closed loops are closed and dropped as new loops come.
        self.wires: dict[asyncio.AbstractEventLoop, FastWire | asyncio.Task[FastWire | None] | None] = {}

    # ---- clients: one per event loop (a connection pool belongs to the loop that opened it) ----

    def client(self) -> AsyncOpenAI:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if self._idle_client is None:
                self._idle_client = _new_client(self._client_options)
            return self._idle_client
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = _new_client(self._client_options)
        return client

    async def wire(self) -> FastWire | None:
        """The fast wire of the running loop for a non-streamed chat request (None: the SDK sends it)."""
        if not self.fast_wire:
            return None
        loop = asyncio.get_running_loop()
        found = self.wires.get(loop, _NOT_OPENED)
        if found is _NOT_OPENED:
            self._drop_dead_wires()
            found = self.wires[loop] = loop.create_task(open_wire(self.client()))
        if not isinstance(found, asyncio.Task):
            return found  # type: ignore[return-value]
        try:
            wire = await asyncio.shield(found)  # the first wave waits for one opening; a cancelled caller leaves it be
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # opening failed: this loop sends through the SDK
            log.debug("fast wire off for %s: %s: %s", self.base_url, type(exc).__name__, exc)
            wire = None
        if self.wires.get(loop) is found:
            self.wires[loop] = wire
        return wire

    def _drop_dead_wires(self) -> None:
        for loop in [loop for loop in self.wires if loop.is_closed()]:
            wire = self.wires.pop(loop)
            if isinstance(wire, FastWire):
                wire.close_now()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        wire = self.wires.pop(loop, None)
        if isinstance(wire, asyncio.Task):
            wire.cancel()
            wire = (await asyncio.gather(wire, return_exceptions=True))[0]
        if isinstance(wire, FastWire):
            await wire.aclose()
        self._drop_dead_wires()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.close()
        for other_loop in list(self._clients):
            if other_loop.is_closed():
                self._clients.pop(other_loop, None)
        if self._idle_client is not None:
            idle, self._idle_client = self._idle_client, None
            await idle.close()

    # ---- what the router reads ------------------------------------------------------------------

    def capacity(self, guess: float | None) -> float:
        """Requests per second this endpoint takes now: its limiter's rate (told or learnt) times its weight."""
        pacer = getattr(self.limiter, "pacer", None)
        rate = None
        if pacer is not None and (self.answered or pacer.ceiling is not None):
            rate = pacer.rate()
        elif guess is not None:
            return guess * self.weight  # not heard from yet: as fast as the others look
        if rate is None:
            ceiling = getattr(self.limiter, "rps", None)
            rate = ceiling if ceiling else _UNPACED
        return rate * self.weight

    def pacing(self) -> Pacing:
        return self.limiter.pacing()

    @property
    def first_sent(self) -> float | None:
        """When this endpoint's first request went (monotonic), or None."""
        return self._first_sent

    # ---- what the sender reports ----------------------------------------------------------------

    def sent(self) -> None:
        self.stats.requests += 1
        if self._first_sent is None:
            self._first_sent = time.monotonic()

    def replied(self, status: int, seconds: float = 0.0) -> None:
        """A reply with an HTTP status (2xx, 429 or another error status) after ``seconds``."""
        self.latency = seconds if not self.answered else 0.9 * self.latency + 0.1 * seconds
        self.answered = True
        if 200 <= status < 300:
            self.tracker.add(seconds)
            if self.unarmed and self.hedge_policy is not None:
                self.arm_waiting(self.hedge_policy)
            self.stats.ok += 1
            self._last_ok = time.monotonic()
        elif status == 429:
            self.stats.rate_limited += 1
        else:
            self.stats.errors += 1

    def arm_waiting(self, policy: HedgePolicy) -> None:
        """The tracker can give deadlines now: arm the races sent before, each from its own send."""
        after = self.tracker.hedge_after(policy)
        if after is None:
            return
        waiting, self.unarmed = self.unarmed, []
        for race, attempt in waiting:
            if attempt == race.attempt and not race.outcome.done():
                race.arm(attempt, after - (race.loop.time() - race.sent_at))

    def failed(self) -> None:
        """No HTTP answer (connection refused or reset, timeout) or a malformed body."""
        self.stats.errors += 1

    def unsent(self) -> None:
        """The request counted by :meth:`sent` failed in this process (judge._retry.is_local): it was no request."""
        self.stats.requests -= 1

    def snapshot(self) -> EndpointStats:
        stats = self.stats.model_copy(update={"hedges": self.stats.hedges.model_copy()})
        if self._first_sent is not None and self._last_ok is not None and self._last_ok > self._first_sent:
            stats.rps = round(stats.ok / (self._last_ok - self._first_sent), 3)
        stats.state, stats.reason = self.breaker.state_now(), self.breaker.reason
        return stats


class Router:
    """Picks the endpoint each request goes to; see the module docstring."""

    def __init__(self, members: Sequence[Member]) -> None:
        self.members = list(members)
        # Requests waiting unrouted (every queue past its horizon), oldest first: only the oldest may be
        # routed while others wait, so a request that arrives later never overtakes one that waited.
        self._waiting: deque[asyncio.Event] = deque()
        self.wakeups = 0  # times a request waiting unrouted woke to look again (benchmarks/fleet_cpu.py)

    def queued_ahead(self, turn: asyncio.Event | None) -> bool:
        """Whether a request that waited unrouted longer than ``turn`` (None: a newcomer) is still waiting."""
        return bool(self._waiting) and self._waiting[0] is not turn

    async def wait_turn(self, turn: asyncio.Event | None, seconds: float) -> asyncio.Event:
        """Wait unrouted, in line. The oldest waiting request (the head of the line) wakes when a
        request finishes, or after ``seconds`` (an endpoint's pace may have changed); the others sleep
        until they are the head (the one before them was routed or gave up): no timer, no polling, so
        a request wakes about once per request that frees a place, not every few hundred ms."""
        created = turn is None
        if turn is None:
            turn = asyncio.Event()
            self._waiting.append(turn)
        turn.clear()
        try:
            if self._waiting[0] is turn:
                try:
                    await asyncio.wait_for(turn.wait(), seconds)
                except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                    pass
            else:
                await turn.wait()
        except BaseException:
            # Cancelled (a hedged race's loser, a run stopping) before the caller holds the new turn: a
            # turn left in line would be a head nobody wakes, and every request behind it would wait for ever.
            if created:
                self.leave(turn)
            raise
        self.wakeups += 1
        return turn

    def leave(self, turn: asyncio.Event | None) -> None:
        """``turn`` is routed (or gave up): the next in line looks again at once."""
        if turn is None:
            return
        try:
            self._waiting.remove(turn)
        except ValueError:
            pass
        self.finished()

    def finished(self) -> None:
        """A request routed to some endpoint is over: the oldest waiting request looks again."""
        if self._waiting:
            self._waiting[0].set()

    def pick(self, tried: Sequence[Member] = ()) -> tuple[Member, float] | None:
        """The usable endpoint with the shortest expected wait, not among ``tried``, and that wait in
        seconds; None when every one is out or tried. :meth:`take` commits the request to it.

        An endpoint out of the fleet is offered again (one probe request) once its back-off is over.
        """
        now = time.monotonic()
        heard = [m.capacity(None) for m in self.members if m.answered]
        guess = sum(heard) / len(heard) if heard else None
        best: Member | None = None
        best_wait = 0.0
        held: tuple[Member, float] | None = None  # the best of those that take no more now (Router.full)
        for member in self.members:
            if member in tried or not member.breaker.usable(now):
                continue
            wait = (member.pending + 1) / member.capacity(guess)
            if self.full(member):
                if held is None or wait < held[1]:
                    held = member, wait
                continue
            if best is None or wait < best_wait:
                best, best_wait = member, wait
        if best is None:
            return held  # the caller waits unrouted (a hedge goes to it all the same)
        return best, best_wait

    @staticmethod
    def take(member: Member) -> bool:
        """Commit a request to ``member``; True when it is the probe of an endpoint out of the fleet."""
        member.pending += 1
        return member.breaker.taken(time.monotonic())

    @staticmethod
    def horizon(member: Member) -> float:
        """How long a request may expect to queue at an endpoint before it is better held back.

        A request committed to a long queue stays there even when another endpoint frees up (or
        turns out faster once it answers): past this, the request waits unrouted and asks again.
        Two round trips plus a second: enough to keep every endpoint busy at its rate.
        """
        return _HORIZON_S + 2 * member.latency

    @staticmethod
    def full(member: Member) -> bool:
        """Whether ``member`` takes no more requests now: the rest wait unrouted, for whichever endpoint frees first.

        An endpoint takes at most its concurrency: a request committed past it would queue in that
        endpoint's limiter behind its slowest requests (a heavy tail's stragglers) while another
        endpoint frees up. And before its first reply an endpoint's rate is unknown (every one
        looks unpaced): a first wave routed by expected wait would queue alike at a 10 and a 40
        req/s endpoint and meet each one's bucket with the whole of its concurrency. So an
        endpoint takes one request until it answers, or for ``FIRST_REPLY_WAIT_S`` (it may be slow,
        not limited).
        """
        if member.pending >= member.limiter.concurrency:
            return True
        if member.answered:
            return False
        first = member.first_sent
        return member.pending >= 1 and (first is None or time.monotonic() - first < FIRST_REPLY_WAIT_S)

    def all_down(self) -> bool:
        """Whether every endpoint is out of the fleet (a probe in flight counts as out)."""
        return all(m.breaker.down for m in self.members)

    def all_broken(self) -> bool:
        """Whether every endpoint is out and has failed ``_PROBES_TO_GIVE_UP`` probes since: an outage of
        every endpoint for a few seconds (1 s, then 2 s of back-off), not a blip they all met at once."""
        return all(m.breaker.down and m.breaker.failed_probes >= _PROBES_TO_GIVE_UP for m in self.members)

    def next_probe_in(self) -> float:
        """Seconds until some endpoint out of the fleet may be probed again."""
        return min(m.breaker.backoff_left() for m in self.members)


class Fleet:
    """The transport: one judge model's endpoints, and :meth:`send` for one attempt of a request.

    One endpoint is a fleet of one (nowhere to fail over to, but its health is still reported);
    several are routed by :class:`Router` with failover. Each endpoint keeps its own limiter,
    holds (a 429's Retry-After holds the endpoint that said it), breaker and counts.
    """

    def __init__(self, members: Sequence[Member], model: str, retry: RetryPolicy,
                 hedge: bool | HedgePolicy | Mapping[str, Any] | None = None) -> None:
        self.members = list(members)
        self.router = Router(self.members) if len(self.members) > 1 else None
        self.model = model
        self.retry = retry
        # Hedging needs another endpoint to ask: one endpoint never hedges, whatever the setting.
        self.hedge = HedgePolicy.of(hedge)
        self.hedging = self.router is not None and self.hedge.enabled and self.hedge.max_extra > 0
        self.hedge_budget = HedgeBudget(self.hedge.max_extra)
        self.hedge_stats = HedgeStats()
        for member in self.members:
            member.hedge_policy = self.hedge if self.hedging else None

    @classmethod
    def build(cls, endpoints: Sequence[Endpoint], *, model: str, retry: RetryPolicy, limiter: RequestLimiter,
              client_options: Mapping[str, Any], configured: bool,
              hedge: bool | HedgePolicy | Mapping[str, Any] | None = None, fast_wire: bool = True) -> Fleet:
        """The members of ``endpoints``, each with its key and its own limiter (modelled on ``limiter``).

        ``configured``: a fleet given as endpoints (a file), whose ``$NAME`` keys are read from the
        environment; a key given as base_url/api_key arguments (the command line) is taken as it is.
        ``fast_wire``: non-streamed chat requests go over :mod:`gradekit.judge._fastwire` where it can keep
        what the SDK gives.
        """
        members = []
        for endpoint in endpoints:
            key = (endpoint.resolved_key() if configured else endpoint.api_key) or os.environ.get("OPENAI_API_KEY")
            if not key:
                if "api.openai.com" in endpoint.base_url:
                    raise ValueError("no API key: set OPENAI_API_KEY or pass `api_key` (or point `base_url` at a local server)")
                key = "not-needed"
            own = limiter if len(endpoints) == 1 and endpoint.rps is None and endpoint.tpm is None else \
                endpoint_limiter(limiter, member_id(endpoint.base_url, key), rps=endpoint.rps, tpm=endpoint.tpm)
            # One SDK client per event loop and endpoint (see Member.client): callers such as Ark's
            # harness (asyncio.run per sample), sync wrappers and notebooks use a new loop per call.
            members.append(Member(endpoint, key, own, client_options, fast_wire))
        return cls(members, model, retry, hedge)

    @property
    def limiter(self) -> RequestLimiter:
        """The first endpoint's limiter (a single endpoint's: the one every judge of the process shares)."""
        return self.members[0].limiter

    @property
    def concurrency(self) -> int:
        """Requests the fleet may have in flight: its limiters' caps, summed."""
        return sum(m.limiter.concurrency for m in self.members)

    def endpoints(self) -> list[EndpointStats]:
        return [member.snapshot() for member in self.members]

    def hedges(self) -> HedgeStats:
        """Hedges sent so far over the fleet, won and lost (all 0 when it does not hedge)."""
        return self.hedge_stats.model_copy()

    @property
    def held_seconds(self) -> float:
        """Seconds the endpoints' limiters held requests, summed (a limiter that does not count adds 0)."""
        return sum(float(getattr(m.limiter, "held_seconds", 0.0) or 0.0) for m in self.members)

    def pacing(self) -> Pacing:
        """One endpoint's limiter's pacing; for several, the summed rate of those up."""
        if self.router is None:
            return self.limiter.pacing()
        pacings = [m.pacing() for m in self.members if m.breaker.state_now() == "up"] or [m.pacing() for m in self.members]
        rates = [p.rps for p in pacings]
        total = None if any(r is None for r in rates) else round(sum(r for r in rates if r is not None), 3)
        return Pacing(mode=pacings[0].mode, rps=total)

    def client(self) -> AsyncOpenAI:
        return self.members[0].client()

    async def aclose(self) -> None:
        for member in self.members:
            await member.aclose()

    def before_retry(self, exc: BaseException | None) -> None:
        """A retry is about to wait after ``exc``: a single endpoint is held for a 429's Retry-After
        (several hold the endpoint that answered 429 as it answers, :meth:`_send_to`)."""
        wait = retry_after_seconds(exc, cap=self.retry.rate_limit_budget)
        if wait and self.router is None:
            self.limiter.hold(wait)

    async def send(self, request: dict[str, Any], estimate: int, breaker: Breaker | None,
                    route: Route = "chat") -> tuple[dict[str, Any], Usage]:
        """One attempt: the completion and what the attempt billed (every request it sent). A fleet of several
        routes it (:class:`Router`) and, when the endpoint it went to fails the way a broken endpoint fails,
        sends it to another at once (no retry is spent): the row is answered once, by whichever endpoint
        could. A hedging fleet races a straggler against a second request to another endpoint (:meth:`_race`).
        A failed attempt's exception carries what it billed (``spent_by``)."""
        router = self.router
        if router is None:
            # One endpoint: nowhere to fail over to, but its health is still reported (``endpoints``: state, reason).
            member = self.members[0]
            try:
                answered = await self._send_to(member, False, request, estimate, breaker, route)
            except Failed:
                raise
            except Exception as exc:
                failure = breaker_failure(exc)
                if failure is not None:
                    member.breaker.failure(*failure)
                elif not is_local(exc):  # it answered; a failure of this process says nothing of the endpoint
                    member.breaker.success()
                raise
            member.breaker.success()
            return answered
        if not self.hedging:
            return await self._routed(router, request, estimate, breaker, route)
        return await self._race(request, estimate, breaker, route)

    async def _race(self, request: dict[str, Any], estimate: int, breaker: Breaker | None,
                    route: Route) -> tuple[dict[str, Any], Usage]:
        """One attempt, hedged: the request goes out; if it is still unanswered at its endpoint's hedge
        deadline, the same request goes once to another endpoint, and the first answer wins (:class:`_Race`)."""
        assert self.router is not None
        race = _Race(self, asyncio.get_running_loop())
        race.first = race.loop.create_task(self._routed(self.router, request, estimate, breaker, route, race=race))
        race.first.add_done_callback(race.settle)
        race.args = (request, estimate, breaker, route)
        try:
            completion = await race.outcome
        except BaseException as exc:
            await race.close()
            raise carrying(exc, race.spent)  # both contenders' requests, the loser's included
        await race.close()
        return completion, race.spent

    async def _routed(self, router: Router, request: dict[str, Any], estimate: int,
                      breaker: Breaker | None, route: Route, *, race: _Race | None = None,
                      avoid: Member | None = None) -> tuple[dict[str, Any], Usage]:
        """One attempt over the fleet: routed, and failed over to another endpoint when the one it went to
        is broken. ``race``: the attempt is the first of a hedged race (its sends arm the hedge deadline);
        ``avoid``: the attempt is the hedge of the request at that endpoint, which it never goes to.
        In a race, what it billed goes to the race's tally too (a cancelled loser's request was sent)."""
        tried: list[Member] = []
        last: BaseException | None = None
        turn: asyncio.Event | None = None  # this request's place in line while it waits unrouted
        spent = NO_USAGE  # every endpoint this attempt went to
        try:
            while True:
                picked = router.pick(tried if avoid is None else [*tried, avoid])
                if picked is None:
                    if avoid is not None:
                        raise _NoHedge()  # no other endpoint takes it now: the first request alone decides
                    if router.all_broken():
                        raise self._down(breaker)
                    if router.all_down():
                        # Every endpoint is out, but not for long yet: wait for the next probe's answer.
                        if breaker is not None and breaker.tripped is not None:
                            raise Failed(breaker.tripped.kind, f"not sent: the run stopped because {breaker.tripped.describe()}")  # type: ignore[arg-type]
                        await asyncio.sleep(max(_ALL_OUT_POLL_S, router.next_probe_in()))
                        tried = []
                        continue
                    if last is None:  # every endpoint was skipped (taken out while this waited) and one is back: route again
                        tried = []
                        continue
                    raise last  # every endpoint in the fleet failed this attempt: the retry policy decides
                member, wait = picked
                if (late := wait > (horizon := router.horizon(member))) or router.queued_ahead(turn) \
                        or (avoid is None and router.full(member)):
                    # Every endpoint's queue is long: wait unrouted, so the request goes where it can be sent soonest,
                    # in line behind those that waited before it (a newcomer never overtakes them).
                    turn = await router.wait_turn(turn, min(wait - horizon, 0.25) if late else 0.25)
                    continue
                router.leave(turn)
                turn = None
                probe = router.take(member)
                try:
                    try:
                        completion, used = await self._send_to(member, probe, request, estimate, breaker, route,
                                                               race=race, hedge=avoid is not None)
                    except BaseException as exc:
                        spent += spent_by(exc)
                        raise
                    spent += used
                except _Skipped:
                    tried.append(member)
                    continue
                except Failed:
                    raise
                except Exception as exc:
                    if is_local(exc):
                        raise  # this process failed, not the endpoint: its health is unchanged
                    failure = breaker_failure(exc)
                    if failure is None:
                        member.breaker.success()  # it answered (a 429, a 400 about the request): alive
                        raise
                    if member.breaker.failure(*failure):
                        log.warning("%s taken out of the fleet: %s (probed again in %.1f s)", member.base_url,
                                    member.breaker.reason, member.breaker.backoff_left())
                    tried.append(member)
                    last = exc
                    continue
                finally:
                    member.pending -= 1
                    router.finished()
                    if probe:
                        member.breaker.probing = False  # answered or not, the probe is over
                member.breaker.success()
                return completion, spent
        except BaseException as exc:
            raise carrying(exc, spent)
        finally:
            router.leave(turn)
            if race is not None:
                race.spent += spent

    def _down(self, breaker: Breaker | None) -> Failed:
        """Every endpoint of the fleet is out: the run's breaker trips, naming each and why."""
        reasons = tuple(f"{m.base_url}: {m.breaker.reason or 'out'}" for m in self.members)
        first = self.members[0].breaker.reason or "server_error: out"
        kind, _, example = first.partition(": ")
        trip = Trip(kind if kind in ("server_error", "timeout", "bad_request") else "server_error", example,
                    f"every endpoint of the fleet is out ({len(reasons)})", ", ".join(m.base_url for m in self.members),
                    self.model, endpoints=reasons)
        if breaker is not None:
            breaker.trip(trip)
        return Failed(trip.kind, f"not sent: {trip.describe()}")  # type: ignore[arg-type]

    async def _send_to(self, member: Member, probe: bool, request: dict[str, Any], estimate: int,
                       breaker: Breaker | None, route: Route = "chat", *, race: _Race | None = None,
                       hedge: bool = False) -> tuple[dict[str, Any], Usage]:
        """One request to one endpoint: a limiter slot, the request, and the checks a well-formed completion passes.
        Returns the completion and its Usage (one request and the reply's tokens); once the request is sent, its
        failure carries one request (``spent_by``)."""
        limiter = member.limiter
        async with limiter.slot(estimate):
            # Checked once the slot is ours: a request queued for a slot when the breaker tripped is not sent,
            # and neither is the retry of a row in flight.
            if breaker is not None and breaker.tripped is not None:
                raise Failed(breaker.tripped.kind, f"not sent: the run stopped because {breaker.tripped.describe()}")  # type: ignore[arg-type]
            if self.router is not None and member.breaker.down and not probe:
                raise _Skipped()  # taken out while this one waited for its slot: another endpoint sends it
            member.sent()
            if hedge:
                member.stats.hedges.sent += 1
                self.hedge_stats.sent += 1
                if race is not None:
                    race.hedge_member = member
            elif self.hedging:
                self.hedge_budget.earned()
                if race is not None:
                    race.armed(member)
            wire = None
            if route == "chat" and not request.get("stream") and member.fast_wire:
                wire = member.wires.get(asyncio.get_running_loop(), _NOT_OPENED)  # the loop's wire, once open: no await
                if wire is _NOT_OPENED or isinstance(wire, asyncio.Task):
                    wire = await member.wire()
            sent_at = time.monotonic()
            clock = row_clock()
            try:
                sending = post_native(member.client(), request, route) if route in NATIVE_ROUTES else \
                    post(member.client(), request, route, wire)
                raw, completion = await _within_row_deadline(sending, member.client(), clock, route)
            except openai.APIStatusError as refused:
                carrying(refused, Usage(requests=1))  # it was sent and answered: a request
                if flex_capacity(refused, request):
                    raise  # flex has no capacity now: not a rate limit, so the pacer, the hold and the 429 count learn nothing
                member.replied(refused.status_code, time.monotonic() - sent_at)
                # A 429 (with or without rate-limit headers) teaches the limiter the provider's limit.
                limiter.observe(refused.status_code, refused.response.headers, sent_at=sent_at, tokens=estimate)
                if self.router is not None and isinstance(refused, openai.RateLimitError):
                    wait = retry_after_seconds(refused, cap=self.retry.rate_limit_budget)
                    if wait:
                        limiter.hold(wait)  # this endpoint only: the others keep sending
                raise
            except Exception as exc:
                if is_local(exc):  # failed here, not at the endpoint: no request, no error of the endpoint's
                    member.unsent()
                    raise
                member.failed()
                raise carrying(exc, Usage(requests=1))
            except BaseException as exc:  # cancelled on the wire (a hedge race's loser): the request was sent
                raise carrying(exc, Usage(requests=1))
            finally:
                if clock is not None and not hedge:  # a hedge runs beside the first request: the row's time is the first's
                    clock.spend(time.monotonic() - sent_at)
        if not isinstance(completion, dict):
            member.failed()
            raise carrying(ValueError("completion body is not a JSON object"), Usage(requests=1))  # a malformed 200: transient
        member.replied(raw.status_code, time.monotonic() - sent_at)
        spent = completion.get("usage") or {}
        used = reply_usage(spent, completion.get("service_tier") or request.get("service_tier"))
        try:
            limiter.observe(raw.status_code, raw.headers, sent_at=sent_at, tokens=int(spent.get("total_tokens") or 0) or estimate)
            await limiter.settle(estimate, int(spent.get("total_tokens") or 0))
            check_body(completion, request, route)
        except BaseException as exc:
            raise carrying(exc, used)  # answered and billed, but no completion to use
        return completion, used


async def _within_row_deadline(sending: Any, client: Any, clock: RowClock | None, route: Route) -> Any:
    """The attempt, cut at what is left of the row's deadline (judge._deadline) when that is less than the request's own
    timeout; a cut attempt fails as a request past its timeout does (``APITimeoutError``), so the retry policy and the
    row's error read it the same way."""
    left = clock.left() if clock is not None else None
    whole = whole_request_seconds(client)
    if left is None or (whole is not None and left >= whole):
        return await sending
    try:
        return await asyncio.wait_for(sending, max(left, 0.0))
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        raise openai.APITimeoutError(request=sdk_http().Request("POST", route_url(client, route))) from None


class _Race:
    """One hedged attempt: the first request, the hedge if its deadline passes, and the answer that came first.

    The hedge deadline is armed when the first request reaches the wire (again if it fails over to
    another endpoint) on the loop's one :class:`~judge._hedge.Deadlines`; at the deadline the hedge
    goes to another endpoint if the fleet's hedge budget has credit. The first success wins; the
    other is cancelled (its HTTP request closed). A failure waits for the other contender, if any;
    when both fail, the first request's error is the attempt's.
    """

    __slots__ = ("fleet", "loop", "outcome", "first", "hedge", "args", "member", "sent_at", "attempt", "winner", "error",
                 "hedge_member", "spent")

    def __init__(self, fleet: Fleet, loop: asyncio.AbstractEventLoop) -> None:
        self.fleet = fleet
        self.loop = loop
        self.outcome: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.first: asyncio.Task[tuple[dict[str, Any], Usage]] | None = None
        self.hedge: asyncio.Task[tuple[dict[str, Any], Usage]] | None = None
        self.args: tuple[Any, ...] = ()
        self.member: Member | None = None  # where the first request is now
        self.sent_at = 0.0
        self.attempt = 0
        self.winner: asyncio.Task[tuple[dict[str, Any], Usage]] | None = None
        self.error: BaseException | None = None
        self.hedge_member: Member | None = None  # where the hedge was sent, once it is
        self.spent = NO_USAGE  # what both contenders billed, each adding its own as it ends

    def armed(self, member: Member) -> None:
        """The first request reached the wire at ``member``: its hedge deadline starts now.

        Sent before the endpoint has enough answers to say when (a process's first wave), it waits
        in the endpoint's ``unarmed`` list and gets its deadline, counted from its send, once it has.
        """
        self.member, self.sent_at = member, self.loop.time()
        self.attempt += 1
        after = member.tracker.hedge_after(self.fleet.hedge)
        if after is None:
            if len(member.unarmed) >= 1024:  # an endpoint that has not answered enough yet: keep only races still running
                member.unarmed = [(r, a) for r, a in member.unarmed if not r.outcome.done()]
            member.unarmed.append((self, self.attempt))
        else:
            self.arm(self.attempt, after)

    def arm(self, attempt: int, after: float) -> None:
        deadlines(self.loop).add(max(0.0, after), lambda: self.due(attempt))

    def due(self, attempt: int) -> None:
        """The deadline of the first request's send number ``attempt`` passed."""
        if self.outcome.done() or self.hedge is not None or attempt != self.attempt:
            return
        fleet, member = self.fleet, self.member
        assert fleet.router is not None and member is not None
        # The endpoint's deadline may have grown since this one was set (its first answers are its fastest): look again.
        after = member.tracker.hedge_after(fleet.hedge)
        late = self.loop.time() - self.sent_at
        if after is not None and late < after * 0.99:
            self.arm(attempt, after - late)
            return
        if fleet.router.pick([member]) is None or not fleet.hedge_budget.spend():
            return
        self.hedge = self.loop.create_task(fleet._routed(fleet.router, *self.args, race=self, avoid=member))
        self.hedge.add_done_callback(self.settle)

    def settle(self, task: asyncio.Task[tuple[dict[str, Any], Usage]]) -> None:
        if self.outcome.done():
            return
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        if error is None:
            self.winner = task
            self.outcome.set_result(task.result()[0])  # the usage is the race's: both contenders add theirs to ``spent``
            return
        if task is self.first:
            self.error = error
        other = self.hedge if task is self.first else self.first
        if other is not None and not other.done():
            return  # the other may still answer
        self.outcome.set_exception(self.error or error)

    async def close(self) -> None:
        """Cancel the contender still running (closing its request), wait for it, and count the hedge."""
        tasks = [t for t in (self.first, self.hedge) if t is not None]
        running = [t for t in tasks if not t.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        for task in tasks:  # every contender's outcome is read (none logged as "never retrieved")
            if not task.cancelled():
                task.exception()
        if self.hedge is None:
            return
        fleet, hedge_member = self.fleet, self.hedge_member
        if hedge_member is None:
            fleet.hedge_budget.refund()  # launched, never on the wire: it cost nothing
            return
        if self.winner is self.hedge:
            fleet.hedge_stats.won += 1
            hedge_member.stats.hedges.won += 1
            if self.first in running and self.member is not None:
                # The first request's latency is at least this: kept, so the tracker is not left with the fast ones only.
                self.member.tracker.add(self.loop.time() - self.sent_at)
        else:
            fleet.hedge_stats.lost += 1
            hedge_member.stats.hedges.lost += 1
