"""The math_equivalence grader: the response's final answer against the gold one, checked symbolically.

The check is :class:`~graders._math_verify.MathVerifier` (math_verify in sandboxed workers with a
deadline from outside). The mapping to a Grade keeps "could not check" apart from "wrong":

- ``equal`` -> score ``correct`` (1); ``different`` (an empty response too) -> ``wrong`` (-1)
- ``invalid_gold`` -> status ``invalid`` (``error_kind: invalid_gold``): the reference is at fault
- ``error`` -> status ``error`` with ``error_kind`` ``timeout`` or ``verifier_error``; never a score

Each Grade carries the check itself (:meth:`MathEquivalenceGrader.check_of`), so a caller such as
a judge fallback can act on exactly the rows the symbolic check did not accept, and the output
row's ``parsed`` column says what each side was read as.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._math_verify import DEFAULT_MAX_CHARS, DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, MathCheck, MathVerifier
from ._sample import Grade, PlaceholderError, Sample, fill_placeholders
from .sandbox import Policy

CHECK_KEY = "math_check"  # where a Grade keeps its check (in ``columns``; not an output column, so not written)


def parsed_column(check: MathCheck) -> str:
    """The output row's ``parsed`` cell: what each side was read as, short."""
    return json.dumps({"gold": check.gold_parsed, "answer": check.answer_parsed}, ensure_ascii=False)


class MathEquivalenceGrader:
    """A grader that checks the response's answer against ``expression`` (the gold) with math_verify."""

    output_columns: tuple[str, ...] = ("parsed",)  # extra output-row columns (graders.runs writes them)

    def __init__(self, expression: str, *, verifier: MathVerifier, correct: float = 1.0, wrong: float = -1.0,
                 name: str = "math_equivalence", owns_verifier: bool = True) -> None:
        self.expression, self.verifier, self.correct, self.wrong = expression, verifier, correct, wrong
        self.__name__ = name
        self._owns = owns_verifier
        self.isolation = verifier.isolation

    def gold(self, sample: Sample) -> str:
        """The gold answer of a sample (raises PlaceholderError when a referenced key is missing)."""
        if "{{" in self.expression:
            return fill_placeholders(self.expression, sample)
        return self.expression

    async def check(self, sample: Sample) -> MathCheck | Grade:
        """The sample's MathCheck, or an ``invalid`` Grade when its gold cannot even be read."""
        try:
            gold = self.gold(sample)
        except PlaceholderError as e:
            return Grade.failed("invalid", f"{self.__name__}: {e}", error_kind="input")
        return await self.verifier.check(gold, sample.response_text)

    def grade_of(self, check: MathCheck) -> Grade:
        """The Grade a check maps to (see the module docstring)."""
        name = self.__name__
        shown = f"gold {check.gold_parsed!r}, answer {check.answer_parsed!r}"
        debug = [f"{name}: {check.outcome}" + (f" ({check.error_kind})" if check.error_kind else "") + f"; {shown}; {check.detail}"]
        columns = {"parsed": parsed_column(check), CHECK_KEY: check.model_dump()}
        if check.outcome == "equal":
            return Grade.scored(self.correct, debug=debug, columns=columns)
        if check.outcome == "different":
            return Grade.scored(self.wrong, debug=debug, columns=columns)
        if check.outcome == "invalid_gold":
            return Grade.failed("invalid", f"{name}: the gold answer cannot be parsed: {check.detail}", error_kind="invalid_gold",
                                debug=debug, columns=columns)
        what = "timed out" if check.error_kind == "timeout" else "failed"
        return Grade.failed("error", f"{name}: the symbolic check {what}: {check.detail}", error_kind=check.error_kind or "verifier_error",
                            debug=debug, columns=columns)

    @staticmethod
    def check_of(grade: Grade) -> MathCheck | None:
        """The MathCheck a Grade of this grader was made from (None: the row never reached the check)."""
        found = grade.columns.get(CHECK_KEY)
        return MathCheck.model_validate(found) if found is not None else None

    async def __call__(self, sample: Sample) -> Grade:
        checked = await self.check(sample)
        return checked if isinstance(checked, Grade) else self.grade_of(checked)

    def settings(self) -> dict[str, Any]:
        return {"expression": self.expression, "correct": self.correct, "wrong": self.wrong, **self.verifier.settings()}

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if self._owns:
            self.verifier.close()


def math_equivalence_grader(
    expression: str = "{{references.answer}}",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    correct: float = 1.0,
    wrong: float = -1.0,
    parse: str | Sequence[str] = "auto",
    max_chars: int | None = DEFAULT_MAX_CHARS,
    workers: int | None = None,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    sandbox: Policy = "auto",
    name: str | None = None,
    verifier: MathVerifier | None = None,
) -> MathEquivalenceGrader:
    """A grader that checks the response's final answer against the gold one with math_verify.

    Args:
        expression: the gold answer, a template like string_match's (``{{references.answer}}``).
        timeout: seconds per check (hard: the worker is killed and replaced after it).
        correct, wrong: the scores for an equal and a different answer.
        parse: how the response is read: ``auto`` (the last ``\\boxed{}``, then LaTeX, then a plain
            expression), ``boxed``, ``latex``, ``expr`` or a list of them.
        max_chars: a longer response is cut to its last ``max_chars`` characters.
        workers, memory_mb, sandbox: the checker workers (see :class:`MathVerifier`).
        verifier: share one MathVerifier (its settings win over the ones above); not closed with the grader.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("math_equivalence needs an expression: the gold answer, e.g. \"{{references.answer}}\"")
    owns = verifier is None
    if verifier is None:
        verifier = MathVerifier(timeout=timeout, workers=workers, parse=parse, max_chars=max_chars, memory_mb=memory_mb, sandbox=sandbox)
    return MathEquivalenceGrader(expression, verifier=verifier, correct=correct, wrong=wrong, name=name or "math_equivalence",
                                 owns_verifier=owns)

