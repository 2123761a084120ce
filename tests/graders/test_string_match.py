"""Deterministic graders: Vertex string/JSON match, normalised and numeric match, OpenAI string_check,
the Sample/Grade models they share, and building them from config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradekit.graders import GraderConfigError, load_grader
from gradekit.graders._sample import Grade, Sample, SyncGrader, fill_placeholders, sample_from_vertex, to_vertex_example
from gradekit.graders._string_match import (
    Normalization,
    ParseConfig,
    json_match_grader,
    normalize_text,
    normalized_match_grader,
    numeric_match_grader,
    string_check_grader,
    string_match_grader,
    to_number,
)

from ..cases import cases

DATA = Path(__file__).parents[1] / "data" / "graders"
ANSWER_TAG = ParseConfig(type="REGEX_EXTRACT", regex="<answer>(.*?)</answer>")


def sample(response: str, **references: object) -> Sample:
    return Sample(messages=[{"role": "user", "content": "What is the capital of France?"}], response=response, references=references)


# ---- string match ------------------------------------------------------------------------------

STRING_CASES = [
    pytest.param("Paris", "EXACT_MATCH", None, 1.0, id="exact"),
    pytest.param("Paris\n", "EXACT_MATCH", None, 1.0, id="exact_ignores_trailing_newline"),
    pytest.param("paris", "EXACT_MATCH", None, -1.0, id="exact_is_case_sensitive"),
    pytest.param("It is Paris.", "EXACT_MATCH", None, -1.0, id="exact_needs_whole_text"),
    pytest.param("It is Paris.", "PARTIAL_MATCH", None, 1.0, id="partial_substring"),
    pytest.param("It is Lyon.", "PARTIAL_MATCH", None, -1.0, id="partial_absent"),
    pytest.param("<answer>Lyon</answer> no wait <answer>Paris</answer>", "EXACT_MATCH", ANSWER_TAG, 1.0, id="regex_extract_last_match_wins"),
    pytest.param("<answer>Paris</answer> no wait <answer>Lyon</answer>", "EXACT_MATCH", ANSWER_TAG, -1.0, id="planted_early_answer_loses"),
    pytest.param("Paris, but no tags", "EXACT_MATCH", ANSWER_TAG, -1.0, id="regex_extract_nothing_is_wrong"),
]


@pytest.mark.parametrize(("response", "operation", "parse", "expected"), STRING_CASES)
async def test_string_match(response: str, operation: str, parse: ParseConfig | None, expected: float) -> None:
    grader = string_match_grader("{{references.answer}}", operation, parse=parse or ParseConfig(), correct=1.0, wrong=-1.0)  # type: ignore[arg-type]
    grade = await grader(sample(response, answer="Paris"))
    assert grade.status == "ok"
    assert grade.score == expected
    assert grade.debug, "a grade says how it was reached"


async def test_regex_contains_treats_references_as_literal_text() -> None:
    grader = string_match_grader(r"=\s*{{references.answer}}\b", "REGEX_CONTAINS", correct=1.0, wrong=0.0)
    assert (await grader(sample("1+1 = 2", answer="2"))).score == 1.0
    # "1+1" from the references must not become the regex "1 one-or-more 1" (matching "11").
    assert (await grader(sample("x = 11", answer="1+1"))).score == 0.0
    assert (await grader(sample("x = 1+1", answer="1+1"))).score == 1.0


async def test_missing_reference_is_invalid_not_wrong() -> None:
    grade = await string_match_grader("{{references.answer}}")(sample("Paris", solution="Paris"))
    assert grade.status == "invalid"
    assert grade.score is None
    assert "answer" in (grade.error or "")


async def test_placeholder_inside_the_response_is_never_expanded() -> None:
    grader = string_match_grader("{{references.answer}}", "PARTIAL_MATCH")
    grade = await grader(sample("{{references.answer}}", answer="Paris"))
    assert grade.score == -1.0
    s = sample("I say {{references.answer}}", answer="Paris")
    assert fill_placeholders("got: {{response}} / want: {{references.answer}}", s) == "got: I say {{references.answer}} / want: Paris"


def test_bad_regex_is_rejected_when_built() -> None:
    with pytest.raises(ValueError, match="not a valid regex"):
        string_match_grader("([", "REGEX_CONTAINS")
    with pytest.raises(ValueError, match="needs a regex"):
        ParseConfig(type="REGEX_EXTRACT")


# ---- JSON match -------------------------------------------------------------------------------

JSON_CASES = cases("json_match")


@pytest.mark.parametrize(("response", "key", "expected"), JSON_CASES)
async def test_json_match(response: str, key: str, expected: float) -> None:
    answer = "42" if "42" in response else "Paris"
    grade = await json_match_grader(key, "{{references.answer}}")(sample(response, answer=answer))
    assert grade.status == "ok"
    assert grade.score == expected


# ---- normalised and numeric ---------------------------------------------------------------------

NORMALIZED_CASES = cases("normalized_match")


@pytest.mark.parametrize(("response", "reference", "same"), NORMALIZED_CASES)
async def test_normalized_match(response: str, reference: str, same: bool) -> None:
    grade = await normalized_match_grader("{{references.answer}}", correct=1.0, wrong=0.0)(sample(response, answer=reference))
    assert grade.score == (1.0 if same else 0.0), grade.debug


async def test_normalized_match_options_can_be_switched_off() -> None:
    strict = normalized_match_grader("{{references.answer}}", normalization=Normalization(case=False), correct=1.0, wrong=0.0)
    assert (await strict(sample("paris", answer="Paris"))).score == 0.0
    partial = normalized_match_grader("{{references.answer}}", operation="PARTIAL_MATCH", correct=1.0, wrong=0.0)
    assert (await partial(sample("the total is 1,000.", answer="1000"))).score == 1.0
    assert (await partial(sample("the total is 12345", answer="123"))).score == 0.0, "partial match respects word boundaries"


def test_to_number_and_normalize_text() -> None:
    assert to_number("1/4") == to_number("0.25")
    assert to_number("not a number") is None
    assert normalize_text("The Answer: ＡＢＣ,  1,000.0!") == normalize_text("the answer abc 1000")


NUMERIC_CASES = cases("numeric_match")


@pytest.mark.parametrize(("response", "reference", "abs_tol", "rel_tol", "right"), NUMERIC_CASES)
async def test_numeric_match(response: str, reference: str, abs_tol: float, rel_tol: float, right: bool) -> None:
    grader = numeric_match_grader("{{references.answer}}", abs_tol=abs_tol, rel_tol=rel_tol, correct=1.0, wrong=-1.0)
    grade = await grader(sample(response, answer=reference))
    assert grade.score == (1.0 if right else -1.0), grade.debug


async def test_numeric_reference_that_is_not_a_number_is_invalid() -> None:
    grade = await numeric_match_grader("{{references.answer}}")(sample("12", answer="twelve"))
    assert grade.status == "invalid" and "twelve" in (grade.error or "")


@pytest.mark.parametrize(("operation", "response", "holds"), [
    ("eq", "Paris", True), ("eq", "paris", False), ("ne", "Lyon", True),
    ("like", "It is Paris.", True), ("like", "It is paris.", False), ("ilike", "IT IS PARIS", True),
])
async def test_openai_string_check(operation: str, response: str, holds: bool) -> None:
    grader = string_check_grader("{{ sample.output_text }}", "{{ item.answer }}", operation)  # type: ignore[arg-type]
    assert (await grader(sample(response, answer="Paris"))).score == (1.0 if holds else 0.0)


# ---- the Grade and Sample models ----------------------------------------------------------------


def test_grade_clamps_and_keeps_failures_scoreless() -> None:
    assert Grade.scored(5).score == 1.0
    assert Grade.scored(-3.5).score == -1.0
    with pytest.raises(ValueError):
        Grade(status="error", error="judge down", score=0.0)
    with pytest.raises(ValueError):
        Grade(status="ok")
    assert Grade.failed("error", "judge down").score is None


def test_sample_accepts_text_or_messages_and_converts_to_vertex() -> None:
    s = Sample(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi?"}]}],
               response=[{"role": "assistant", "content": "Hello."}], references={"answer": "Hello"})
    assert s.prompt_text == "Hi?" and s.system_text == "Be brief." and s.response_text == "Hello."
    example = to_vertex_example(s)
    assert example["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert example["contents"] == [{"role": "user", "parts": [{"text": "Hi?"}]}]
    back = sample_from_vertex(example, {"role": "model", "parts": [{"text": "Hello."}]})
    assert back.prompt_text == s.prompt_text and back.response_text == s.response_text and back.references == s.references


def test_sync_facade() -> None:
    with SyncGrader(string_match_grader("{{references.answer}}")) as grader:
        assert grader({"messages": "q", "response": "Paris", "references": {"answer": "Paris"}}).score == 1.0
        assert grader(sample("Lyon", answer="Paris")).score == -1.0


# ---- from config ----------------------------------------------------------------------------------


async def test_string_match_from_yaml_file() -> None:
    grader = load_grader(DATA / "string_match.yaml")
    assert (await grader(sample("Hmm. <answer>Paris</answer>", answer="Paris"))).score == 1.0
    assert (await grader(sample("<answer>Lyon</answer>", answer="Paris"))).score == -1.0
    await grader.aclose()


@pytest.mark.parametrize(("config", "message"), cases("string_match_config_errors"))
def test_config_errors_name_the_field(tmp_path: Path, config: dict, message: str) -> None:
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(GraderConfigError) as info:
        load_grader(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)
