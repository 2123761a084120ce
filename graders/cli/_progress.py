"""What a running `gradekit grade` shows: a bar on a terminal, a line every few seconds elsewhere.

A run in CI, under nohup or into a pipe has no terminal to draw a bar on; a silent run of an
hour is indistinguishable from a hung one, so it prints ``graded 120/240 rows, 19.8 rows/s,
0 errors, ETA 6 s`` every ``--progress-every`` seconds instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from rich.console import Console


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def already_written(output: Path, restart: bool) -> int:
    """Rows an earlier, interrupted run left in OUTPUT (from its checkpoint), so the count starts there."""
    if restart:
        return 0
    try:
        state = json.loads(output.with_name(output.name + ".checkpoint.json").read_text(encoding="utf-8"))
        return 0 if state.get("complete") else int(state["mark"]["rows"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a malformed checkpoint: the run warns and starts over
        return 0


class RunProgress:
    """Counts rows as the run reports them (``row`` is its ``on_row``) and shows them while it runs.

    ``every`` seconds between lines when stderr is not a terminal (0: no lines); ``bar`` draws a
    rich bar instead (a terminal, and not --json).
    """

    def __init__(self, total: int | Callable[[], int], err: Console, *, every: float, bar: bool, done: int = 0,
                 fleet: Callable[[], str] | None = None) -> None:
        # A callable total is counted (in a thread) when the first line is due, so short runs never pay for it.
        self._count = total if callable(total) else None
        self.total = 0 if callable(total) else total
        self.err = err
        self.every = every
        self.bar = bar
        self.start_done = self.done = done
        self.errors = 0
        self.fleet = fleet  # the judge's fleet part of a line (its rate, each endpoint's), if it has one
        self.started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def row(self, outcome: Any) -> None:
        self.done += 1
        if getattr(outcome, "status", "ok") not in ("ok", "skipped", "abstained"):
            self.errors += 1
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, rate=f"{self.rate():.1f} rows/s", errors=self.errors)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        left = max(0, self.total - self.done)
        eta = left / rate if rate > 0 else (0.0 if not left else None)
        return (f"graded {self.done}/{self.total} rows, {rate:.1f} rows/s, {self.errors} error{'s' if self.errors != 1 else ''}, "
                f"ETA {eta_text(eta)}{self.fleet() if self.fleet is not None else ''}")

    @contextlib.asynccontextmanager
    async def showing(self) -> AsyncIterator[RunProgress]:
        """The bar, or the ticker that prints a line every ``every`` seconds, for the duration of the run."""
        if self.bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                       TextColumn("{task.fields[errors]} errors"), TimeRemainingColumn())
            with Progress(*columns, console=self.err, transient=True) as progress:
                self._progress = progress
                self._task = progress.add_task("grade", total=self.total, completed=self.done, rate="", errors=0)
                try:
                    yield self
                finally:
                    self._progress = None
            return
        if self.every <= 0:
            yield self
            return
        ticker = asyncio.create_task(self._tick())
        try:
            yield self
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            if self._count is not None:
                count, self._count = self._count, None
                self.total = await asyncio.to_thread(count)
            print(self.line(), file=sys.stderr, flush=True)
