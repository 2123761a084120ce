"""Deterministic graders: Vertex's string and JSON match, normalised match and numeric tolerance.

Each one parses the response first (``IDENTITY``, or ``REGEX_EXTRACT`` keeping the *last*
match, as Vertex does: a model's final answer follows its reasoning), fills ``{{references.key}}``
placeholders in the expected expression from the sample, compares, and gives the configured
reward for right or wrong. A sample missing a referenced key is ``invalid``, never "wrong".
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ._sample import Grade, Grader, PlaceholderError, Sample, fill_placeholders

ParseType = Literal["IDENTITY", "REGEX_EXTRACT"]
MatchOperation = Literal["EXACT_MATCH", "PARTIAL_MATCH", "REGEX_CONTAINS"]


class ParseConfig(BaseModel):
    """How to cut the answer out of a response before comparing it (Vertex's parseResponseConfig)."""

    model_config = ConfigDict(extra="forbid")

    type: ParseType = "IDENTITY"
    regex: str | None = None  # REGEX_EXTRACT: group 1 if the pattern has one, else the whole match

    @model_validator(mode="after")
    def _check(self) -> ParseConfig:
        if self.type == "REGEX_EXTRACT":
            if not self.regex:
                raise ValueError("parse type REGEX_EXTRACT needs a regex")
            try:
                re.compile(self.regex)
            except re.error as e:
                raise ValueError(f"parse regex {self.regex!r} is not a valid regex: {e}") from e
        return self


IDENTITY = ParseConfig()


def parse_response(text: str, parse: ParseConfig) -> str | None:
    """The part of ``text`` to compare; None when REGEX_EXTRACT finds nothing."""
    if parse.type == "IDENTITY":
        return text
    assert parse.regex is not None
    last = None
    for last in re.finditer(parse.regex, text, re.DOTALL):
        pass
    if last is None:
        return None
    return last.group(1) if last.re.groups else last.group(0)


def _check_regex(expression: str, operation: str) -> None:
    if operation == "REGEX_CONTAINS" and "{{" not in expression:
        try:
            re.compile(expression)
        except re.error as e:
            raise ValueError(f"REGEX_CONTAINS expression {expression!r} is not a valid regex: {e}") from e


def match(parsed: str, expected: str, operation: MatchOperation) -> bool:
    """Vertex's three operations. EXACT_MATCH ignores surrounding whitespace (a trailing newline)."""
    if operation == "EXACT_MATCH":
        return parsed.strip() == expected.strip()
    if operation == "PARTIAL_MATCH":
        return expected.strip() in parsed
    return re.search(expected, parsed, re.DOTALL) is not None


def _expected(sample: Sample, expression: str, operation: str) -> str:
    # Reference values are data: inside a regex they are escaped, so "1+1" matches literally.
    return fill_placeholders(expression, sample, escape=re.escape if operation == "REGEX_CONTAINS" else None)


def _missing(name: str, e: PlaceholderError) -> Grade:
    return Grade.failed("invalid", f"grader {name!r}: {e}", error_kind="input")


def _prepare(sample: Sample, name: str, expression: str, operation: str, parse: ParseConfig,
             correct: float, wrong: float) -> tuple[str, str] | Grade:
    """The expected text and the parsed response, or the Grade that ends grading early."""
    try:
        expected = _expected(sample, expression, operation)
    except PlaceholderError as e:
        return _missing(name, e)
    parsed = parse_response(sample.response_text, parse)
    if parsed is None:
        return _result(name, False, correct, wrong, [f"{name}: parse regex {parse.regex!r} found nothing in the response"])
    return expected, parsed


def _result(name: str, right: bool, correct: float, wrong: float, debug: list[str]) -> Grade:
    debug.append(f"{name}: {'match' if right else 'no match'} -> {correct if right else wrong:g}")
    return Grade.scored(correct if right else wrong, debug=debug)


def string_match_grader(
    expression: str,
    operation: MatchOperation = "EXACT_MATCH",
    *,
    parse: ParseConfig = IDENTITY,
    correct: float = 1.0,
    wrong: float = -1.0,
    name: str = "string_match",
) -> Grader:
    """Vertex's stringMatchRewardScorer.

    Args:
        expression: the expected text (a regex for REGEX_CONTAINS); ``{{references.key}}``
            and the other sample placeholders are filled in per sample.
        operation: EXACT_MATCH, PARTIAL_MATCH (expected is a substring) or REGEX_CONTAINS.
        parse: IDENTITY or REGEX_EXTRACT (last match) applied to the response first.
        correct, wrong: the rewards; wrong is also given when REGEX_EXTRACT finds nothing.
    """
    return _match_grader(expression, operation, parse, correct, wrong, name, lambda parsed: (parsed, "parsed"))


def _match_grader(expression: str, operation: MatchOperation, parse: ParseConfig, correct: float, wrong: float, name: str,
                  read: Callable[[str], tuple[str, str]]) -> Grader:
    """The string-match grade both Vertex scorers give: ``read`` the text to match from the parsed response, as
    (text, how the debug line names it); a ValueError from it is a wrong answer, with its message."""
    _check_regex(expression, operation)

    async def grade(sample: Sample) -> Grade:
        prepared = _prepare(sample, name, expression, operation, parse, correct, wrong)
        if isinstance(prepared, Grade):
            return prepared
        expected, parsed = prepared
        try:
            text, shown = read(parsed)
        except ValueError as e:
            return _result(name, False, correct, wrong, [f"{name}: {e}"])
        return _result(name, match(text, expected, operation), correct, wrong,
                       [f"{name}: {shown} {text[:200]!r} vs {expected[:200]!r} ({operation})"])

    grade.__name__ = name
    return grade


def _json_value(text: str) -> Any:
    """The JSON in a response: the whole text, a ```json fence, or else the last object in prose."""
    stripped = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", stripped, re.DOTALL)
    if fence:
        stripped = fence.group(1)
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    for start in reversed([m.start() for m in re.finditer(r"\{", stripped)]):
        try:
            value, _ = decoder.raw_decode(stripped, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError("the response holds no JSON object")


def json_match_grader(
    key: str,
    expression: str,
    operation: MatchOperation = "EXACT_MATCH",
    *,
    parse: ParseConfig = IDENTITY,
    correct: float = 1.0,
    wrong: float = -1.0,
    name: str = "json_match",
) -> Grader:
    """Vertex's jsonMatchExpression: read ``key`` (dots go into nested objects) from the JSON in the
    response and string-match its value. No JSON, or no such key, is a wrong answer."""

    def read(parsed: str) -> tuple[str, str]:
        value: Any = _json_value(parsed)
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"the JSON has no key {key!r}")
            value = value[part]
        return (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)), f"{key} ="

    return _match_grader(expression, operation, parse, correct, wrong, name, read)


