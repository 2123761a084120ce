"""The pandas front door: grade every row of a DataFrame with any grader, keeping its index and order."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradekit.judge import SyncRunner

from ._file import keep_input
from .._config import load_grader
from ._io import RowError
from ._rows import GradeColumns, RowMapping
from .._sample import Grade, Grader, SyncGrader, aclose_grader

if TYPE_CHECKING:
    import pandas as pd

GraderLike = Grader | SyncGrader | str | Path
Progress = bool | Callable[[int, int], None]

_REPORT_EVERY = 256  # rows between progress updates: per-row updates would cost more than a fast grader


async def agrade_frame(
    df: pd.DataFrame,
    grader: GraderLike,
    mapping: Mapping[str, Hashable] | None = None,
    *,
    concurrency: int = 16,
    progress: Progress = False,
) -> pd.DataFrame:
    """Grade every row of ``df``; the async twin of :func:`grade_frame`, for code already in a loop.

    Arguments and result are :func:`grade_frame`'s. Awaited in Jupyter, it runs on the notebook's
    own loop, so an async grader whose judge was already used there keeps its connections.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    rows = _mapping(df, mapping)
    if isinstance(grader, SyncGrader):  # its grader lives on the SyncGrader's own loop
        return await asyncio.to_thread(grade_frame, df, grader, mapping, concurrency=concurrency, progress=progress)
    built = load_grader(grader) if isinstance(grader, (str, Path)) else None
    active: Any = built if built is not None else grader
    if not callable(active):
        raise TypeError(f"grader must be an async grader, a SyncGrader or a grader config file, got {type(grader).__name__}")
    try:
        results = await _grade_rows(df, rows, active, concurrency, progress)
    finally:
        if built is not None:
            await aclose_grader(built)
    return _frame(df, results)


def grade_frame(
    df: pd.DataFrame,
    grader: GraderLike,
    mapping: Mapping[str, Hashable] | None = None,
    *,
    concurrency: int = 16,
    progress: Progress = False,
) -> pd.DataFrame:
    """Grade every row of a DataFrame; works in scripts and inside Jupyter's running event loop.

    Args:
        df: one sample per row.
        grader: an async grader, a :class:`SyncGrader`, or the path of a grader YAML/JSON file
            (built with :func:`load_grader` and closed afterwards).
        mapping: {sample path: column}: ``prompt`` or ``messages``, ``response``,
            ``system_instruction``, ``references.<key>``, ``metadata.<key>``. Unmapped, a
            ``messages``/``prompt``/``question`` column is the prompt, a
            ``response``/``completion``/``output`` column the response, and every other column
            a reference of its own name (OpenAI's ``item``): ``{{references.answer}}`` reads
            column ``answer``. Checked before any row is graded.
        concurrency: rows graded at once; a judge's own limiter still paces its requests.
        progress: True for a progress bar, or a callback ``(done, total)``.

    Returns:
        A new DataFrame with ``df``'s index and row order: the input columns (one that a result
        column would overwrite is kept as ``input_<name>``), then ``score``, ``status`` (ok,
        invalid, error), ``error_kind``, ``error``, ``score_<part>`` per part of a composite
        grader and ``metric_<name>`` per grader metric. Every row gets a score or an explicit
        error; an unusable cell is an ``invalid`` row with ``error_kind="input"``.
    """
    if isinstance(grader, SyncGrader):
        return grader._runner.run(agrade_frame(df, grader.grader, mapping, concurrency=concurrency, progress=progress))
    if isinstance(grader, (str, Path)):  # what it builds is closed at the end: a private loop for it alone
        runner = SyncRunner()
        try:
            return runner.run(agrade_frame(df, grader, mapping, concurrency=concurrency, progress=progress))
        finally:
            runner.close()
    return _shared_runner().run(agrade_frame(df, grader, mapping, concurrency=concurrency, progress=progress))


_runner: SyncRunner | None = None
_runner_lock = threading.Lock()


def _shared_runner() -> SyncRunner:
    """One loop thread for every sync call with an async grader the caller keeps.

    Its judge's connection pool belongs to the loop that first used it, so a second grade_frame
    with the same grader must run on the same loop, not a fresh one per call. It holds no client.
    """
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = SyncRunner()
        return _runner


def _mapping(df: pd.DataFrame, mapping: Mapping[str, Hashable] | None) -> RowMapping:
    duplicated = [c for c, n in Counter(df.columns).items() if n > 1]
    if duplicated:
        raise ValueError(f"the DataFrame has duplicate columns {', '.join(map(repr, duplicated))}: rename them so each row maps to one sample")
    return RowMapping.build(mapping, list(df.columns))


async def _grade_rows(df: pd.DataFrame, rows: RowMapping, grader: Grader, concurrency: int, progress: Progress) -> GradeColumns:
    total = len(df)
    columns = list(df.columns)
    labels = df.index.tolist()
    results = GradeColumns(total)
    # One shared iterator: each row goes to exactly one worker, and memory stays one row per worker.
    records = enumerate(df.itertuples(index=False, name=None))
    bar = _Bar(total) if progress is True else None
    report = bar if bar is not None else (progress if callable(progress) else None)
    done = 0

    async def worker() -> None:
        nonlocal done
        for position, cells in records:
            where = f"index {labels[position]!r}"
            try:
                sample = rows.sample(dict(zip(columns, cells)), where)
            except RowError as e:
                grade = Grade.failed("invalid", str(e), error_kind="input")
            else:
                try:
                    grade = await grader(sample)
                except Exception as e:  # a bug in a user's grader is that row's error, not the run's end
                    grade = Grade.failed("error", f"{where}: the grader raised {type(e).__name__}: {e}", error_kind="exception")
                if not isinstance(grade, Grade):
                    grade = Grade.failed("error", f"{where}: the grader returned {type(grade).__name__}, not a Grade", error_kind="exception")
            results.put(position, grade)
            done += 1
            if report is not None and (done % _REPORT_EVERY == 0 or done == total):
                report(done, total)

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, total)))))
    finally:
        if bar is not None:
            bar.close()
    assert done == total
    return results


class _Bar:
    """A rich progress bar, updated in steps of rows."""

    def __init__(self, total: int) -> None:
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(transient=False)
        self._task = self._bar.add_task("grading", total=total)
        self._bar.start()

    def __call__(self, done: int, total: int) -> None:
        self._bar.update(self._task, completed=done)

    def close(self) -> None:
        self._bar.stop()


def _frame(df: pd.DataFrame, graded: GradeColumns) -> pd.DataFrame:
    import pandas as pd

    results = graded.columns()
    inputs = df.set_axis(list(keep_input(dict.fromkeys(df.columns), list(results))), axis=1)
    # Positional, not aligned on the index: a duplicated or unsorted index keeps every row in place.
    return pd.concat([inputs.reset_index(drop=True), pd.DataFrame(results)], axis=1).set_axis(df.index, axis=0)

