"""A canary: rows with known verdicts, judged before a run and again every N rows or seconds, to catch a judge that changed.

A provider can move an alias to a new snapshot, or a self-hosted server can be redeployed, in the
middle of a long run; the run's later rows are then judged by another judge than its first ones.
The canary asks its rows again at each check, always from the wire (a check never reads the
cache), and compares each row's agreement with its known verdict against the run's start, paired:

    b = rows right at the start and wrong now, c = rows wrong at the start and right now
    p = exact two-sided McNemar (sign) test: 2 * P(Binomial(b + c, 1/2) <= min(b, c))
    check k drifts when p <= alpha * 6 / (pi^2 k^2)

The levels sum to alpha over every check of a run however long it is (sum 1/k^2 = pi^2 / 6), so a
judge that did not change stops a run with probability at most alpha; the price is that later
checks need more evidence (a larger canary is more sensitive). A canary row that fails (a 5xx, a
timeout) is left out of that check; a broken judge is the breaker's to stop.

Rows a check vouches for: those that finished before it started. A row that finished after the
last check that passed started waits (is not written) until the next one passes. On drift the run
stops like the breaker (:class:`~gradekit.judge._breaker.BreakerTripped`, exit 3): the output ends
before the first row not vouched for and the checkpoint keeps the start's canary, so the same
command resumes only once the canary agrees with the start again. With ``on_drift="flag"`` it goes
on: every row not vouched for when the change was seen, and every later row, gets ``drift = true``.

The cache rule: a check never reads the cache. After a change is seen (``flag``), and in a run
resumed after a drift stop, no row reads a verdict from the cache either (a reply cached before the
change is the old judge's); until then rows read it as usual, and a cached verdict served by
another model or fingerprint than the canary saw at the start is counted (``cached_other_judge``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from gradekit.judge._breaker import BreakerTripped, Trip, current_breaker

OnDrift = Literal["stop", "flag"]
DEFAULT_EVERY_ROWS = 500
# Rows waiting for a check at most: past it a check starts at once, so a time-only schedule over fast rows keeps memory bounded.
MAX_WAITING = 10_000


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar (sign test) p-value of b discordant pairs one way and c the other."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def level(alpha: float, check: int) -> float:
    """The level check ``check`` (1, 2, ...) tests at: alpha * 6 / (pi^2 k^2), summing to alpha over every check."""
    return alpha * 6 / (math.pi ** 2 * check ** 2)


def parse_every(values: Sequence[str]) -> tuple[int | None, float | None]:
    """``--canary-every`` values: a number of rows (``500``) and/or a time (``90s``, ``10m``, ``1h``); ValueError otherwise."""
    rows: int | None = None
    seconds: float | None = None
    for value in values:
        text = value.strip().lower()
        unit = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1:]) if text else None
        try:
            if unit is not None:
                seconds = float(text[:-1]) * unit
                if not seconds > 0 or not math.isfinite(seconds):
                    raise ValueError
            else:
                rows = int(text)
                if rows < 1:
                    raise ValueError
        except ValueError:
            raise ValueError(f"`canary_every` {value!r}: a number of rows (500) or a time (90s, 10m, 1h)") from None
    return rows, seconds


class Check:
    """One canary check: each row's label (None: failed), whether it is the known verdict, and who answered."""

    def __init__(self, labels: list[str | None], right: list[bool | None], served: list[tuple[str | None, str | None]]) -> None:
        self.labels, self.right, self.served = labels, right, served
        self.failure: str | None = None  # the first row's error, when some failed

    @property
    def agreement(self) -> float | None:
        judged = [r for r in self.right if r is not None]
        return sum(judged) / len(judged) if judged else None

    def who(self) -> list[dict[str, str | None]]:
        """The (model, fingerprint) pairs that answered, most common first."""
        counts: dict[tuple[str | None, str | None], int] = {}
        for pair in self.served:
            if pair != (None, None):
                counts[pair] = counts.get(pair, 0) + 1
        return [{"model": m, "system_fingerprint": f} for (m, f), _ in sorted(counts.items(), key=lambda kv: -kv[1])]

    def dump(self) -> dict[str, Any]:
        return {"labels": self.labels, "right": self.right, "served": [list(p) for p in self.served]}

    @classmethod
    def load(cls, state: Mapping[str, Any]) -> Check:
        return cls(list(state["labels"]), list(state["right"]), [(p[0], p[1]) for p in state["served"]])


