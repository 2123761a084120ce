"""Judging a labelled set under a breaker: what ``cascade fit`` and ``align`` share.

A fit or an alignment asks its judge hundreds of rows before it writes anything. A judge that is
broken (a dead endpoint, a wrong key, a reply never in the rubric's format) is seen by the
breaker every run has (:mod:`gradekit.judge._breaker`, the same rules as ``grade``): the rows
still in flight are cancelled rather than retried to the end, and :class:`BreakerTripped` says
nothing was written and the same command resumes (the judgements made so far are in the cache).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from gradekit.judge._breaker import Breaker, BreakerTripped, Trip, breaker_scope

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
