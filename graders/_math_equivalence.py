"""The verified-answer grader (``type: math_equivalence``, also named ``verified_answer``): the response's
final answer against the gold one, by rule, for every kind of answer.

The check is :class:`~graders._math_verify.MathVerifier` (math_verify and the answer rules in
sandboxed workers with a deadline from outside); ``kind`` says what the answers are (``auto``:
told from the gold; ``number``, ``expression``, ``choice``, ``string``). The mapping to a Grade
keeps "could not check" apart from "wrong":

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

from ._math_verify import DEFAULT_MAX_CHARS, DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, KINDS, MathCheck, MathVerifier, check_kind
from ._sample import Grade, PlaceholderError, Sample, fill_placeholders
from .sandbox import Policy

CHECK_KEY = "math_check"  # where a Grade keeps its check (in ``columns``; not an output column, so not written)


def parsed_column(check: MathCheck) -> str:
    """The output row's ``parsed`` cell: what each side was read as, short, and the kind compared."""
    return json.dumps({"gold": check.gold_parsed, "answer": check.answer_parsed, "kind": check.kind}, ensure_ascii=False)


# Where a row's options come from when ``options:`` is not set: these references keys, else the question.
OPTION_KEYS = ("options", "choices")


class MathEquivalenceGrader:
    """A grader that checks the response's answer against ``expression`` (the gold), by rule, for every kind."""

    output_columns: tuple[str, ...] = ("parsed",)  # extra output-row columns (graders.runs writes them)

    def __init__(self, expression: str, *, verifier: MathVerifier, correct: float = 1.0, wrong: float = -1.0,
                 name: str = "math_equivalence", owns_verifier: bool = True, kind: str = "auto", options: Any = None,
                 aliases: str | None = None) -> None:
        self.expression, self.verifier, self.correct, self.wrong = expression, verifier, correct, wrong
        self.kind, self.options, self.aliases = kind, options, aliases
        self.__name__ = name
        self._owns = owns_verifier
        self.isolation = verifier.isolation

    def gold(self, sample: Sample) -> str:
        """The gold answer of a sample (raises PlaceholderError when a referenced key is missing)."""
        if "{{" in self.expression:
            return fill_placeholders(self.expression, sample)
        return self.expression

    def context(self, sample: Sample) -> dict[str, Any]:
        """What the check needs beside the two answers: the kind, the question, the options, the aliases
        (raises PlaceholderError for a missing key, ValueError for a kind that is none)."""
        kind = fill_placeholders(self.kind, sample).strip() if "{{" in self.kind else self.kind
        out: dict[str, Any] = {"kind": check_kind(kind), "question": sample.prompt_text}
        if isinstance(self.options, str) and "{{" in self.options:
            out["options"] = fill_placeholders(self.options, sample)
        elif self.options is not None:
            out["options"] = self.options
        else:
            found = next((sample.references[k] for k in OPTION_KEYS if isinstance(sample.references, dict) and sample.references.get(k)), None)
            if found is not None:
                out["options"] = found
        if self.aliases is not None:
            text = fill_placeholders(self.aliases, sample) if "{{" in self.aliases else self.aliases
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            out["aliases"] = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        return out

    async def check(self, sample: Sample) -> MathCheck | Grade:
        """The sample's MathCheck, or an ``invalid`` Grade when its gold (or kind) cannot even be read."""
        try:
            gold = self.gold(sample)
            context = self.context(sample)
        except (PlaceholderError, ValueError) as e:
            return Grade.failed("invalid", f"{self.__name__}: {e}", error_kind="input")
        return await self.verifier.check(gold, sample.response_text, **context)

    def grade_of(self, check: MathCheck) -> Grade:
        """The Grade a check maps to (see the module docstring)."""
        name = self.__name__
        shown = f"gold {check.gold_parsed!r}, answer {check.answer_parsed!r}"
        debug = [f"{name}: {check.outcome}" + (f" ({check.error_kind})" if check.error_kind else "") + f"; {check.kind or 'kind unknown'}; "
                 f"{shown}; {check.detail}"]
        columns = {"parsed": parsed_column(check), CHECK_KEY: check.model_dump()}
        if check.outcome == "equal":
            return Grade.scored(self.correct, debug=debug, columns=columns)
        if check.outcome == "different":
            return Grade.scored(self.wrong, debug=debug, columns=columns)
        if check.outcome == "invalid_gold":
            return Grade.failed("invalid", f"{name}: the gold answer cannot be parsed: {check.detail}", error_kind="invalid_gold",
                                debug=debug, columns=columns)
        if check.error_kind == "input":  # the response is no text at all: the sample cannot be graded
            return Grade.failed("invalid", f"{name}: {check.detail}", error_kind="input", debug=debug, columns=columns)
        what = "timed out" if check.error_kind == "timeout" else "failed"
        return Grade.failed("error", f"{name}: the answer check {what}: {check.detail}", error_kind=check.error_kind or "verifier_error",
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
        return {"expression": self.expression, "correct": self.correct, "wrong": self.wrong, **self.verifier.settings(), "kind": self.kind,
                "options": self.options, "aliases": self.aliases}

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if self._owns:
            self.verifier.close()


def math_equivalence_grader(
    expression: str = "{{references.answer}}",
    *,
    kind: str = "auto",
    options: Any = None,
    aliases: str | None = None,
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
    """A grader that checks the response's final answer against the gold one, by rule (``type: math_equivalence``
    or ``verified_answer``).

    Args:
        expression: the gold answer, a template like string_match's (``{{references.answer}}``); a JSON
            list of strings is a list of aliases, any of which counts.
        kind: ``auto`` (told from the gold), ``number``, ``expression``, ``choice`` or ``string``; or a
            template (``{{references.kind}}``) for a file of mixed kinds.
        options: a choice question's options: a template (``{{references.options}}``) or data; default:
            the row's ``options`` or ``choices`` reference, else the options the question lists.
        aliases: a template giving more answers that count (a JSON list or one string).
        timeout: seconds per check (hard: the worker is killed and replaced after it).
        correct, wrong: the scores for an equal and a different answer.
        parse: how the response is read: ``auto`` (the last ``\\boxed{}``; a short response as the answer
            itself; what "the answer is" states; then LaTeX, then a plain expression), ``boxed``,
            ``answer`` (the response is the answer already: no extraction), ``latex``, ``expr`` or a list.
        max_chars: a longer response is cut to its last ``max_chars`` characters.
        workers, memory_mb, sandbox: the checker workers (see :class:`MathVerifier`).
        verifier: share one MathVerifier (its settings win over the ones above); not closed with the grader.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("math_equivalence needs an expression: the gold answer, e.g. \"{{references.answer}}\"")
    if not isinstance(kind, str) or ("{{" not in kind and kind not in KINDS):
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)} (or a template such as \"{{{{references.kind}}}}\")")
    owns = verifier is None
    if verifier is None:
        verifier = MathVerifier(timeout=timeout, workers=workers, parse=parse, max_chars=max_chars, memory_mb=memory_mb, sandbox=sandbox)
    return MathEquivalenceGrader(expression, verifier=verifier, correct=correct, wrong=wrong, name=name or "math_equivalence",
                                 owns_verifier=owns, kind=kind, options=options, aliases=aliases)

