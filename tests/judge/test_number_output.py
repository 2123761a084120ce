"""Number outputs and inline templates are rubric features, and every completion is read by one reader.

A rubric whose verdict is a number (``output: {mode: number, range: [lo, hi]}``) is read, checked
and scored in judge/, against the loopback fake: graders do not re-parse it.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gradekit.judge import Rubric, load_rubric
from gradekit.judge._parse import Reading, Unread, read_completion
from gradekit.judge.testing import FakeProvider, Reply

TEMPLATE = "{% block user %}Rate {{ answer }} from 1 to 7.{% endblock %}\n"


def number_rubric(**output) -> Rubric:
    return Rubric.model_validate({"name": "rating", "template": "rating.j2", "inline_template": TEMPLATE,
                                  "variables": {"answer": {"type": "str"}},
                                  "output": {"mode": "number", "rationale_field": None, **output}})


def completion(content: str | None, **message) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content, **message}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    ("reply", "label", "score", "problem"),
    [
        pytest.param("6", "6", 5 / 6, None, id="in_range_rescaled"),
        pytest.param(" 1 ", "1", 0.0, None, id="low_end"),
        pytest.param("9", "9", None, "the reply 9 is outside its range [1, 7]", id="outside_the_range"),
        pytest.param("six", "six", None, "the reply 'six' is not a number", id="not_a_number"),
        pytest.param("nan", "nan", None, "the reply 'nan' is not a number", id="nan_is_not_a_number"),
    ],
)
def test_a_number_reply_is_read_checked_and_scored(reply: str, label: str, score: float | None, problem: str | None) -> None:
    reading = read_completion(number_rubric(range=[1, 7]), completion(reply), "text")
    assert isinstance(reading, Reading) and reading.label == label and reading.problem == problem
    fields = reading.verdict_fields()
    if problem is None:
        assert fields["status"] == "ok" and fields["score"] == pytest.approx(score)
    else:
        assert fields["status"] == "error" and fields["error_kind"] == "parse_failure" and "score" not in fields


def test_a_range_inside_minus_one_to_one_is_the_score_itself_and_no_range_is_clamped() -> None:
    assert read_completion(number_rubric(range=[-1, 1]), completion("-0.25"), "text").score == -0.25
    assert read_completion(number_rubric(), completion("6"), "text").score == 1.0
    assert read_completion(number_rubric(pattern=r"Score: (\d+)"), completion("Thinking... Score: 0"), "text").label == "0"


def test_the_reader_returns_a_typed_failure_for_refusals_truncations_and_unreadable_replies() -> None:
    en = load_rubric("semantic_equivalence_en")
    refused = read_completion(en, completion(None, refusal="no"), "json_schema")
    assert isinstance(refused, Unread) and refused.kind == "refusal" and refused.error == "the judge refused: no"
    cut = {"choices": [{"message": {"content": '{"judgement": "corr'}, "finish_reason": "length"}]}
    assert read_completion(en, cut, "json_schema").kind == "truncated"
    bad = read_completion(en, completion("no json here"), "json_schema")
    assert isinstance(bad, Unread) and bad.kind == "parse_failure" and bad.raw == "no json here"
    thought = read_completion(en, completion('{"rationale": "r", "judgement": "correct"}', reasoning_content="incorrect?"), "json_schema")
    assert isinstance(thought, Reading) and thought.label == "correct" and thought.thinking == "incorrect?"


def test_number_rubrics_are_checked_when_built() -> None:
    with pytest.raises(ValidationError, match="both field and schema"):
        number_rubric(field="result")
    with pytest.raises(ValidationError, match="low < high"):
        number_rubric(range=[7, 1])
    with pytest.raises(ValidationError, match="range is for output mode 'number'"):
        Rubric.model_validate({"name": "r", "template": "t.j2", "inline_template": TEMPLATE, "variables": {"answer": {}},
                               "output": {"mode": "text", "range": [0, 1]}, "labels": {"a": 1}})
    with pytest.raises(ValidationError, match="labels must name at least one label"):
        Rubric.model_validate({"name": "r", "template": "t.j2", "variables": {}, "output": {"mode": "text"}, "labels": {}})
    assert number_rubric().labels == {} and number_rubric().ask_modes == ("text",)
    schema = {"type": "object", "properties": {"result": {"type": "number"}}, "required": ["result"]}
    assert number_rubric(field="result", schema=schema).ask_modes[0] == "json_schema"


def test_an_inline_template_renders_without_a_file() -> None:
    rubric = number_rubric(range=[1, 7])
    assert rubric.render({"answer": "Paris"}) == [{"role": "user", "content": "Rate Paris from 1 to 7."}]


async def test_a_judge_scores_a_number_rubric_and_does_not_reask_a_refused_number(make_judge, fake: FakeProvider) -> None:
    """A number out of range, or a reply that is not a number, is a parse_failure the reply gave in good form:
    one request, and the reply is cached like any other (the same error again from the cache, no request)."""
    judge = make_judge(cache=True)
    rubric = number_rubric(range=[1, 7])
    before = len(fake.chat_requests())
    fake.push(Reply(content="4"), Reply(content="9"), Reply(content="no idea"))
    four = await judge.judge(rubric, {"answer": "a"})
    assert four.status == "ok" and four.label == "4" and four.score == pytest.approx(0.5)
    nine = await judge.judge(rubric, {"answer": "b"})
    assert nine.status == "error" and nine.error_kind == "parse_failure" and nine.error == "the reply 9 is outside its range [1, 7]"
    assert nine.score is None and nine.raw == "9" and nine.usage.requests == 1
    words = await judge.judge(rubric, {"answer": "c"})
    assert words.error == "the reply 'no idea' is not a number" and words.usage.requests == 1
    again = await judge.judge(rubric, {"answer": "b"})
    assert again.cached and again.error == nine.error
    assert len(fake.chat_requests()) - before == 3


async def test_a_json_number_that_missed_the_schema_gives_its_number_once_the_reasks_are_spent(make_judge, fake: FakeProvider) -> None:
    schema = {"type": "object", "properties": {"result": {"type": "number"}}, "required": ["result"], "additionalProperties": False}
    rubric = number_rubric(range=[1, 7], field="result", schema=schema, noun="score_model's result")
    judge = make_judge(cache=True)
    fake.push(*[Reply(content='{"score": 3}')] * 3)  # the first ask and parse_retries (2) re-asks
    verdict = await judge.judge(rubric, {"answer": "d"})
    assert verdict.status == "ok" and verdict.label == "3" and verdict.score == pytest.approx(1 / 3) and verdict.usage.requests == 3
    assert not (await judge.judge(rubric, {"answer": "d"})).cached  # not the schema's reply: never stored
    assert fake.chat_requests()[-1].body["response_format"]["json_schema"]["schema"] == schema
