"""The circuit breaker: a run stops sending once it can tell the judge is broken.

A dead endpoint, a wrong key or a wrong model name fails every request the same way; sending
the rest of a 500-row file to it costs thousands of requests and minutes for nothing. A run
(``gradekit.graders.runs``) opens a :class:`Breaker` for its duration with :func:`breaker_scope`; every
Judge that sends on the run's behalf finds it through a context variable (so graders, composites
and LLM nodes built anywhere are covered without plumbing) and reports each request to it.

It trips on either rule:

- the first ``first_rows`` rows judged all failed with the same non-transient error (a 401, a
  403, a 404 for the model, any same ``bad_request``, or the same ``local_error``: this process
  fails before any request, a broken install, and says so, never blaming the judge), or all got replies that are not in the
  rubric's format (``parse_failure``: a judge that never answers in the format would otherwise
  be asked three times per row for the whole file);
- more than ``share`` of the last ``window`` requests failed (connection refused, 5xx, timeouts,
  malformed bodies, 401/403/404). Counted per request, not per row: a row retries up to six
  times, so a row-level count would send hundreds of requests before it could decide. 429s
  count neither way: the provider is alive and pacing is the limiter's job;
- ``window`` requests in a row were all refused (429), none answered, over more than
  ``refusal_span_s`` seconds and more than the longest wait the refusals asked for: the run waited
  as told and nothing came back, a quota spent (OpenAI's ``insufficient_quota`` is a 429) or a fleet
  whose every endpoint refuses. Pacing never looks like that: a limit that paces lets requests through
  once its wait is over. Without the rule each row waited out its 429 budget (600 s) and the run never ended.

Once tripped, a Judge sends no further request (retries in flight stop too) and the run stops
taking rows; the run decides what to write and raises :class:`BreakerTripped`. Rows that failed
the way that tripped it are never written (:meth:`Breaker.cuts`), whatever the status code.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from ._redact import redact, redact_url

# Error kinds a broken judge produces. A row that ended in one of them is not written while the
# breaker may still trip (an outage must leave no error rows behind); the rows of a tripped run
# are cut at the first of them.
# Seconds a streak of nothing but 429s must last before it trips the run (and at least its longest hint).
REFUSAL_SPAN_S = 10.0

JUDGE_FAILURES = frozenset({"server_error", "timeout", "rate_limited", "bad_request"})

_ROW_PREFIX = re.compile(r"^(?:row \d+: )+")


@dataclass(frozen=True)
class Trip:
    """Why a breaker tripped: which endpoint, which kind of error, and one example of it."""

    kind: str
    example: str
    rule: str  # what was seen, e.g. "42 of the last 50 requests failed"
    base_url: str | None = None
    model: str | None = None
    endpoints: tuple[str, ...] = ()  # a fleet's trip: each endpoint and why it is out ("URL: why")

    def __post_init__(self) -> None:
        # A trip is printed, put in a run's summary and in the stop message: its URL and example carry no secret.
        object.__setattr__(self, "base_url", redact_url(self.base_url))
        object.__setattr__(self, "example", redact(self.example) or "")
        object.__setattr__(self, "endpoints", tuple(redact(e) or "" for e in self.endpoints))

    def describe(self) -> str:
        if self.kind == "local_error":  # nothing is wrong with the judge: this process failed before any request
            return (f"gradekit failed in this process before any request to {self.base_url or '(unknown URL)'} (model "
                    f"{self.model or 'unknown'}), and every row would fail the same way: {self.rule}; local_error, e.g. {self.example}")
        if self.endpoints:
            return (f"every endpoint of the judge (model {self.model or 'unknown'}) looks broken: "
                    + "; ".join(self.endpoints))
        where = f"the judge at {self.base_url or '(unknown URL)'} (model {self.model or 'unknown'})"
        return f"{where} looks broken: {self.rule}; {self.kind}, e.g. {self.example}"


class BreakerTripped(RuntimeError):
    """A run stopped early because its judge is broken; the output ends before the first row that
    failed for it and the checkpoint is saved, so the same command resumes once it is fixed.

    ``summary`` is the run's summary of the rows written (a ``RunSummary`` for file runs).
    """

    def __init__(self, trip: Trip, message: str, summary: object = None) -> None:
        super().__init__(message)
        self.trip = trip
        self.summary = summary


class Breaker:
    """Watches a run's requests and rows; ``tripped`` is set once the judge is seen to be broken."""

    def __init__(self, *, window: int = 50, share: float = 0.8, first_rows: int = 3,
                 endpoint: tuple[str | None, str | None] = (None, None), refusal_span_s: float = REFUSAL_SPAN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.refusal_span_s = refusal_span_s
        self._clock = clock
        self._refusals = 0  # 429s since the judge last answered
        self._refused_since = 0.0
        self._longest_hint = 0.0
        self.share = share
        self.first_rows = first_rows
        self.tripped: Trip | None = None
        self.successes = 0  # requests and rows that went well; a held error row waits for one after it
        self._recent: deque[bool] = deque(maxlen=window)  # True: that request failed
        self._first: list[tuple[str, str] | None] = []
        self._replies: list[str] = []  # the first parse failure's reply, for a trip's example
        # The endpoint and model of the latest request, whatever it answered: a trip always names them.
        self._endpoint: tuple[str | None, str | None] = (endpoint[0] or None, endpoint[1] or None)

    def request(self, failure: tuple[str, str] | None, *, base_url: str | None = None, model: str | None = None) -> None:
        """One request's outcome: None when the judge answered (or the request was at fault), else (error kind, message).

        Only rows count as successes (:meth:`row`): a request the client reports as None may be a
        400 whose row failed, and a held error row must wait for a row that went well.
        """
        self._recent.append(failure is not None)
        if base_url is not None or model is not None:
            self._endpoint = (base_url or self._endpoint[0], model or self._endpoint[1])
        if failure is None:
            self._refusals = 0  # it answered: whatever 429s came before were pacing
            return
        failed = sum(self._recent)
        if self.tripped is None and len(self._recent) >= self.window and failed > self.share * self.window:
            self.tripped = Trip(failure[0], failure[1], f"{failed} of the last {len(self._recent)} requests failed",
                                base_url or self._endpoint[0], model or self._endpoint[1])

    def refused(self, message: str, *, hint: float | None = None, base_url: str | None = None, model: str | None = None) -> None:
        """One 429 (``hint``: the wait it asked for). Trips when the judge has refused everything for long enough."""
        now = self._clock()
        if self._refusals == 0:
            self._refused_since, self._longest_hint = now, 0.0
        self._refusals += 1
        self._longest_hint = max(self._longest_hint, hint or 0.0)
        span = now - self._refused_since
        if self.tripped is None and self._refusals >= self.window and span > max(self.refusal_span_s, self._longest_hint):
            self.tripped = Trip("rate_limited", message, f"the last {self._refusals} requests were all refused (429) over "
                                f"{span:.0f} s, each after the wait it asked for, and none was answered",
                                base_url or self._endpoint[0], model or self._endpoint[1])

    def trip(self, trip: Trip) -> None:
        """Trip for a reason seen elsewhere (every endpoint of a fleet out); the first trip stands."""
        if self.tripped is None:
            self.tripped = trip

    def row(self, status: str, kind: str | None, error: str | None, reply: str | None = None) -> None:
        """One finished row (after its retries); rows that never reached the judge are not reported.

        ``reply`` is the judge's reply of a failed row, shown as the example of a parse-failure trip.
        """
        if status == "ok":
            self.successes += 1
        if len(self._first) >= self.first_rows:
            return
        self._first.append((kind or "", _ROW_PREFIX.sub("", error or "")) if status != "ok" else None)
        if status != "ok" and kind == "parse_failure" and reply and not self._replies:
            self._replies.append(reply)
        if self.tripped is None and len(self._first) == self.first_rows:
            first = self._first[0]
            base_url, model = self._endpoint
            if first is not None and first[0] in ("bad_request", "local_error") and all(f == first for f in self._first):
                self.tripped = Trip(first[0], first[1], f"the first {self.first_rows} rows failed with the same error",
                                    base_url, model)
            elif all(f is not None and f[0] == "parse_failure" for f in self._first):
                example = f"the reply {self._replies[0][:300]!r}" if self._replies else first[1]  # type: ignore[index]
                self.tripped = Trip("parse_failure", example,
                                    f"the first {self.first_rows} rows got no reply in the rubric's format", base_url, model)

    def holds(self, kind: str | None) -> bool:
        """Whether a row that failed with ``kind`` waits before it is written: the breaker may still trip on it."""
        if self.cuts(kind):
            return True
        return kind in ("parse_failure", "local_error") and self.tripped is None and len(self._first) < self.first_rows

    def cuts(self, kind: str | None) -> bool:
        """Whether a row that failed with ``kind`` is left out of a tripped run's output (it failed for what tripped it)."""
        return kind in JUDGE_FAILURES or (self.tripped is not None and kind == self.tripped.kind)


EndpointState = Literal["up", "down", "probing"]


class EndpointBreaker:
    """One endpoint's health inside a fleet: taken out when it looks broken, probed back in.

    Out after one request past its timeout (each costs a whole timeout), ``trip_after`` failures in a
    row, or more than ``share`` of the last ``window`` requests (the failures the run's :class:`Breaker`
    counts: connection refused or reset, 5xx, timeouts, 401/403/404; never a 429). Once its back-off (``backoff_s``, doubling to
    ``max_backoff_s`` with each failed probe) is over, one request is let through as a probe; an
    answer brings the endpoint back. A single endpoint is never taken out this way: with nowhere
    else to send, the run's own breaker decides.
    """

    def __init__(self, *, trip_after: int = 3, window: int = 20, share: float = 0.5, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.trip_after, self.share, self.backoff_s, self.max_backoff_s = trip_after, share, backoff_s, max_backoff_s
        self._clock = clock
        self._recent: deque[bool] = deque(maxlen=window)
        self._streak = 0
        self.down = False
        self.probing = False  # a probe request is out
        self.reason: str | None = None  # the failure that took it out (kind: message)
        self._backoff = backoff_s
        self._retry_at = 0.0
        self.trips = 0
        self.failed_probes = 0  # probes failed since it was taken out (0 once it answers again)

    def state_now(self, now: float | None = None) -> EndpointState:
        if not self.down:
            return "up"
        return "probing" if self.probing else "down"

    def backoff_left(self) -> float:
        """Seconds until the next probe (0 when it is due or the endpoint is in)."""
        return max(0.0, self._retry_at - self._clock()) if self.down else 0.0

    def usable(self, now: float) -> bool:
        """Whether a request may go to it now: in the fleet, or out with its probe due."""
        return not self.down or (not self.probing and now >= self._retry_at)

    def taken(self, now: float) -> bool:
        """A request was routed here; True when it is the probe of an endpoint out of the fleet."""
        if self.down and not self.probing:
            self.probing = True
            return True
        return False

    def success(self) -> None:
        self._recent.append(False)
        self._streak = 0
        if self.down:
            self.down = self.probing = False
            self.reason = None
            self._backoff = self.backoff_s
        self.failed_probes = 0

    def failure(self, kind: str, message: str) -> bool:
        """One failed request; True when it just took the endpoint out."""
        self._recent.append(True)
        self._streak += 1
        now = self._clock()
        if self.down:
            if self.probing:  # the probe failed: wait longer before the next one
                self.probing = False
                self.failed_probes += 1
                self._backoff = min(self.max_backoff_s, self._backoff * 2)
                self._retry_at = now + self._backoff
                self.reason = f"{kind}: {message}"
            return False
        failed = sum(self._recent)
        # A request past its timeout cost a whole timeout: one is enough to stop routing rows there (a hung replica
        # was still shown "up", and sent more rows, until two more had each waited out the timeout).
        if kind == "timeout" or self._streak >= self.trip_after or (len(self._recent) >= self._recent.maxlen // 2  # type: ignore[operator]
                                                                    and failed > self.share * len(self._recent)):
            self.down, self.probing = True, False
            self.reason = f"{kind}: {message}"
            self._retry_at = now + self._backoff
            self.trips += 1
            return True
        return False


_current: ContextVar[Breaker | None] = ContextVar("gradekit_breaker", default=None)


def current_breaker() -> Breaker | None:
    """The breaker of the run this code is working for, if any."""
    return _current.get()


@contextlib.contextmanager
def breaker_scope(breaker: Breaker | None) -> Iterator[Breaker | None]:
    """Make ``breaker`` the current one for this context and the tasks started inside it."""
    token = _current.set(breaker)
    try:
        yield breaker
    finally:
        _current.reset(token)
