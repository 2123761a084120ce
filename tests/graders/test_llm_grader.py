"""LLM graders over HTTP to the loopback fake provider: rubric graders and Vertex's autorater form."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradekit.graders import ParseConfig, Sample, autorater_grader, llm_grader, load_grader
from gradekit.judge import RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

DATA = Path(__file__).parents[1] / "data" / "graders"
ANSWER_TAG = ParseConfig(type="REGEX_EXTRACT", regex="<answer>(.*?)</answer>")


def semantic_judge(body: dict) -> Reply:
    """Reads the rendered rubric like a model would: correct iff a reference appears in the prediction."""
    user = body["messages"][-1]["content"]
    prediction = re.search(r"<prediction>\n(.*?)\n</prediction>", user, re.S).group(1)  # type: ignore[union-attr]
    block = re.search(r"<references>\n(.*?)</references>", user, re.S).group(1)  # type: ignore[union-attr]
    references = re.findall(r"^- (.*)$", block, re.M)
    hit = any(r.lower() in prediction.lower() for r in references)
    return Reply(content=json.dumps({"rationale": f"reference {'found' if hit else 'absent'}", "judgement": "correct" if hit else "incorrect"}))


def last_user(fake: FakeProvider, index: int = -1) -> str:
    return fake.chat_requests()[index].body["messages"][-1]["content"]  # type: ignore[index]


async def test_rubric_grader_reads_the_sample_and_scores(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(semantic_judge)
    grader = llm_grader(make_judge(), "semantic_equivalence_en")
    sample = Sample(messages=[{"role": "user", "content": "What is the capital of France?"}], response="I believe it is Paris.",
                    references={"answer": "Paris"})
    grade = await grader(sample)
    assert grade.status == "ok" and grade.score == 1.0
    user = last_user(fake)
    assert "What is the capital of France?" in user and "I believe it is Paris." in user and "- Paris" in user
    assert any("reference found" in line for line in grade.debug)
    assert grade.metrics["judge_attempts"] == 1.0
    wrong = await grader(sample.with_response("Lyon"))
    assert wrong.score == 0.0, "semantic_equivalence_en scores incorrect as 0"


async def test_explicit_mapping(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(semantic_judge)
    grader = llm_grader(make_judge(), "semantic_equivalence_en", {"question": "metadata.q", "references": "references.gold"}, name="se")
    sample = Sample(messages="ignored", response="Berlin", references={"gold": ["Berlin", "Berlin, Germany"]}, metadata={"q": "Capital of Germany?"})
    grade = await grader(sample)
    assert grade.score == 1.0
    user = last_user(fake)
    assert "Capital of Germany?" in user and "- Berlin, Germany" in user
    with pytest.raises(ValueError, match="does not have"):
        llm_grader(make_judge(), "semantic_equivalence_en", {"answer": "response"})


async def test_sample_without_a_rubric_variable_is_invalid_and_sends_nothing(fake: FakeProvider, make_judge) -> None:
    grade = await llm_grader(make_judge(), "semantic_equivalence_en")(Sample(messages="Capital of France?", response="Paris"))
    assert grade.status == "invalid" and grade.score is None
    assert "references" in (grade.error or "")
    assert fake.chat_requests() == []


@pytest.mark.parametrize(("reply", "kind"), [
    pytest.param(Reply(status=503), "server_error", id="server_error"),
    pytest.param(Reply(status=429, headers={"Retry-After": "1"}), "rate_limited", id="rate_limited"),
    pytest.param(Reply(content="I would rather not say."), "parse_failure", id="parse_failure"),
    pytest.param(Reply(refusal="I can't help with that."), "refusal", id="refusal"),
])
async def test_judge_failure_is_an_error_grade_without_a_score(fake: FakeProvider, make_judge, reply: Reply, kind: str) -> None:
    fake.set_responder(lambda body: reply)
    grader = llm_grader(make_judge(retry=RetryPolicy(max_attempts=2, parse_retries=1)), "semantic_equivalence_en")
    grade = await grader(Sample(messages="Capital of France?", response="Paris", references={"answer": "Paris"}))
    assert grade.status == "error" and grade.score is None
    assert grade.error_kind == kind and kind in (grade.error or "")


# ---- Vertex's autorater ----------------------------------------------------------------------

PROMPT = "Question: {{prompt}}\nAnswer: {{response}}\nIs the answer {{references.tone}}? Reply <answer>Yes</answer> or <answer>No</answer>."


def tone_judge(body: dict) -> Reply:
    """Says Yes iff the answer line contains 'please', after quoting the prompt's menu of verdicts."""
    answer = re.search(r"^(?:Answer|The assistant answered): (.*)$", body["messages"][-1]["content"], re.M).group(1)  # type: ignore[union-attr]
    verdict = "Yes" if "please" in answer.lower() else "No"
    return Reply(content=f"I must reply <answer>Yes</answer> or <answer>No</answer>. On reflection <answer>{verdict}</answer>")


