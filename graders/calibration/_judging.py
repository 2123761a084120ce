"""A labelled set and judging it under a breaker: what ``cascade fit`` and ``align`` share.

:func:`read_labelled` reads a file of rows with a rubric's variables and a human label, checked
before any request (every label one the rubric offers).

A fit or an alignment asks its judge hundreds of rows before it writes anything. A judge that is
broken (a dead endpoint, a wrong key, a reply never in the rubric's format) is seen by the
breaker every run has (:mod:`gradekit.judge._breaker`, the same rules as ``grade``): the rows
still in flight are cancelled rather than retried to the end, and :class:`BreakerTripped` says
nothing was written and the same command resumes (the judgements made so far are in the cache).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gradekit.judge._breaker import Breaker, BreakerTripped, Trip, breaker_scope

from ._agreement import as_label

if TYPE_CHECKING:
    from gradekit.judge import Rubric

T = TypeVar("T")


def stopped(trip: Trip) -> BreakerTripped:
    return BreakerTripped(trip, f"{trip.describe()}. Stopped early: nothing written; fix the judge and run the same command "
                                "again (with a cache, the judgements made so far come back from it)")


async def judge_all(calls: Sequence[Callable[[], Awaitable[T]]], breaker: Breaker, *, verdict: Callable[[T], Any],
                    concurrency: int, on_done: Callable[[], None] | None = None) -> list[T]:
    """Every call's result in order, at most ``concurrency`` at once; BreakerTripped as soon as the judge is seen broken.

    ``verdict`` reads the Verdict off a result, for the breaker (a row skipped for the budget or for its input is not the judge's).
    """
    if not calls:
        return []
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            if breaker.tripped is not None:
                raise stopped(breaker.tripped)
            found = await call()
        v = verdict(found)
        if v.error_kind not in ("input", "budget"):
            breaker.row(v.status, v.error_kind, v.error, v.raw)
        if breaker.tripped is not None:
            raise stopped(breaker.tripped)
        if on_done is not None:
            on_done()
        return found

    with breaker_scope(breaker):
        tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Labelled:
    """A labelled set: each row's rubric variables, its human label and its id; the file's name and hash."""

    rows: list[dict[str, Any]]
    human: list[Any]
    ids: list[str]  # the --on column's value, else the row's number (1-based)
    name: str
    sha256: str


def read_labelled(path: Path, rubric: Rubric, mapping: Mapping[str, str], human_column: str, on: str | None = None) -> Labelled:
    """The rows of ``path`` (CSV, JSONL or Parquet): the rubric's variables by ``mapping`` and the label in ``human_column``.

    Raises ValueError (an InputError) naming the file, the row and the fix: an unreadable row, a missing column, a key
    given twice, no rows, or a human label the rubric does not offer (for a pairwise rubric: 1, 2 or tie).
    """
    from ..runs._file import _variables, check_columns
    from ..runs._io import InputError, RowError, RunInput

    if not path.exists():
        raise InputError(f"{path}: no such file")
    source = RunInput.resolve(path)
    check_columns(source, rubric, mapping)
    rows: list[dict[str, Any]] = []
    human: list[Any] = []
    ids: list[str] = []
    for number, row in enumerate(source.read(), start=1):
        if isinstance(row, RowError):
            raise InputError(f"{path}: {row}")
        if human_column not in row:
            raise InputError(f"{path} row {number}: no column {human_column!r} with the human label; "
                             f"its columns are {', '.join(row)}; name it with `human_column`")
        key = str(number)
        if on is not None:
            key = as_label(row.get(on)) or ""
            if not key:
                raise InputError(f"{path} row {number}: no value in the key column {on!r} (`on`)")
            if key in ids:
                raise InputError(f"{path} row {number}: key {on}={key!r} appears twice")
        rows.append(_variables(row, rubric, mapping, number))
        human.append(row[human_column])
        ids.append(key)
    if not rows:
        raise InputError(f"{path}: no rows")
    offered = {"1", "2", "tie"} if rubric.pairwise is not None else {str(as_label(lab)).casefold() for lab in rubric.labels}
    unknown = sorted({str(as_label(h)) for h in human if as_label(h) is not None and str(as_label(h)).casefold() not in offered})
    if unknown:
        raise InputError(f"{path}: human labels {', '.join(map(repr, unknown[:5]))} are not labels rubric {rubric.name!r} offers "
                         f"({', '.join(sorted(offered) if rubric.pairwise is not None else rubric.labels)})")
    return Labelled(rows, human, ids, path.name, hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "")