# ---- normalised and numeric -------------------------------------------------------------------

_NUMBER = re.compile(
    r"[-+]?(?:\d{1,3}(?:[,_\u202f\u2009](?:\d{3}))+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:/\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?"
)
_MINUS = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-", "\ufe63": "-", "\uff0d": "-"})


def to_number(text: str) -> Fraction | None:
    """A number however it is written: 1,000 / 1000.0 / 1e3 / ＋１０００ / 1/2 / −3. None if not one."""
    cleaned = unicodedata.normalize("NFKC", text).translate(_MINUS).strip().rstrip(".")
    cleaned = re.sub(r"(?<=\d)[,_\u202f\u2009 ](?=\d{3}\b)", "", cleaned)
    try:
        if "/" in cleaned:
            top, _, bottom = cleaned.partition("/")
            return Fraction(top.strip()) / Fraction(bottom.strip())
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _canonical_number(match: re.Match[str]) -> str:
    number = to_number(match.group(0))
    if number is None:
        return match.group(0)
    if number.denominator == 1:
        return str(number.numerator)
    decimal = Decimal(number.numerator) / Decimal(number.denominator)
    # A terminating decimal reads as one (0.5); anything else stays a fraction (1/3).
    return format(decimal.normalize(), "f") if Fraction(decimal) == number else str(number)


class Normalization(BaseModel):
    """Which surface differences normalised match ignores."""

    model_config = ConfigDict(extra="forbid")

    case: bool = True
    whitespace: bool = True
    punctuation: bool = True
    width: bool = True  # full-width Ａ１ -> A1 (NFKC)
    numbers: bool = True  # 1,000 == 1000.0 == 1e3; 0.5 == 1/2


DEFAULT_NORMALIZATION = Normalization()


def normalize_text(text: str, how: Normalization = DEFAULT_NORMALIZATION) -> str:
    if how.width:
        text = unicodedata.normalize("NFKC", text)
    if how.numbers:
        text = _NUMBER.sub(_canonical_number, text.translate(_MINUS))
    if how.case:
        text = text.casefold()
    if how.punctuation:
        # Keep the characters numbers need when they sit between digits (0.5, 1/2, -3).
        text = "".join(
            " " if unicodedata.category(ch).startswith(("P", "S")) and not (ch in "./-" and _between_digits(text, i)) else ch
            for i, ch in enumerate(text)
        )
    if how.whitespace:
        text = " ".join(text.split())
    return text.strip()


