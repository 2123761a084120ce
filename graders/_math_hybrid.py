"""The hybrid answer verifier: the symbolic check decides first, a judge only what it did not accept.

``type: math_equivalence`` with ``judge_fallback: {rubric: NAME}`` wraps the symbolic grader:

- the check says **equal**: the row is correct, no judge call (``decided_by: symbolic``);
- the response is empty: wrong, no judge call either (there is nothing to judge);
- anything else (**different**, an **invalid** gold the rules cannot parse, an **error** such as a
  timeout): the judge is asked in both orders (:mod:`gradekit.graders._answer_judge`), and the row is
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
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gradekit.judge import Rubric, Usage, Verdict, load_rubric
from gradekit.judge._rubric import rubric_fingerprint

from ._answer_judge import REQUIRE, AnswerJudgement, Require, check_answer_rubric, judge_answer
from ._math_equivalence import MathEquivalenceGrader
from ._sample import Grade, Sample, aclose_grader

SYMBOLIC, JUDGE = "symbolic", "judge"


class JudgeFallback(BaseModel):
    """``judge_fallback:`` of a ``math_equivalence`` node. The judge itself is the config's ``judge:``
    block (one model, a fleet, a jury) or the command line's (``--model``, ``--cascade``), as for every LLM grader."""

    model_config = ConfigDict(extra="forbid")

    rubric: str = "answer_verification_3way"  # any answer-equivalence rubric (variables references, prediction)
    require: Require = "both"  # both orders must say correct (both), or one (either)


def symbolic_checker(timeout: float, **settings: Any) -> tuple[Callable[[str, str, str], Awaitable[tuple[str, str | None]]],
                                                             Callable[[], Awaitable[None]]]:
    """(check, aclose): ``await check(gold, response, question)`` is the rules' (outcome, error_kind) for the pair
    (``kind: auto``, as the grader's default; the question gives a choice its options)."""
    from ._math_verify import MathVerifier

    verifier = MathVerifier(timeout=timeout, **settings)

    async def check(gold: str, response: str, question: str = "") -> tuple[str, str | None]:
        result = await verifier.check(gold, response, question=question)
        return result.outcome, result.error_kind

    return check, verifier.aclose


def _metrics(judged: AnswerJudgement, usage: Usage) -> dict[str, float]:
    verdicts: tuple[Verdict, ...] = judged.verdicts
    return {
        "judge_prompt_tokens": float(usage.prompt_tokens),
        "judge_completion_tokens": float(usage.completion_tokens),
        "judge_attempts": float(usage.requests),
        "judge_latency_s": max(v.latency_s for v in verdicts),
        "judge_cached": float(sum(v.cached for v in verdicts)),
    }


class HybridGrader:
    """``math_equivalence`` with a judge fallback; a Grader whose rows say which path decided (``decided_by``)."""

    def __init__(self, symbolic: MathEquivalenceGrader, judge: Any, rubric: Rubric, *, require: Require = "both") -> None:
        if require not in REQUIRE:
            raise ValueError(f"judge_fallback.require is both or either, not {require!r}")
        check_answer_rubric(rubric)
        self.symbolic, self.judge, self.rubric, self.require = symbolic, judge, rubric, require
        self.__name__ = symbolic.__name__
        self.isolation = symbolic.isolation
        # The symbolic grader's columns (parsed) and the path that decided; graders.runs writes them on every row.
        self.output_columns: tuple[str, ...] = (*symbolic.output_columns, "decided_by")

    async def __call__(self, sample: Sample) -> Grade:
        first = await self.symbolic(sample)
        check = self.symbolic.check_of(first)
        response = sample.response_text
        if check is None:
            # No gold answer (an invalid row): neither path decided it, and no judge call was saved, as none was possible.
            return self._decided(first, None)
        if check.outcome == "equal" or not response.strip():
            # Accepted, or nothing to judge (an empty response): the rules decided, two judge calls saved.
            return self._decided(first, SYMBOLIC)
        gold = self.symbolic.gold(sample)
        question = sample.prompt_text if any(m.role == "user" for m in sample.messages) else ""
        judged = await judge_answer(self.judge, self.rubric, gold=gold, response=response, question=question, require=self.require)
        name = self.__name__
        debug = [*first.debug, f"{name}: symbolic {check.outcome}" + (f" ({check.error_kind})" if check.error_kind else "")
                 + f"; judge {self.rubric.name} in both orders: {judged.readings[0]}, {judged.readings[1]} -> {judged.decision}"]
        for order, verdict in zip(("gold as reference", "response as reference"), judged.verdicts):
            if verdict.rationale:
                debug.append(f"{name}: judge ({order}): {verdict.rationale[:300]}")
            if verdict.status != "ok" and verdict.error:
                debug.append(f"{name}: judge ({order}) {verdict.error_kind}: {verdict.error[:300]}")
        usage = sum((v.usage for v in judged.verdicts), Usage())
        fields = {"metrics": {**first.metrics, **_metrics(judged, usage)}, "debug": debug, "columns": {**first.columns, "decided_by": JUDGE},
                  "usage": usage, "cache_hits": sum(v.cached for v in judged.verdicts)}
        if judged.decision in ("correct", "incorrect"):
            return Grade.scored(self.symbolic.correct if judged.decision == "correct" else self.symbolic.wrong, **fields)
        status = "invalid" if judged.decision == "invalid" else "error"
        return Grade.failed(status, f"grader {name!r}: {judged.error_kind}: {judged.error}", error_kind=judged.error_kind, **fields)

    @staticmethod
    def _decided(grade: Grade, path: str | None) -> Grade:
        return grade.model_copy(update={"columns": {**grade.columns, "decided_by": path}})

    def settings(self) -> dict[str, Any]:
        return {**self.symbolic.settings(), "judge_fallback": {"rubric": rubric_fingerprint(self.rubric), "require": self.require}}

    async def aclose(self) -> None:
        await aclose_grader(self.symbolic)


def hybrid_grader(symbolic: MathEquivalenceGrader, judge: Any, fallback: JudgeFallback | None = None, *,
                  rubric: str | Path | Rubric | None = None) -> HybridGrader:
    """The hybrid of ``symbolic`` (a math_equivalence grader) and ``judge`` (a Judge, Jury or Cascade).

    Args:
        fallback: the rubric and the ``require`` rule (default: answer_verification_3way, both).
        rubric: the rubric (a name, a path or a loaded one) when the caller resolved ``fallback.rubric``
            itself, e.g. a path relative to a config file.
    """
    fallback = fallback or JudgeFallback()
    spec = rubric if isinstance(rubric, Rubric) else load_rubric(rubric or fallback.rubric)
    return HybridGrader(symbolic, judge, spec, require=fallback.require)
