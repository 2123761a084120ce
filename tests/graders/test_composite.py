"""Composites: Vertex's weighted mean and OpenAI's formula, their arithmetic and their failure states."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gradekit.graders._composite import FormulaError, compile_formula, formula_grader, weighted_grader
from gradekit.graders import Grade, Sample, load_grader, string_match_grader

from ..cases import cases

DATA = Path(__file__).parents[1] / "data" / "graders"


def fixed(score: float | None, status: str = "ok", error: str | None = None):
    """A grader that always says the same thing: composite arithmetic without other moving parts."""

    async def grade(sample: Sample) -> Grade:
        return Grade(score=score, status=status, error=error)  # type: ignore[arg-type]

    return grade


SAMPLE = Sample(messages="What is the capital of France?", response="Paris", references={"answer": "Paris", "city": "Lyon"})


async def test_weighted_mean_keeps_every_part() -> None:
    right = string_match_grader("{{references.answer}}", correct=1.0, wrong=-1.0)
    wrong = string_match_grader("{{references.city}}", correct=1.0, wrong=-1.0)
    half = fixed(0.5)
    weights = {"right": 2.0, "wrong": 1.0, "half": 1.0}
    grader = weighted_grader({"right": (right, 2.0), "wrong": (wrong, 1.0), "half": (half, 1.0)})
    grade = await grader(SAMPLE)
    parts = {name: part.score for name, part in grade.parts.items()}
    assert parts == {"right": 1.0, "wrong": -1.0, "half": 0.5}
    expected = sum(weights[n] * parts[n] for n in weights) / sum(weights.values())  # type: ignore[operator]
    assert grade.status == "ok"
    assert grade.score == pytest.approx(expected)
    assert grade.metrics["right.score"] == 1.0


async def test_weighted_part_failures_decide_the_state_and_name_the_part() -> None:
    grade = await weighted_grader({"ok": (fixed(1.0), 1), "judge": (fixed(None, "error", "judge unreachable"), 1)})(SAMPLE)
    assert grade.status == "error" and grade.score is None
    assert "judge" in (grade.error or "") and "judge unreachable" in (grade.error or "")
    assert grade.parts["ok"].score == 1.0, "the parts that did work are still reported"
    grade = await weighted_grader({"code": (fixed(None, "invalid", "raised"), 1), "judge": (fixed(None, "error", "down"), 1)})(SAMPLE)
    assert grade.status == "error", "a transient error outranks invalid: retrying may still give a reward"
    grade = await weighted_grader({"code": (fixed(None, "invalid", "raised"), 1), "ok": (fixed(1.0), 3)})(SAMPLE)
    assert grade.status == "invalid" and grade.score is None


def test_weighted_configuration_errors() -> None:
    with pytest.raises(ValueError, match="at most 16"):
        weighted_grader([(f"p{i}", fixed(1.0), 1.0) for i in range(17)])
    with pytest.raises(ValueError, match=">= 0"):
        weighted_grader({"a": (fixed(1.0), -1.0)})
    with pytest.raises(ValueError, match="sum to 0"):
        weighted_grader({"a": (fixed(1.0), 0.0), "b": (fixed(1.0), 0.0)})
    with pytest.raises(ValueError, match="unique"):
        weighted_grader([("a", fixed(1.0), 1.0), ("a", fixed(0.0), 1.0)])
    assert len(weighted_grader([(f"p{i}", fixed(1.0), 1.0) for i in range(16)]).parts) == 16


# ---- the formula -----------------------------------------------------------------------------

VALUES = {"a": 0.5, "b": -0.25, "c": 1.0}
FORMULAS = [
    pytest.param("a + b * c", VALUES["a"] + VALUES["b"] * VALUES["c"], id="precedence"),
    pytest.param("(a + b) * c", (VALUES["a"] + VALUES["b"]) * VALUES["c"], id="parentheses"),
    pytest.param("a ^ 2 + c", VALUES["a"] ** 2 + VALUES["c"], id="caret_is_power_and_binds_tighter_than_plus"),
    pytest.param("2 ^ 3 ^ 2", 2.0 ** 3.0 ** 2.0, id="power_is_right_associative"),
    pytest.param("-a ^ 2", -(VALUES["a"] ** 2), id="unary_minus_below_power"),
    pytest.param("a ** 2", VALUES["a"] ** 2, id="python_power_also"),
    pytest.param("min(a, b, c) + max(a, b)", min(VALUES.values()) + max(VALUES["a"], VALUES["b"]), id="min_max_variadic"),
    pytest.param("abs(b) + floor(2.7) - ceil(0.2)", abs(VALUES["b"]) + math.floor(2.7) - math.ceil(0.2), id="abs_floor_ceil"),
    pytest.param("exp(0) + sqrt(c * 4) + log(100, 10)", math.exp(0) + math.sqrt(4.0) + math.log(100, 10), id="exp_sqrt_log"),
    pytest.param("a / 4", VALUES["a"] / 4, id="division"),
]


@pytest.mark.parametrize(("formula", "expected"), FORMULAS)
def test_formula_arithmetic(formula: str, expected: float) -> None:
    assert compile_formula(formula, list(VALUES))(VALUES) == pytest.approx(expected)


@pytest.mark.parametrize("formula", [
    *cases("formulas_refused"),
    pytest.param("(" * 300 + "a" + ")" * 300, id="nesting"),  # built: it stays here
])
def test_formula_rejects_everything_outside_the_whitelist(formula: str) -> None:
    with pytest.raises(FormulaError):
        compile_formula(formula, list(VALUES))


@pytest.mark.parametrize(("formula", "reason"), [
    ("a / (b - b)", "division"),
    ("sqrt(b)", "domain"),
    ("log(b - b)", "domain"),
    ("exp(1000)", "range"),
    ("10 ^ 400", "range"),
])
async def test_formula_math_errors_are_invalid_not_a_number(formula: str, reason: str) -> None:
    grader = formula_grader({"a": fixed(VALUES["a"]), "b": fixed(VALUES["b"])}, formula)
    grade = await grader(SAMPLE)
    assert grade.status == "invalid" and grade.score is None
    assert reason in (grade.error or "")
    assert set(grade.parts) == {"a", "b"}


async def test_formula_result_is_clamped_and_parts_kept() -> None:
    grade = await formula_grader({"a": fixed(1.0), "b": fixed(1.0)}, "a + b + 1")(SAMPLE)
    assert grade.status == "ok" and grade.score == 1.0
    assert {n: p.score for n, p in grade.parts.items()} == {"a": 1.0, "b": 1.0}
    assert "a + b + 1 = 3" in grade.debug[0], "the unclamped value is in the debug line"


async def test_formula_part_error_is_not_a_number() -> None:
    grade = await formula_grader({"a": fixed(1.0), "judge": fixed(None, "error", "429 until the budget ran out")}, "a + judge")(SAMPLE)
    assert grade.status == "error" and grade.score is None and "429" in (grade.error or "")


async def test_openai_multi_grader_json_loads_and_computes() -> None:
    grader = load_grader(DATA / "formula.json")
    try:
        grade = await grader(Sample(messages="Capital of France?", response="It is PARIS.", references={"answer": "paris"}))
        assert {n: p.score for n, p in grade.parts.items()} == {"exact": 1.0, "short": 1.0}
        assert grade.score == pytest.approx(0.75 * 1.0 + 0.25 * 1.0 ** 2)
        grade = await grader(Sample(messages="Capital of France?", response="It is Lyon, " + "really " * 10, references={"answer": "paris"}))
        assert {n: p.score for n, p in grade.parts.items()} == {"exact": 0.0, "short": 0.0}
        assert grade.score == 0.0
    finally:
        await grader.aclose()


async def test_weighted_yaml_with_a_python_part() -> None:
    grader = load_grader(DATA / "weighted.yaml")
    try:
        grade = await grader(Sample(messages="q", response="<answer> paris </answer> " + "word " * 29, references={"answer": "Paris", "max_words": 20}))
        exact, length = grade.parts["exact"].score, grade.parts["length"].score
        assert exact == 1.0
        words = len(("<answer> paris </answer> " + "word " * 29).split())
        assert length == pytest.approx(max(0.0, 1.0 - (words - 20) / 20))
        assert grade.score == pytest.approx((3 * exact + 1 * length) / 4)  # type: ignore[operator]
    finally:
        await grader.aclose()


async def test_a_composite_grades_usage_is_its_judge_parts_sum(fake, make_judge) -> None:
    """Issue 47: the judge parts' requests and tokens reach the composite's Grade.usage (what a run's summary counts)."""
    from gradekit.graders import llm_grader
    from gradekit.judge import Usage
    from gradekit.judge.testing import Reply

    spent = {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320}
    fake.push(Reply(status=500), Reply(content="<answer>Yes</answer>", usage=spent), Reply(content="<answer>No</answer>", usage=spent))
    judge = make_judge()
    tone = llm_grader(judge, "tone", mapping={"tone": "references.tone"})
    nested = formula_grader({"inner": weighted_grader({"tone": (tone, 1.0), "exact": (fixed(1.0), 1.0)}),
                             "again": llm_grader(judge, "tone", mapping={"tone": "references.tone"})}, "inner + again")
    grade = await nested(SAMPLE.model_copy(update={"references": {"tone": "polite"}}))
    assert grade.status == "ok", grade.error
    assert grade.usage == Usage(prompt_tokens=600, completion_tokens=40, requests=len(fake.chat_requests())) and grade.usage.requests == 3
    assert grade.parts["inner"].parts["exact"].usage is None, "a deterministic part asked no judge"
    assert grade.metrics == {"inner.score": grade.parts["inner"].score, "again.score": grade.parts["again"].score}


async def test_a_composite_without_a_judge_has_no_usage() -> None:
    grade = await weighted_grader({"a": (fixed(1.0), 1.0), "b": (fixed(None, "invalid", "no answer"), 1.0)})(SAMPLE)
    assert grade.status == "invalid" and grade.usage is None and grade.cache_hits == 0
