"""The hybrid answer verifier: the symbolic check decides first, a judge only what it did not accept.

``type: math_equivalence`` with ``judge_fallback: {rubric: NAME}`` wraps the symbolic grader:

- the check says **equal**: the row is correct, no judge call (``decided_by: symbolic``);
- the response is empty: wrong, no judge call either (there is nothing to judge);
- anything else (**different**, an **invalid** gold the rules cannot parse, an **error** such as a
  timeout): the judge is asked in both orders (:mod:`graders._answer_judge`), and the row is
  correct only when both say so (``require: both``; ``either`` takes one). ``decided_by: judge``.
  A judge that calls the row invalid (CompassVerifier's label) makes it ``status=invalid``; a
  judge that fails makes it ``status=error`` with the judge's error kind, never ``wrong``.

Rules accept reliably and reject unreliably (``\\dfrac{\\pi}{2}`` against ``pi/2``, prose, units):
so only their "no" is checked again, and a row the rules could not check at all (a timeout, a
gold in words) gets the judge instead of a masked reward. Every judge call the symbolic path made
needless is counted: two per row it decided (``judge_calls_saved``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from judge import Rubric, Verdict, load_rubric

from ._answer_judge import REQUIRE, AnswerJudgement, Require, check_answer_rubric, judge_answer
from ._sample import Grade, Grader, PlaceholderError, Sample, aclose_grader, fill_placeholders

SYMBOLIC, JUDGE = "symbolic", "judge"
CALLS_PER_ROW = 2  # both orders


class JudgeFallback(BaseModel):
    """``judge_fallback:`` of a ``math_equivalence`` node. The judge itself is the config's ``judge:``
    block (one model, a fleet, a jury) or the command line's (``--model``, ``--cascade``), as for every LLM grader."""

    model_config = ConfigDict(extra="forbid")

    rubric: str = "answer_verification_3way"  # any answer-equivalence rubric (variables references, prediction)
    require: Require = "both"  # both orders must say correct (both), or one (either)


def symbolic_checker(timeout: float, **settings: Any) -> tuple[Callable[[str, str], Awaitable[tuple[str, str | None]]],
                                                             Callable[[], Awaitable[None]]]:
    """(check, aclose): ``await check(gold, response)`` is the engine's (outcome, error_kind) for the pair."""
    from ._math_verify import MathVerifier

    verifier = MathVerifier(timeout=timeout, **settings)

    async def check(gold: str, response: str) -> tuple[str, str | None]:
        result = await verifier.check(gold, response)
        return result.outcome, result.error_kind

    return check, verifier.aclose


def _metrics(judged: AnswerJudgement) -> dict[str, float]:
    verdicts: tuple[Verdict, ...] = judged.verdicts
    return {
        "judge_prompt_tokens": float(sum(v.prompt_tokens for v in verdicts)),
        "judge_completion_tokens": float(sum(v.completion_tokens for v in verdicts)),
        "judge_attempts": float(sum(v.attempts for v in verdicts)),
        "judge_latency_s": max(v.latency_s for v in verdicts),
        "judge_cached": float(sum(v.cached for v in verdicts)),
    }


class HybridGrader:
    """``math_equivalence`` with a judge fallback; a Grader whose grades say which path decided (``decided_by``)."""

    result_columns = ("decided_by",)  # the column a file run adds for this grader (graders.runs._file)

    def __init__(self, symbolic: Grader, judge: Any, rubric: Rubric, *, expression: str, correct: float, wrong: float,
                 require: Require = "both", name: str = "math_equivalence") -> None:
        if require not in REQUIRE:
            raise ValueError(f"judge_fallback.require is both or either, not {require!r}")
        if correct == wrong:
            raise ValueError("judge_fallback needs correct and wrong to differ: the symbolic grade's score says whether it accepted")
        check_answer_rubric(rubric)
        self.symbolic, self.judge, self.rubric = symbolic, judge, rubric
        self.expression, self.correct, self.wrong, self.require = expression, correct, wrong, require
        self.__name__ = name

    async def __call__(self, sample: Sample) -> Grade:
        first = await self.symbolic(sample)
        response = sample.response_text
        if (first.ok and first.score == self.correct) or not response.strip():
            return first.model_copy(update={"decided_by": SYMBOLIC})
        try:
            gold = str(fill_placeholders(self.expression, sample))
        except PlaceholderError:  # no gold answer to show the judge either: the symbolic grade (invalid) stands
            return first.model_copy(update={"decided_by": SYMBOLIC})
        question = sample.prompt_text if any(m.role == "user" for m in sample.messages) else ""
        judged = await judge_answer(self.judge, self.rubric, gold=gold, response=response, question=question, require=self.require)
        name = self.__name__
        debug = [*first.debug, f"{name}: symbolic {first.status}" + (f" {first.score:g}" if first.score is not None else f" ({first.error_kind})")
                 + f"; judge {self.rubric.name} in both orders: {judged.readings[0]}, {judged.readings[1]} -> {judged.decision}"]
        for order, verdict in zip(("gold as reference", "response as reference"), judged.verdicts):
            if verdict.rationale:
                debug.append(f"{name}: judge ({order}): {verdict.rationale[:300]}")
        metrics = {**first.metrics, **_metrics(judged)}
        if judged.decision in ("correct", "incorrect"):
            score = self.correct if judged.decision == "correct" else self.wrong
            return Grade.scored(score, metrics=metrics, debug=debug, decided_by=JUDGE)
        status = "invalid" if judged.decision == "invalid" else "error"
        return Grade.failed(status, f"grader {name!r}: {judged.error_kind}: {judged.error}", error_kind=judged.error_kind,
                            metrics=metrics, debug=debug, decided_by=JUDGE)

    async def aclose(self) -> None:
        await aclose_grader(self.symbolic)


def hybrid_grader(symbolic: Grader, judge: Any, fallback: JudgeFallback, *, expression: str, correct: float, wrong: float,
                  rubric: str | Rubric | None = None, name: str = "math_equivalence") -> HybridGrader:
    """The hybrid of ``symbolic`` (a math_equivalence grader) and ``judge`` (a Judge, Jury or Cascade).

    Args:
        fallback: the rubric and the ``require`` rule.
        expression: the gold answer's template (``{{references.answer}}``): what the judge is shown.
        correct, wrong: the symbolic grader's rewards; a symbolic grade scoring ``correct`` is its acceptance.
        rubric: the loaded rubric, when the caller resolved ``fallback.rubric`` itself (a path relative to a config file).
    """
    spec = rubric if isinstance(rubric, Rubric) else load_rubric(rubric or fallback.rubric)
    return HybridGrader(symbolic, judge, spec, expression=expression, correct=correct, wrong=wrong, require=fallback.require, name=name)
