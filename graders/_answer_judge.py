"""An answer-equivalence judge asked in both orders: the gold answer and the response trade places.

The hybrid ``math_equivalence`` grader (``judge_fallback:``) and ``gradekit meta-eval --suite
answer-verification`` share this one rule. A judge reading "reference" and "prediction" slots
leans towards one side (NeMo Gym's ``math_with_judge`` and verifiers' ``HybridMathRubric`` ask
twice for that reason); asking with the two swapped and requiring both to agree removes the lean.

Both orders are always sent, at once, so every row the symbolic check did not accept costs
exactly two judge requests (fewer only when the cache answers). Per order the verdict reads:
a positive score is "correct"; a label the rubric names invalid is "invalid"; any other score
(0 or below, e.g. NOT_ATTEMPTED) is "incorrect"; a failed verdict is an error.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from gradekit.judge import Rubric, Verdict

Require = Literal["both", "either"]
REQUIRE: tuple[str, ...] = ("both", "either")
# The rubric variables the two answers go into; every shipped answer rubric has them.
GOLD_VARIABLE, ANSWER_VARIABLE = "references", "prediction"

OrderReading = Literal["correct", "incorrect", "invalid", "error"]


@dataclass(frozen=True)
class AnswerJudgement:
    """What the judge decided about one (gold, response) pair over both orders."""

    decision: OrderReading  # "error": no decision (an order failed and none said incorrect)
    readings: tuple[OrderReading, OrderReading]  # (gold as reference, response as reference)
    verdicts: tuple[Verdict, Verdict]
    error_kind: str | None = None
    error: str | None = None

    @property
    def requests(self) -> int:
        return sum(v.usage.requests for v in self.verdicts)


def check_answer_rubric(rubric: Rubric) -> None:
    """Raise ValueError unless the rubric takes a gold answer and a response in ``references`` and ``prediction``."""
    missing = [v for v in (GOLD_VARIABLE, ANSWER_VARIABLE) if v not in rubric.variables]
    if missing:
        raise ValueError(f"rubric {rubric.name!r} is not an answer-equivalence rubric: it lacks the variable(s) "
                         f"{', '.join(missing)} (the gold answer goes into references, the response into prediction; "
                         "e.g. answer_verification_3way, answer_verification_yes_no, semantic_equivalence_en)")
    if rubric.pairwise is not None:
        raise ValueError(f"rubric {rubric.name!r} is pairwise (which of two outputs is better), not an answer-equivalence rubric")
    if not any(score > 0 for score in rubric.labels.values()):
        raise ValueError(f"rubric {rubric.name!r} has no label with a positive score, so no verdict could say 'correct'")


def reading(rubric: Rubric, verdict: Verdict) -> OrderReading:
    """One order's verdict as correct / incorrect / invalid / error."""
    if verdict.status != "ok" or verdict.score is None:
        return "error"
    if rubric.is_invalid(verdict.label):
        return "invalid"
    return "correct" if verdict.score > 0 else "incorrect"


def decide(readings: tuple[OrderReading, OrderReading], require: Require) -> OrderReading:
    """The pair's decision. ``both``: correct only when both orders say so; ``either``: when one does.

    Then a single "incorrect" decides; then "invalid" (the judge says the row cannot be graded);
    an order that failed leaves the row without a decision rather than guessing from the other.
    """
    if require == "both" and readings == ("correct", "correct"):
        return "correct"
    if require == "either" and "correct" in readings:
        return "correct"
    for outcome in ("incorrect", "invalid"):
        if outcome in readings:
            return outcome  # type: ignore[return-value]
    return "error"


async def judge_answer(judge: Any, rubric: Rubric, *, gold: str, response: str, question: str | None = None,
                       require: Require = "both") -> AnswerJudgement:
    """Ask ``judge`` (a Judge, Jury or Cascade) in both orders and decide; never raises for a judge failure."""
    base: dict[str, Any] = {} if question is None else {"question": question}
    rows = ({**base, GOLD_VARIABLE: [gold], ANSWER_VARIABLE: response},
            {**base, GOLD_VARIABLE: [response], ANSWER_VARIABLE: gold})
    verdicts = await asyncio.gather(*(judge.judge(rubric, row) for row in rows))
    readings = (reading(rubric, verdicts[0]), reading(rubric, verdicts[1]))
    decision = decide(readings, require)
    error_kind = error = None
    if decision == "error":
        failed = next(v for v, r in zip(verdicts, readings) if r == "error")
        error_kind, error = failed.error_kind or failed.status, failed.error
    elif decision == "invalid":
        label = next(v.label for v, r in zip(verdicts, readings) if r == "invalid")
        error_kind, error = "judged_invalid", f"the judge labelled the row {label!r}, which rubric {rubric.name!r} names invalid"
    return AnswerJudgement(decision, readings, (verdicts[0], verdicts[1]), error_kind, error)
