"""Per-step judging (process rewards): ``granularity: step`` gives one verdict per assistant step.

Each assistant step is judged with the steps before it as its context (the trajectory up to and
including it, fitted into the window as any trajectory is, the step itself never dropped), all
steps of a row at once through the judge's one limiter. The row's score is the steps' aggregate
(``step_aggregate``: ``mean``, ``min``, ``last``, ``product`` of the scores, the last meant for
scores in 0..1). A step the judge could not judge is an error of that step, never a 0: the row is
then an error naming the step, its ``steps`` keeping every step's verdict, so a trainer that takes
step rewards sees which step has none.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ._rubric import Rubric, RubricInputError
from ._verdict import StepVerdict, Usage, Verdict


class OnceJudge(Protocol):
    """What per-step judging asks of a judge (judge._client's ``Judge`` meets it): one judgement of one row."""

    async def judge_once(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict: ...


def aggregate(scores: Sequence[float], how: str) -> float:
    """The row's score from its steps' scores (in step order)."""
    if how == "min":
        return min(scores)
    if how == "last":
        return scores[-1]
    if how == "product":
        return math.prod(scores)
    return sum(scores) / len(scores)


async def judge_steps(judge: OnceJudge, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
    """One verdict per assistant step of the row's trajectory, aggregated; see the module's docstring."""
    started = time.perf_counter()
    var = rubric.trajectory_variables[0]
    try:
        steps = rubric.prepare(row)[var]
    except RubricInputError as e:
        return Verdict(status="error", error_kind="input", error=str(e))
    numbers = steps.assistant_steps()
    if not numbers:
        return Verdict(status="error", error_kind="input", error=f"rubric {rubric.name!r}: variable {var!r}: "
                                                                 "the trajectory has no assistant step to judge")
    verdicts = await asyncio.gather(*(judge.judge_once(rubric, {**row, var: steps.upto(n)}) for n in numbers))
    per = [StepVerdict(step=n, status="ok" if v.status == "ok" else ("skipped" if v.status == "skipped" else "error"),
                       score=v.score, label=v.label, rationale=v.rationale, error_kind=v.error_kind, error=v.error, cached=v.cached)
           for n, v in zip(numbers, verdicts)]
    usage: Usage = sum((v.usage for v in verdicts), Usage())
    coverage = verdicts[-1].coverage  # the last step's request shows the most of the trajectory
    common: dict[str, Any] = {"usage": usage, "steps": per, "coverage": coverage, "cached": all(v.cached for v in verdicts),
                              "latency_s": time.perf_counter() - started, "mode": verdicts[-1].read.mode}
    failed = [s for s in per if s.status != "ok"]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more step{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
        skipped = all(s.status == "skipped" for s in failed)
        return Verdict(status="skipped" if skipped else "error", error_kind=first.error_kind,
                       error=f"step {first.step} of {len(per)} steps judged: {first.error_kind}: {first.error}{more}", **common)
    scores = [s.score for s in per if s.score is not None]
    return Verdict(status="ok", score=aggregate(scores, rubric.step_aggregate), label=per[-1].label,
                   rationale=f"{rubric.step_aggregate} of {len(per)} step scores: " + ", ".join(f"{s.score:g}" for s in per), **common)