class Canary:
    """The canary of one run: its rows, the judge that asks them from the wire, and the test against the start.

    Args:
        rows: the canary rows' rubric variables; ``known``: each row's known verdict (an offered label).
        rubric: the run's rubric; ``fresh``: the run's judge without a cache (sharing the run's limiter and budget).
            Rows after a change is seen are judged by it too.
        every_rows / every_seconds: when to check again (whichever comes first; rows by default).
        on_drift: ``stop`` (exit 3, resumable) or ``flag`` (go on and mark the rows after the change).
        alpha: the chance a judge that did not change stops the run, over all its checks.
        source: the canary file's name and hash: a resume with another canary starts its baseline over.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], known: Sequence[Any], rubric: Any, fresh: Any, *,
                 every_rows: int | None = DEFAULT_EVERY_ROWS, every_seconds: float | None = None, on_drift: OnDrift = "stop",
                 alpha: float = 0.05, source: Mapping[str, Any] | None = None) -> None:
        if not rows:
            raise ValueError("the canary has no rows")
        if every_rows is None and every_seconds is None:
            every_rows = DEFAULT_EVERY_ROWS
        self.rows, self.known, self.rubric, self.fresh = list(rows), [str(k) for k in known], rubric, fresh
        self.every_rows, self.every_seconds, self.on_drift, self.alpha = every_rows, every_seconds, on_drift, alpha
        self.source = dict(source or {})
        self.baseline: Check | None = None
        self.last: Check | None = None
        self.checks = 0  # checks compared with the baseline, over every run of this output (the level's k)
        self.passed = 0  # the number of the last check that passed in this run (0: its start)
        self.drift: dict[str, Any] | None = None  # what the check that saw the change found
        self.after_change = False  # rows read no cached verdict (a change was seen, or this run resumed after one)
        self.cached_other_judge = 0
        self.flagged = 0
        self.requests = 0  # requests its checks sent in this run (not in the run's own count; its tokens are in the budget's)
        self.stopping = False  # on_drift stop, and a change seen: the run takes no more rows
        self.wake: Callable[[], None] | None = None  # the run's flush: held rows may be written after a check
        self._epoch: dict[int, int] = {}  # row number -> the number of the last check started before it finished
        self._started = 0  # checks started in this run (its start is check 0)
        self._rows_since = 0
        self._since = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    # ---- checks ------------------------------------------------------------------------------

    async def ask(self) -> Check:
        """Every canary row, from the wire (the fresh judge has no cache)."""
        verdicts = await asyncio.gather(*(self.fresh.judge(self.rubric, row) for row in self.rows))
        labels = [v.label if v.status == "ok" else None for v in verdicts]
        right = [None if lab is None else lab.casefold() == k.casefold() for lab, k in zip(labels, self.known)]
        check = Check(labels, right, [(v.read.served_model, v.read.system_fingerprint) for v in verdicts])
        check.failure = next((f"{v.error_kind}: {v.error}" for v in verdicts if v.status != "ok"), None)
        self.requests += sum(v.usage.requests for v in verdicts)
        return check

    async def start(self, saved: Mapping[str, Any] | None) -> None:
        """The check before any row: the baseline, or (a resumed run) a check against the baseline its start saved."""
        self._started = 1
        if saved and saved.get("source") == self.source and saved.get("baseline"):
            self.baseline = Check.load(saved["baseline"])
            self.checks = int(saved.get("checks", 0))
            self.after_change = bool(saved.get("after_change")) or saved.get("drift") is not None
            if saved.get("drift") is not None and self.on_drift == "flag":
                self.drift = {**saved["drift"], "vouched_before": 0}  # seen before: every row of this run follows the change
                return
            await self.check(0)
            return
        check = await self.ask()
        if check.agreement is None:  # a judge that answers nothing: the run's breaker says why, else the first row's error
            breaker = current_breaker()
            trip = breaker.tripped if breaker is not None and breaker.tripped is not None else Trip(
                "canary", check.failure or "no verdict", f"none of the canary's {len(self.rows)} rows got a verdict at the start",
                None, getattr(self.fresh, "model", None))
            raise BreakerTripped(trip, f"{trip.describe()}. Stopped before any row: nothing written; fix the judge and run the "
                                       "same command again")
        self.baseline = self.last = check

    async def check(self, number: int) -> None:
        """Check ``number`` of this run (0: the start of a resumed run) against the baseline; on drift, stop or flag."""
        assert self.baseline is not None
        check = await self.ask()
        self.last = check
        self.checks += 1
        pairs = [(a, b) for a, b in zip(self.baseline.right, check.right) if a is not None and b is not None]
        lost = sum(1 for a, b in pairs if a and not b)
        gained = sum(1 for a, b in pairs if b and not a)
        p = mcnemar_p(lost, gained)
        at = level(self.alpha, self.checks)
        if self.drift is None and p <= at:
            changed = sum(1 for a, b in zip(self.baseline.labels, check.labels) if a is not None and b is not None and a != b)
            # Rows that finished after the last check that passed started may be the new judge's: none of them is vouched for.
            self.drift = {"check": self.checks, "p": p, "level": at, "rows_compared": len(pairs), "right_then_wrong": lost,
                          "wrong_then_right": gained, "answers_changed": changed,
                          "agreement_start": sum(a for a, _ in pairs) / len(pairs), "agreement_now": sum(b for _, b in pairs) / len(pairs),
                          "served_start": self.baseline.who(), "served_now": check.who(), "vouched_before": self.passed}
            self.after_change = True
            self.stopping = self.on_drift == "stop"
        elif self.drift is None:
            self.passed = max(self.passed, number)
        if self.wake is not None:
            self.wake()

    def launch(self) -> None:
        """Start a check now (rows keep flowing; those that finish meanwhile wait for the next one)."""
        self._rows_since = 0
        self._since = time.monotonic()
        number = self._started
        self._started += 1  # rows finishing from now on follow it
        self._task = asyncio.ensure_future(self._checked(number))

    async def _checked(self, number: int) -> None:
        try:
            await self.check(number)
        finally:
            self._task = None

    async def ticker(self) -> None:
        """A check every ``every_seconds``, also while no row finishes (a stalled provider is checked too)."""
        if self.every_seconds is None:
            return
        while self.drift is None:
            await asyncio.sleep(max(0.05, self.every_seconds - (time.monotonic() - self._since)))
            if self._task is None and self.drift is None and time.monotonic() - self._since >= self.every_seconds:
                self.launch()

    async def final(self) -> None:
        """The check after the last row, so the tail of the run is vouched for too (or flagged, or cut)."""
        while self._task is not None:
            await asyncio.shield(self._task)
        if self.drift is None and any(e >= self.passed for e in self._epoch.values()):
            number = self._started
            self._started += 1
            await self.check(number)

    # ---- rows --------------------------------------------------------------------------------

    def finished(self, number: int, verdict: Any) -> None:
        """Row ``number``'s outcome is in: note which check it follows, and start a check when one is due."""
        self._epoch[number] = self._started - 1
        read = getattr(verdict, "read", None)
        if getattr(verdict, "cached", False) and getattr(read, "system_fingerprint", None) and self.baseline is not None:
            seen = {p for p in self.baseline.served if p != (None, None)}
            if seen and (read.served_model, read.system_fingerprint) not in seen:  # type: ignore[union-attr]
                self.cached_other_judge += 1
        self._rows_since += 1
        if self.drift is None and self._task is None and (
                (self.every_rows is not None and self._rows_since >= self.every_rows)
                or (self.every_seconds is not None and time.monotonic() - self._since >= self.every_seconds)
                or len(self._epoch) >= MAX_WAITING):
            self.launch()

    def holds(self, number: int) -> bool:
        """Whether row ``number`` waits: no check after it has passed yet; after a change it is cut (stop) or flagged (flag)."""
        epoch = self._epoch.get(number)
        if epoch is None:
            return False
        if self.drift is None:
            return epoch >= self.passed
        return self.on_drift == "stop" and epoch >= int(self.drift["vouched_before"])

    def drifted(self, number: int) -> bool:
        """Row ``number``'s drift cell, as it is written: True when it may have been judged after the change."""
        epoch = self._epoch.pop(number, None)
        if self.drift is None:
            return False
        flagged = epoch is None or epoch >= int(self.drift["vouched_before"])
        self.flagged += flagged
        return flagged

    # ---- what it says ------------------------------------------------------------------------

    def finding(self) -> str:
        """What the check that saw the change found, in one sentence."""
        d = self.drift or {}

        def who(pairs: list[dict[str, Any]]) -> str:
            return ", ".join(f"{p['model']} {p['system_fingerprint'] or ''}".strip() for p in pairs) or "not given"

        return (f"the judge changed: the canary agreed with its known verdicts on {d.get('agreement_start', 0):.0%} of its rows at "
                f"the start and {d.get('agreement_now', 0):.0%} now ({d.get('right_then_wrong')} right then wrong, "
                f"{d.get('wrong_then_right')} wrong then right; McNemar p = {d.get('p', 1):.2g} <= {d.get('level', 0):.2g} at "
                f"check {d.get('check')}); served {who(d.get('served_start') or [])} then {who(d.get('served_now') or [])}")

    def message(self, where: str) -> str:
        """Why the run stopped on drift, and how to go on."""
        return (f"{self.finding()}. Stopped early: {where}; the same command resumes once the canary agrees with the start again "
                "(rows are then judged without the cache); `resume=False` grades every row with the judge as it is now; "
                "`on_drift` flag goes on and marks the rows judged after the change")

    def trip(self) -> Trip:
        d = self.drift or {}
        return Trip("drift", f"canary agreement {d.get('agreement_start', 0):.0%} at the start, {d.get('agreement_now', 0):.0%} now",
                    f"McNemar p = {d.get('p', 1):.2g} at check {d.get('check')}", None, getattr(self.fresh, "model", None))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the start's check (a resume compares against it), and the change once seen."""
        return {"source": self.source, "baseline": self.baseline.dump() if self.baseline is not None else None,
                "checks": self.checks, "drift": self.drift, "after_change": self.after_change}

    def report(self) -> dict[str, Any]:
        """The summary's ``canary`` block."""
        return {"rows": len(self.rows), "checks": self.checks, "on_drift": self.on_drift, "alpha": self.alpha,
                "every_rows": self.every_rows, "every_seconds": self.every_seconds,
                "agreement_start": self.baseline.agreement if self.baseline is not None else None,
                "agreement_last": self.last.agreement if self.last is not None else None,
                "served_start": self.baseline.who() if self.baseline is not None else [],
                "drift": self.drift, "flagged_rows": self.flagged, "cached_other_judge": self.cached_other_judge,
                "requests": self.requests}

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
