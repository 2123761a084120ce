"""Hedged requests: what a fleet needs to send a straggler once more to another endpoint.

A request still unanswered after ``max(p95, 2 x median)`` of its endpoint's recent latencies is
sent again to another endpoint; the first answer wins (:meth:`gradekit.judge._fleet.Fleet.send`). The
parts here keep that cheap with thousands in flight:

- :class:`LatencyTracker`: one endpoint's newest latencies in a ring, counted in log-spaced
  buckets: O(1) per answer, bounded memory, a quantile read in O(buckets) and cached;
- :class:`HedgeBudget`: hedges earn credit from the requests sent (10% each by default), so hedges
  never pass that share of requests, overall or in a burst (the credit is capped);
- :class:`Deadlines`: one event loop's hedge deadlines in a heap behind one ``call_at``: no timer
  per request, none that wakes every tick.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("gradekit.judge")

_FLOOR_S = 0.001  # the first bucket's lower edge
_RATIO = 1.08  # bucket width: 8% (a quantile is read to within that)
_BUCKETS = 180  # 1 ms .. ~1,000 s
_LOG_RATIO = math.log(_RATIO)


class HedgePolicy(BaseModel):
    """Whether and how a fleet hedges (``hedge: true | false | {...}`` in a spec or a config).

    Meaningless for one endpoint (there is no other endpoint to ask), so off there whatever it says.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_extra: float = Field(0.10, ge=0, le=1)  # hedges sent <= this share of the (unhedged) requests sent
    min_samples: int = Field(20, ge=1)  # answers an endpoint must have given before its requests are hedged
    quantile: float = Field(0.95, gt=0, lt=1)  # hedge after max(this quantile, median_factor x median) ...
    median_factor: float = Field(2.0, ge=0)  # ... of the endpoint's recent latencies

    @classmethod
    def of(cls, value: bool | HedgePolicy | Mapping[str, Any] | None) -> HedgePolicy:
        """``hedge`` as given to a Judge or a config: None (the default, on), a bool, a mapping or a policy."""
        if value is None:
            return cls()
        if isinstance(value, HedgePolicy):
            return value
        if isinstance(value, bool):
            return cls(enabled=value)
        if isinstance(value, Mapping):
            return cls.model_validate(dict(value))
        raise ValueError(f"hedge: expected true, false or a mapping of hedge settings, got {value!r}")


class HedgeStats(BaseModel):
    """A fleet's hedges so far (a run summary's ``hedges``; per endpoint in ``endpoints``)."""

    sent: int = 0  # hedges that reached the wire
    won: int = 0  # hedges whose answer came first (the row's result is theirs)
    lost: int = 0  # hedges cancelled (the first request answered first) or failed


def _bucket(seconds: float) -> int:
    if seconds <= _FLOOR_S:
        return 0
    return min(_BUCKETS - 1, int(math.log(seconds / _FLOOR_S) / _LOG_RATIO))


class LatencyTracker:
    """The newest ``window`` latencies of one endpoint, for its hedge deadline."""

    __slots__ = ("_counts", "_ring", "_next", "count", "_cached", "_stale")

    def __init__(self, window: int = 256) -> None:
        self._counts = [0] * _BUCKETS
        self._ring = [0] * window
        self._next = 0
        self.count = 0  # samples held (at most window)
        self._cached: tuple[float, float, float] | None = None  # (quantile, factor, deadline) last read
        self._stale = 0  # samples added since

    def add(self, seconds: float) -> None:
        """One answer's latency: O(1) (the oldest sample leaves the window)."""
        bucket = _bucket(seconds)
        if self.count == len(self._ring):
            self._counts[self._ring[self._next]] -= 1
        else:
            self.count += 1
        self._ring[self._next] = bucket
        self._counts[bucket] += 1
        self._next = (self._next + 1) % len(self._ring)
        self._stale += 1

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the window (a bucket's upper edge), None without samples."""
        if not self.count:
            return None
        target = q * self.count
        seen = 0
        for bucket, n in enumerate(self._counts):
            seen += n
            if seen >= target and n:
                return _FLOOR_S * _RATIO ** (bucket + 1)
        return _FLOOR_S * _RATIO ** _BUCKETS

    def hedge_after(self, policy: HedgePolicy) -> float | None:
        """Seconds after which a request to this endpoint is hedged; None while it has too few samples.

        Read again every eighth sample at most, so a deadline costs O(1) amortised.
        """
        if self.count < policy.min_samples:
            return None
        cached = self._cached
        if cached is None or self._stale >= 8 or cached[0] != policy.quantile or cached[1] != policy.median_factor:
            high = self.quantile(policy.quantile) or 0.0
            median = self.quantile(0.5) or 0.0
            cached = self._cached = (policy.quantile, policy.median_factor, max(high, policy.median_factor * median))
            self._stale = 0
        return cached[2]


class HedgeBudget:
    """Credit for hedges: each request sent earns ``max_extra``, a hedge spends 1, the credit is capped."""

    __slots__ = ("share", "cap", "credit")

    def __init__(self, share: float, window: int = 1000) -> None:
        self.share = share
        self.cap = max(1.0, share * window)  # a burst spends at most this much saved credit
        self.credit = 0.0

    def earned(self) -> None:
        """One (unhedged) request was sent."""
        self.credit = min(self.cap, self.credit + self.share)

    def spend(self) -> bool:
        if self.credit < 1.0 - 1e-9:  # ten tenths make one
            return False
        self.credit -= 1.0
        return True

    def refund(self) -> None:
        """A hedge launched but never sent (the first answer came while it waited for a slot)."""
        self.credit = min(self.cap, self.credit + 1.0)


class Deadlines:
    """One event loop's hedge deadlines: a heap and one scheduled callback for the earliest.

    Adding is O(log n); a request answered before its deadline is not removed (its callback
    checks and returns), so nothing is scanned per completion.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def add(self, after: float, due: Callable[[], None]) -> None:
        at = self._loop.time() + after
        heapq.heappush(self._heap, (at, next(self._order), due))
        if at < self._at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = at
        self._handle = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        now = self._loop.time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            due = heapq.heappop(heap)[2]
            try:
                due()
            except Exception:  # one request's hedge going wrong must not stop the others' deadlines
                log.exception("hedge deadline failed")
        if heap:
            self._arm(heap[0][0])


_DEADLINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = weakref.WeakKeyDictionary()


def deadlines(loop: asyncio.AbstractEventLoop) -> Deadlines:
    """``loop``'s deadlines (a fleet may be used from several loops, one after another)."""
    found = _DEADLINES.get(loop)
    if found is None:
        found = _DEADLINES[loop] = Deadlines(loop)
    return found