def _between_digits(text: str, i: int) -> bool:
    return (i + 1 < len(text) and text[i + 1].isdigit()) and (text[i] == "-" or (i > 0 and text[i - 1].isdigit()))


def normalized_match_grader(
    expression: str,
    *,
    operation: Literal["EXACT_MATCH", "PARTIAL_MATCH"] = "EXACT_MATCH",
    parse: ParseConfig = IDENTITY,
    normalization: Normalization = DEFAULT_NORMALIZATION,
    correct: float = 1.0,
    wrong: float = -1.0,
    name: str = "normalized_match",
) -> Grader:
    """String match after folding case, whitespace, punctuation, full-width forms and number spellings."""

    async def grade(sample: Sample) -> Grade:
        try:
            expected = normalize_text(fill_placeholders(expression, sample), normalization)
        except PlaceholderError as e:
            return _missing(name, e)
        parsed = parse_response(sample.response_text, parse)
        if parsed is None:
            return _result(name, False, correct, wrong, [f"{name}: parse regex {parse.regex!r} found nothing in the response"])
        got = normalize_text(parsed, normalization)
        right = got == expected if operation == "EXACT_MATCH" else bool(expected) and _contains_words(got, expected)
        return _result(name, right, correct, wrong, [f"{name}: normalised {got[:200]!r} vs {expected[:200]!r}"])

    grade.__name__ = name
    return grade


def _contains_words(text: str, words: str) -> bool:
    # On word boundaries, so "12" is not found in "123".
    return re.search(rf"(?<!\w){re.escape(words)}(?!\w)", text) is not None


def numeric_match_grader(
    expression: str,
    *,
    abs_tol: float = 0.0,
    rel_tol: float = 1e-9,
    parse: ParseConfig = IDENTITY,
    correct: float = 1.0,
    wrong: float = -1.0,
    name: str = "numeric_match",
) -> Grader:
    """Right when the last number in the (parsed) response is within tolerance of the expected one.

    ``|got - expected| <= max(abs_tol, rel_tol * |expected|)``. A reference that is not a
    number makes the sample invalid; a response without a number is wrong.
    """

    async def grade(sample: Sample) -> Grade:
        try:
            raw = fill_placeholders(expression, sample)
        except PlaceholderError as e:
            return _missing(name, e)
        expected = to_number(raw)
        if expected is None:
            return Grade.failed("invalid", f"grader {name!r}: expected value {raw[:80]!r} is not a number", error_kind="input")
        parsed = parse_response(sample.response_text, parse)
        numbers = _numbers(parsed or "")
        if not numbers:
            return _result(name, False, correct, wrong, [f"{name}: no number in the response"])
        got = numbers[-1]
        limit = max(abs_tol, rel_tol * abs(float(expected)))
        right = abs(float(got - expected)) <= limit
        return _result(name, right, correct, wrong, [f"{name}: {float(got):g} vs {float(expected):g} (tolerance {limit:g})"])

    grade.__name__ = name
    return grade


def _numbers(text: str) -> list[Fraction]:
    text = unicodedata.normalize("NFKC", text).translate(_MINUS)
    found = (to_number(m.group(0)) for m in _NUMBER.finditer(text))
    return [n for n in found if n is not None]



def string_check_grader(input: str, reference: str, operation: Literal["eq", "ne", "like", "ilike"] = "eq", *,
                        name: str = "string_check") -> Grader:
    """OpenAI's string_check: ``input`` and ``reference`` are templates such as
    ``{{ sample.output_text }}`` and ``{{ item.answer }}``; eq / ne compare exactly, like / ilike
    test containment (ilike ignoring case). 1 when the check holds, else 0, as on OpenAI."""
    if operation not in ("eq", "ne", "like", "ilike"):
        raise ValueError(f"string_check {name!r}: operation must be eq, ne, like or ilike, not {operation!r}")

    async def grade(sample: Sample) -> Grade:
        try:
            got, want = fill_placeholders(input, sample), fill_placeholders(reference, sample)
        except PlaceholderError as e:
            return _missing(name, e)
        holds = {
            "eq": got == want,
            "ne": got != want,
            "like": want in got,
            "ilike": want.casefold() in got.casefold(),
        }[operation]
        return _result(name, holds, 1.0, 0.0, [f"{name}: {got[:200]!r} {operation} {want[:200]!r}"])

    grade.__name__ = name
    return grade
