"""Self-pacing: the request rate a provider allows, learnt from its replies when nobody told us.

A :class:`Pacer` is plain state with an injectable clock, so every limiter backend can hold one:
the in-process :class:`~judge.Limiter` keeps it in memory, the Redis limiter publishes its rate
to the other processes, a Ray actor can keep it in the actor. The backend calls
:meth:`Pacer.observe` with every reply (status and headers) and asks :meth:`Pacer.rate` before
each request; the pacing itself (a GCRA schedule) is the backend's.

Two ways to learn, chosen by what the server says:

- ``headers``: OpenAI-compatible servers send ``x-ratelimit-limit-requests`` (per minute),
  ``x-ratelimit-remaining-requests`` and ``x-ratelimit-reset-requests`` (a duration such as
  ``120ms``, ``1s``, ``6m0s``), and the ``-tokens`` variants. The rate is the limit's per-second
  share plus what remains above a small reserve spread over a couple of seconds, so requests
  are spread out instead of emptying the bucket and then waiting; a falling ``remaining``
  (another job on the same key) slows us below the limit until it recovers.
- before any reply: unpaced, so a run starts at its concurrency limit (no slow start); the first
  reply's headers, or its first 429, set the pace.
- ``aimd``: no headers. Unpaced until the first 429 (a server that never refuses is not slowed).
  The 429s of one *flight* are one congestion event, as TCP takes one loss per round trip: a
  flight is what was sent from the event's first 429 until one round trip later (the smoothed
  time an accepted request takes; before any request was accepted, until the first one is), so a
  first wave of 64 against a bucket of 20 is one event, not 44. At the event the rate drops at
  once (to 0.9 of what was accepted of late, or a safe start when nothing was); once the flight is
  answered, the rate the server accepted while it refused (requests accepted among those sent in
  the second before the event, per second) is the new estimate. After the first event the rate
  doubles every half second while nothing is refused (the first flight can only show a burst);
  after the next, it climbs additively. Retry-After is honoured by the limiter's hold, separately.

Anthropic's ``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset`` (and the
``-tokens-`` family) are read the same way; their reset is an RFC 3339 time, not a duration.

Headers can lie (a gateway that forwards another key's headers, a stale limit): when more
replies are accepted within a minute than twice the stated per-minute limit allows, each such
reply multiplies the header rate by 1.25 (trust falls as the contradiction grows; not beyond
twice the rate actually used), and each 429 halves that factor again (down to the headers' own
rate). Token headers are weighed the same way: more tokens accepted within a minute than twice the
stated per-minute token limit (plus one request's) contradict them, and the token family's rate is
then the larger of its own and the rate replies are accepted at, times its own factor (a claimed
1-token-per-minute budget pinned a run whose every request succeeded at 0.2 requests/s).

A told limit (``limits.rps``) is a ceiling: headers may lower the rate, never raise it, and without
headers a told limit stays fixed (mode ``fixed``).
"""

from __future__ import annotations

import datetime
import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel

