"""A row's deadline: a bound on the whole time one row spends waiting for the judge, beside each request's ``timeout``.

``timeout`` bounds one request (first byte, every gap and the total); a row is several: retries after
a failure (six attempts by default) and re-asks after an unreadable reply. A stream that never ends
held a row for every attempt's timeout in turn (6 x 5 s and the waits between at ``--timeout 5``).
The row deadline bounds their sum: the seconds the row's requests spend on the wire, over every
attempt, retry and re-ask (``row_deadline``, by default ``ROW_DEADLINE_FACTOR`` x ``timeout``). An
attempt is cut at what is left of it; once it is spent, no further attempt is made and the row is a
``timeout`` error that says so. Waiting is not counted: for a limiter slot or a 429's Retry-After
(pacing, which has its own budget: judge._retry.RATE_LIMIT_BUDGET_S), nor the backoff between attempts.

One :class:`RowClock` per row, found through a context variable (as the run's breaker is), so a fleet's
endpoints, a hedge and the retry loop all count against the same row without plumbing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

DEFAULT_TIMEOUT_S = 60.0  # seconds one request may take (judge._spec.DEFAULTS.timeout): first byte, every gap, the total
ROW_DEADLINE_FACTOR = 3.0  # the default row deadline, in request timeouts: three whole attempts


class RowClock:
    """One row's time on the wire against its deadline (``limit`` seconds; None: no deadline)."""

    __slots__ = ("limit", "spent", "attempts", "last")

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.spent = 0.0  # seconds the row's requests were on the wire
        self.attempts = 0
        self.last: str | None = None  # the last attempt's failure, for the message

    def left(self) -> float | None:
        """Seconds the row may still spend on the wire (None: no deadline)."""
        return None if self.limit is None else self.limit - self.spent

    def spend(self, seconds: float) -> None:
        self.spent += max(0.0, seconds)
        self.attempts += 1

    def passed(self) -> str:
        """The row's error once its deadline is spent."""
        last = f"; the last attempt: {self.last}" if self.last else ""
        return (f"no answer within the row deadline ({self.limit:g} s on the wire over {self.attempts} attempt"
                f"{'s' if self.attempts != 1 else ''}; `row_deadline`, by default {ROW_DEADLINE_FACTOR:g} x `timeout`){last}")


_current: ContextVar[RowClock | None] = ContextVar("gradekit_row_clock", default=None)


def row_clock() -> RowClock | None:
    """The clock of the row this code is judging, if any."""
    return _current.get()


@contextlib.contextmanager
def row_scope(limit: float | None) -> Iterator[RowClock]:
    """A fresh clock for one row, current for this context and the tasks started inside it."""
    clock = RowClock(limit)
    token = _current.set(clock)
    try:
        yield clock
    finally:
        _current.reset(token)