async def test_autorater_exact_match_reads_the_tag(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(tone_judge)
    grader = autorater_grader(make_judge(), PROMPT, parse=ANSWER_TAG, expression="Yes", correct=1.0, wrong=-1.0)
    sample = Sample(messages="Can I get a refund?", response="Please send us the receipt.", references={"tone": "polite"})
    grade = await grader(sample)
    assert grade.score == 1.0
    assert last_user(fake) == ("Question: Can I get a refund?\nAnswer: Please send us the receipt.\n"
                               "Is the answer polite? Reply <answer>Yes</answer> or <answer>No</answer>.")
    assert (await grader(sample.with_response("Send the receipt."))).score == -1.0
    # Two different verdicts (one may be quoted from the graded answer) are no verdict at all.
    fake.set_responder(lambda body: Reply(content="At first glance <answer>No</answer>, but on reflection <answer>Yes</answer>"))
    grade = await grader(sample)
    assert (grade.status, grade.score, grade.error_kind) == ("error", None, "parse_failure") and "ambiguous_verdict" in (grade.error or "")


async def test_autorater_never_expands_placeholders_from_the_response(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(tone_judge)
    grader = autorater_grader(make_judge(), PROMPT, parse=ANSWER_TAG, expression="Yes")
    await grader(Sample(messages="q", response="{{references.secret}} {{ prompt }}", references={"tone": "polite", "secret": "s3cr3t"}))
    sent = last_user(fake)
    assert "s3cr3t" not in sent and "Answer: {{references.secret}} {{ prompt }}" in sent


async def test_autorater_expression_from_references(fake: FakeProvider, make_judge) -> None:
    fake.push(Reply(content="<answer>B</answer>"), Reply(content="<answer>B</answer>"))
    grader = autorater_grader(make_judge(), "Which option is right? {{response}}", parse=ANSWER_TAG,
                              expression="{{references.option}}", correct=1.0, wrong=0.0)
    assert (await grader(Sample(messages="q", response="x", references={"option": "B"}))).score == 1.0
    assert (await grader(Sample(messages="q", response="x", references={"option": "C"}))).score == 0.0


@pytest.mark.parametrize(("reply", "score", "status"), [
    ("Reasoning... <score>0.8</score>", 0.8, "ok"),
    ("<score>-2</score>", -1.0, "ok"),
    ("<score>high</score>", None, "error"),
])
async def test_autorater_numeric_reply(fake: FakeProvider, make_judge, reply: str, score: float | None, status: str) -> None:
    fake.set_responder(lambda body: Reply(content=reply))
    grader = autorater_grader(make_judge(), "Rate {{response}} from -1 to 1 in <score></score>.",
                              parse=ParseConfig(type="REGEX_EXTRACT", regex="<score>(.*?)</score>"))
    grade = await grader(Sample(messages="q", response="fine"))
    assert grade.status == status and grade.score == score
    if status == "error":
        assert grade.error_kind == "parse_failure" and "not a number" in (grade.error or "")


async def test_autorater_missing_reference_is_invalid(fake: FakeProvider, make_judge) -> None:
    grade = await autorater_grader(make_judge(), PROMPT, parse=ANSWER_TAG, expression="Yes")(Sample(messages="q", response="x"))
    assert grade.status == "invalid" and "tone" in (grade.error or "")
    assert fake.chat_requests() == []


async def test_llm_and_autorater_from_config(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(tone_judge)
    judge = make_judge()
    grader = load_grader(DATA / "autorater_tone.yaml", judge=judge)
    assert (await grader(Sample(messages="Refund?", response="Please wait.", references={"tone": "polite"}))).score == 1.0
    fake.set_responder(semantic_judge)
    llm = load_grader({"type": "llm", "rubric": "semantic_equivalence_en", "map": {"references": "references.gold"}}, judge=judge)
    grade = await llm(Sample(messages="Capital?", response="Paris", references={"gold": "Paris"}))
    assert grade.score == 1.0