PacingMode = Literal["headers", "aimd", "fixed"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

START_RPS = 5.0  # the safe rate a server without headers is first paced at
# How long the rest of a first wave waits for the first reply that tells the pace (a shared limiter's first
# request, a fleet endpoint's first request); past it the reply is a model at work, not a refusal.
FIRST_REPLY_WAIT_S = 2.0
MIN_RPS = 0.2  # never slower than one request per five seconds
MAX_RPS = 100_000.0
_DOUBLING_S = 0.5  # slow start doubles the rate this often while nothing is refused
_WINDOW_S = 2.0  # accepted replies are counted over this window when a 429 cuts the rate
_FLIGHT_WINDOW_S = 1.0  # the accepted rate of a congestion event: requests accepted among those sent this long before it
_ESTIMATE_SHARE = 0.97  # of that rate: a little below it, so the server's bucket refills while the pace climbs again
_KEPT_S = 120.0  # accepted sends are remembered this long (a flight of slow judgements takes a while to be answered)
_SPREAD_S = 2.0  # what remains above the reserve is spread over this many seconds
_HEADER_SHARE = 0.995  # of the per-second limit: the reserve below, not this share, keeps us off its edge
_DOUBT_STEP = 1.25  # the header rate's factor grows by this with each reply that contradicts the headers
_MAX_DOUBT = 1e6
_MINUTE_S = 60.0


class Pacing(BaseModel):
    """How a run paced itself, for its summary: ``mode`` and the rate held at the end (None: no limit)."""

    mode: PacingMode
    rps: float | None = None


class SharedPace:
    """What a limiter shared by several processes (Redis, Ray) does with a reply: its :class:`Pacer` learns
    from it, and a learnt rate that changed goes to the others through :meth:`_share` (fixed or unpaced: nothing).

    ``_ready_to_share`` may refuse (no event loop to publish from): that change is then not shared, nor tried again.
    """

    pacer: Pacer
    _published_version: int = 0  # the pacer's version last handed on

    def observe(self, status: int, headers: Mapping[str, str], *, sent_at: float | None = None, tokens: int = 0) -> None:
        """Learn from one reply (judge._pacing); a changed learnt rate goes to every process sharing the limit."""
        self.pacer.observe(status, headers, sent_at=sent_at, tokens=tokens)
        if self.pacer.version == self._published_version:
            return
        self._published_version = self.pacer.version
        if not self._ready_to_share():
            return
        pacing = self.pacer.pacing()
        if pacing.mode == "fixed" or pacing.rps is None:
            return
        self._share(pacing.mode, self.pacer.rate())

    def pacing(self) -> Pacing:
        return self.pacer.pacing()

    def _ready_to_share(self) -> bool:
        return True

    def _share(self, mode: PacingMode, rps: float | None) -> None:
        raise NotImplementedError


def parse_duration(text: str | None) -> float | None:
    """Seconds in an OpenAI rate-limit duration (``120ms``, ``1s``, ``6m0s``, ``1h2m3.5s``) or a bare number."""
    if text is None:
        return None
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def _reset_seconds(text: str | None, wall: float) -> float | None:
    """Seconds until a bucket is full: an OpenAI duration (``6m0s``) or an RFC 3339 time (Anthropic)."""
    seconds = parse_duration(text)
    if seconds is not None or text is None:
        return seconds
    try:
        at = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, at.timestamp() - wall)


def _family(headers: Mapping[str, str], what: str, part: str) -> str | None:
    """One rate-limit header, OpenAI's (``x-ratelimit-limit-requests``) or Anthropic's
    (``anthropic-ratelimit-requests-limit``)."""
    value = headers.get(f"x-ratelimit-{part}-{what}")
    return value if value is not None else headers.get(f"anthropic-ratelimit-{what}-{part}")


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number >= 0 else None


def _stated(headers: Mapping[str, str], what: str, part: str) -> float | None:
    return _number(_family(headers, what, part))


def _bucket_rate(headers: Mapping[str, str], what: str, *, told: bool = False, wall: float | None = None) -> float | None:
    """Units per second to send at from one family of headers (``requests`` or ``tokens``).

    Under a told limit (``told``) only the stated limit counts: a told pace keeps the bucket near
    empty by design, and reading that as "another job is eating it" would slow a run the user paced.
    """
    limit = _stated(headers, what, "limit")
    if not limit:
        return None
    if told:
        return limit / 60
    share = limit / 60 * _HEADER_SHARE  # OpenAI states limits per minute
    remaining = _stated(headers, what, "remaining")
    if remaining is None:
        return share
    # Keep a reserve for the requests already in flight; spend what is above it over a couple of
    # seconds, and below it send slower than the limit until the bucket refills.
    reset = _reset_seconds(_family(headers, what, "reset"), time.time() if wall is None else wall)
    # The reset time is when the bucket is full again: what remains plus what refills until then is
    # its size. Half a second of the limit is the reserve, but never more than half the bucket.
    size = remaining + reset * share if reset is not None else None
    reserve = max(1.0, min(share * 0.5, size * 0.5 if size else share * 0.5))
    return max(share * 0.5, share + (remaining - reserve) / _SPREAD_S)


class Pacer:
    """The learnt request rate of one provider limit; see the module docstring.

    Args:
        ceiling: a told limit in requests per second (``limits.rps``); the rate never exceeds it.
        adapt: False (``limits.adapt``) keeps the told limit, or no pacing at all, whatever the replies say.
        clock: seconds, monotonic; tests pass their own.
    """

    def __init__(self, ceiling: float | None = None, *, adapt: bool = True,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.ceiling, self.adapt, self._clock, self._wall = ceiling, adapt, clock, wall
        self._doubt = 1.0  # how far above the headers' rate the replies have shown the server lets us go
        self._token_doubt = 1.0  # the same for the token headers
        self._accepted_rps = 0.0  # replies accepted per second of late (the rate in use)
        self._ok: deque[tuple[float, int]] = deque()  # 2xx replies of the last minute and their tokens, to check the headers against
        self._recent_ok: deque[float] = deque()  # ... and of the last couple of seconds: the rate in use
        self._mode: PacingMode = "fixed" if ceiling is not None or not adapt else "aimd"
        self._learnt: float | None = None  # None: nothing learnt yet
        self._slow_start = True
        self._started: float | None = None
        self._changed = 0.0  # when the AIMD rate last moved
        self._cut = -1.0  # when the last congestion event began (its first 429)
        self._flight_end: float | None = None  # 429s of requests sent before this are that event's (None: no event yet)
        self._estimating = False  # the event's flight is not answered yet: its accepted rate is still to be read
        self._floor = 0.0  # ... and the estimate is at least half the rate the event met
        self._flight_accepted = 0  # requests accepted among those sent in the window before the event
        self._srtt: float | None = None  # smoothed seconds from send to an accepted reply: one round trip
        self._accepted: deque[float] = deque()
        self._accepted_sends: deque[float] = deque()  # when each accepted request was sent, for a flight's estimate
        self._tokens_per_request = 0.0
        self._heard = False  # no reply yet
        self.version = 0  # bumped whenever the learnt rate changes, so a backend knows to publish it
        self.events = 0  # congestion events without headers so far: flights of 429s, each one however many it held

    # ---- what a backend asks -----------------------------------------------------------------

    @property
    def mode(self) -> PacingMode:
        return self._mode

    @property
    def heard(self) -> bool:
        """Whether any reply (or a rate another process learnt) has been seen."""
        return self._heard

    def rate(self) -> float | None:
        """Requests per second to pace at now; None when nothing limits the rate."""
        if not self.adapt:
            return self.ceiling
        # Before the first reply nothing is paced (no slow start): the concurrency cap bounds the
        # first burst, and the first reply's headers or first 429 set the pace from there.
        learnt = self._learnt
        if self._mode == "aimd":
            now = self._clock()
            self._settle(now)
            learnt = self._grown(now)
        if learnt is None:
            return self.ceiling
        return learnt if self.ceiling is None else min(self.ceiling, learnt)

    def pacing(self) -> Pacing:
        rate = self.rate() if self._heard or self.ceiling is not None else None  # a run that sent nothing learnt nothing
        told = self.ceiling is not None and (rate is None or rate >= self.ceiling)
        return Pacing(mode="fixed" if told or not self.adapt else self._mode, rps=None if rate is None else round(rate, 3))

    # ---- what a backend tells it -------------------------------------------------------------

    def observe(self, status: int, headers: Mapping[str, str], *, sent_at: float | None = None, tokens: int = 0) -> None:
        """Learn from one reply: its status (200, 429, ...) and headers; ``sent_at`` on this clock."""
        if not self.adapt:
            return
        now = self._clock()
        self._heard = True
        if tokens > 0:
            self._tokens_per_request = tokens if not self._tokens_per_request else 0.9 * self._tokens_per_request + 0.1 * tokens
        if self._from_headers(headers) is not None:
            self._weigh(status, headers, now, tokens)
            from_headers = self._from_headers(headers)
            assert from_headers is not None
            self._set("headers", from_headers)
            return
        if self._mode == "headers" or self.ceiling is not None:
            return  # a reply without headers from a server that sent them, or a told limit: keep it
        if status == 429:
            self._refused(now, now if sent_at is None else sent_at)
        elif 200 <= status < 300:
            if self._started is None:
                self._started = now
            self._accepted.append(now)
            while self._accepted and self._accepted[0] < now - _WINDOW_S:
                self._accepted.popleft()
            sent = now if sent_at is None else min(sent_at, now)
            self._accepted_sends.append(sent)
            while self._accepted_sends and self._accepted_sends[0] < now - _KEPT_S:
                self._accepted_sends.popleft()
            rtt = now - sent
            self._srtt = rtt if self._srtt is None else 0.875 * self._srtt + 0.125 * rtt
            if self._flight_end == math.inf:
                self._flight_end = now  # the first accepted answer since the event: its flight is over
            if self._cut - _FLIGHT_WINDOW_S <= sent < self._cut and not self._estimating and self._mode == "aimd":
                self._flight_accepted += 1  # a late answer of the event's window: the estimate was low by one
                estimate = self._estimate()
                if estimate > (self._grown(now) or 0.0):
                    self._set("aimd", estimate)
            self._settle(now)

    def adopt(self, mode: PacingMode, rps: float) -> None:
        """Take a rate learnt elsewhere (another process sharing the limit)."""
        if not self.adapt or mode == "fixed":
            return
        now = self._clock()
        if mode == "aimd" and self._mode == "aimd":
            self._slow_start = self._slow_start and rps >= (self._grown(now) or 0)
        self._mode, self._learnt, self._changed, self._heard = mode, rps, now, True

    # ---- internals -----------------------------------------------------------------------------

    def _weigh(self, status: int, headers: Mapping[str, str], now: float, tokens: int = 0) -> None:
        """Trust the headers less with each reply that contradicts them, more again with each 429.

        A token bucket stated at L requests per minute accepts at most its size (<= L) plus L within
        any minute; more accepted replies than 2L + 1 in the last minute mean the headers understate the
        limit, so every further such reply lets the rate rise 25% above what they say. Token headers
        likewise, against the tokens the replies of the last minute used.
        """
        if status == 429:
            self._doubt = max(1.0, self._doubt / 2)
            self._token_doubt = max(1.0, self._token_doubt / 2)
            return
        limit = _stated(headers, "requests", "limit")
        token_limit = _stated(headers, "tokens", "limit")
        if not (200 <= status < 300) or not (limit or token_limit):
            return
        self._ok.append((now, tokens))
        while self._ok and self._ok[0][0] < now - _MINUTE_S:
            self._ok.popleft()
        self._recent_ok.append(now)
        while self._recent_ok and self._recent_ok[0] < now - _WINDOW_S:
            self._recent_ok.popleft()
        accepted = len(self._recent_ok) / min(_WINDOW_S, max(0.25, now - self._ok[0][0]))
        self._accepted_rps = accepted
        # Application-limited (the concurrency cap sets the pace): a rate nobody uses does not grow.
        if (self._learnt or 0.0) >= 2 * accepted + START_RPS:
            return
        if limit and len(self._ok) > 2 * limit + 1:
            self._doubt = min(_MAX_DOUBT, self._doubt * _DOUBT_STEP)
        if token_limit and sum(t for _, t in self._ok) > 2 * token_limit + self._tokens_per_request:
            self._token_doubt = min(_MAX_DOUBT, self._token_doubt * _DOUBT_STEP)

    def _from_headers(self, headers: Mapping[str, str]) -> float | None:
        told = self.ceiling is not None
        wall = self._wall()
        requests = _bucket_rate(headers, "requests", told=told, wall=wall)
        tokens = _bucket_rate(headers, "tokens", told=told, wall=wall)
        if tokens is not None and self._tokens_per_request > 0:
            tokens = tokens / self._tokens_per_request
            if self._token_doubt > 1:  # contradicted: at least the rate replies are accepted at, grown by the doubt
                tokens = max(tokens, self._accepted_rps) * self._token_doubt
        else:
            tokens = None
        if requests is not None:
            requests *= self._doubt
        rates = [r for r in (requests, tokens) if r is not None]
        return max(MIN_RPS, min(rates)) if rates else None

    def _set(self, mode: PacingMode, rate: float) -> None:
        rate = min(MAX_RPS, max(MIN_RPS, rate))
        if mode != self._mode or rate != self._learnt:
            self.version += 1
        self._mode, self._learnt, self._changed = mode, rate, self._clock()

    def _grown(self, now: float) -> float | None:
        """The AIMD rate now: the last one set, grown for the time since (slow start or additive).

        None until the first 429: a server that never refuses (a local vLLM) is not paced at all.
        """
        rate = self._learnt
        if rate is None:
            return None
        elapsed = now - self._changed
        if self._slow_start:
            rate *= 2 ** min(40.0, elapsed / _DOUBLING_S)
        else:
            rate += max(0.5, 0.02 * rate) * elapsed  # per second: +2% of the rate, at least half a request
        accepted = self._accepted_rate(now)
        if accepted is not None:
            # Application-limited (the concurrency cap, not the pacer, sets the pace): do not grow a
            # rate nobody uses, or the first 429 would meet a rate far above anything measured.
            rate = min(rate, max(self._learnt, 2 * accepted + START_RPS))
        return min(MAX_RPS, rate)

    def _accepted_rate(self, now: float) -> float | None:
        """Replies accepted per second over the last window; None before a quarter second has passed."""
        window = min(_WINDOW_S, now - (self._started if self._started is not None else now))
        if window < 0.25:
            return None
        return sum(1 for t in self._accepted if t >= now - window) / window

    def _refused(self, now: float, sent_at: float) -> None:
        """A 429: a congestion event, unless its request was sent within the flight of the last one."""
        self._settle(now)
        if self._flight_end is not None and sent_at < self._flight_end:
            return  # sent before the last event's flight was answered: that event already answered for it
        accepted = self._accepted_rate(now)
        self._cut = now
        self.events += 1
        # The flight: one round trip from now; before any request was accepted, until the first one is
        # (bounded, for a server that accepts nothing at all).
        self._flight_end = now + self._srtt if self._srtt is not None else math.inf
        self._estimating = True
        current = self._grown(now)
        self._floor = 0.5 * current if current is not None else 0.0  # the estimate never cuts more than TCP's halving
        if current is None:
            # The first 429 of an unpaced run: a limit exists. Until the flight is answered, a safe rate
            # (or 0.9 of what was accepted so far); then what the server accepted while it refused.
            self._started = self._started if self._started is not None else now
            self._set("aimd", max(START_RPS, 0.9 * (accepted or 0.0)))
            return
        # What the server accepted of late, until the flight tells better; without a measure yet, halve.
        cut = min(current, accepted) * 0.9 if accepted else current * 0.5
        self._slow_start = False
        self._set("aimd", cut)

    def _settle(self, now: float) -> None:
        """Once an event's flight is answered, its estimate: requests accepted among those sent in the
        second before the event, per second (while the server refused, what it accepted is its limit)."""
        if not self._estimating:
            return
        end = self._flight_end
        if end == math.inf and now - self._cut > FIRST_REPLY_WAIT_S:
            self._flight_end = end = now  # nothing accepted for a while: the flight is over all the same
        if end is None or now < end:
            return
        self._estimating = False
        since = self._cut - _FLIGHT_WINDOW_S
        self._flight_accepted = sum(1 for t in self._accepted_sends if since <= t < self._cut)
        if self._flight_accepted:
            self._set("aimd", max(self._floor, self._estimate()))

    def _estimate(self) -> float:
        """The event's estimate: its window's accepted requests per second (answers of that window that
        come after the flight's end raise it: a slow reply is not a refusal)."""
        return _ESTIMATE_SHARE * self._flight_accepted / _FLIGHT_WINDOW_S
