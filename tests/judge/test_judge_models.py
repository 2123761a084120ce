"""Every shipped rubric on every provider dialect of the fake (#20): reasoning models, thinking models, streaming.

The dialects (gradekit.judge.testing.DIALECTS) model what each provider documents: parameters it refuses,
thinking in a field, in ``<think>`` tags or in stream deltas, streaming-only thinking. A thinking
dialect's draft holds a verdict in every rubric format that differs from the final answer, so a
verdict read from the thinking shows up as a wrong label here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge import Judge, Limiter, load_rubric
from gradekit.judge._dialect import forget_dialects
from gradekit.judge.testing import DIALECTS, FakeProvider, Reply, asked_reply

# The final answer each rubric's judge gives, and the label it must be read as.
FINAL: dict[str, tuple[str, str]] = {
    "semantic_equivalence_en": ("correct", "correct"),
    "semantic_equivalence_zh": ("正确", "正确"),
    "correctness_3way": ("CORRECT", "CORRECT"),
    "tone": ("<answer>Yes</answer>", "Yes"),
    "llmbar_pairwise": ("Output (a)", "Output (a)"),
    "arena_hard_pairwise": ("My verdict: [[A>B]]", "A>B"),
    "answer_verification_3way": ("correct", "correct"),
    "answer_verification_yes_no": ("Both are one half.\nFinal Decision: Yes", "Yes"),
}
ROWS: dict[str, dict[str, Any]] = {
    "semantic_equivalence_en": {"question": "Capital of France?", "references": ["Paris"], "prediction": "Paris"},
    "semantic_equivalence_zh": {"question": "法国首都？", "references": ["巴黎"], "prediction": "巴黎"},
    "correctness_3way": {"question": "Capital of France?", "references": ["Paris"], "prediction": "Paris"},
    "tone": {"response": "Dear Sir, thank you.", "tone": "polite"},
    "llmbar_pairwise": {"instruction": "Say hi", "output_1": "hi", "output_2": "bye"},
    "arena_hard_pairwise": {"instruction": "Say hi", "output_1": "hi", "output_2": "bye"},
    "answer_verification_3way": {"question": "Half of 1?", "references": ["\\frac{1}{2}"], "prediction": "The answer is 0.5"},
    "answer_verification_yes_no": {"question": "Half of 1?", "references": ["\\frac{1}{2}"], "prediction": "0.5"},
}


def answer_for(rubric_name: str):
    """A judge that answers in the format the request asks for: JSON, a tool call, or the rubric's text."""
    spec = load_rubric(rubric_name)
    text, label = FINAL[rubric_name]
    field = spec.output.field

    def respond(body: dict[str, Any]) -> Reply:
        if field:  # a JSON rubric; in tags mode its template asks for <judgement>
            return asked_reply(body, {field: label, "rationale": "it matches"}, f"It matches.\n<{spec.verdict_tag}>{label}</{spec.verdict_tag}>")
        return Reply(content=text)

    return respond


async def _judge_rows(fake: FakeProvider, rubric_name: str, n: int = 6, **judge_kwargs: Any):
    spec = load_rubric(rubric_name)
    async with Judge("qwen3-32b", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=8), **judge_kwargs) as judge:
        verdicts = await asyncio.gather(*(judge.judge(spec, ROWS[rubric_name]) for _ in range(n)))
        return verdicts, judge.dialect


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("rubric_name", sorted(FINAL))
async def test_every_rubric_on_every_dialect_reads_the_final_answer(dialect: str, rubric_name: str) -> None:
    forget_dialects()
    with FakeProvider(dialect=dialect, responder=answer_for(rubric_name)) as fake:
        verdicts, learnt = await _judge_rows(fake, rubric_name)
        refused = [r for r in fake.chat_requests() if r.status == 400]
    expected = FINAL[rubric_name][1]
    assert [(v.status, v.label) for v in verdicts] == [("ok", expected)] * len(verdicts), [v.error for v in verdicts]
    # Each refusal taught one fix (a parameter, streaming, an output mode), shared by every row in flight.
    assert len(refused) <= len(learnt.learnt), (learnt.learnt, [r.body.get("stream") for r in refused])
    if DIALECTS[dialect].thinking in ("field", "tags"):
        assert all(v.reasoning for v in verdicts), "the thinking is kept apart for the user"
        assert all(v.reasoning != v.rationale for v in verdicts), "the thinking is not the rationale either"


@pytest.mark.parametrize("dialect", ["vllm-no-parser", "dashscope-thinking", "ark-thinking", "deepseek-reasoner", "vllm-reasoning-parser"])
@pytest.mark.parametrize("rubric_name", ["tone", "llmbar_pairwise", "semantic_equivalence_en"])
async def test_a_cut_off_thinking_draft_is_never_a_score(dialect: str, rubric_name: str) -> None:
    forget_dialects()
    with FakeProvider(dialect=dialect, responder=lambda body: Reply(finish_reason="length")) as fake:
        verdicts, _ = await _judge_rows(fake, rubric_name, n=2)
    assert {(v.status, v.error_kind, v.score) for v in verdicts} == {("error", "truncated", None)}
    assert all("`params.max_completion_tokens`" in (v.error or "") for v in verdicts)


async def test_a_think_block_is_not_parsed_even_when_it_holds_the_only_tag() -> None:
    forget_dialects()
    reply = Reply(content="<think>The draft says <answer>No</answer>.</think>\n\n<answer>Yes</answer>")
    with FakeProvider(script=[reply]) as fake:
        verdicts, _ = await _judge_rows(fake, "tone", n=1)
    assert verdicts[0].label == "Yes" and "draft" in verdicts[0].reasoning
    unclosed = Reply(content="<think>Still thinking... <answer>No</answer>", finish_reason="stop")
    with FakeProvider(script=[unclosed]) as fake:
        verdicts, _ = await _judge_rows(fake, "tone", n=1)
    assert (verdicts[0].status, verdicts[0].error_kind) == ("error", "truncated")


async def test_a_parameter_the_user_set_is_never_dropped_silently() -> None:
    forget_dialects()
    with FakeProvider(dialect="openai-reasoning", responder=answer_for("tone")) as fake:
        verdicts, _ = await _judge_rows(fake, "tone", n=3, params={"temperature": 0.7})
    assert {v.error_kind for v in verdicts} == {"bad_request"}
    assert all("temperature" in v.error and "you set" in v.error for v in verdicts)


def test_a_learnt_dialect_holds_for_judges_on_new_event_loops() -> None:
    """Ark's harness runs asyncio.run per sample: the second loop sends the fixed request at once."""
    forget_dialects()
    with FakeProvider(dialect="openai-reasoning", responder=answer_for("tone")) as fake:
        judge = Judge("gpt-5-mini", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4))

        async def one():
            try:
                return await judge.judge(load_rubric("tone"), ROWS["tone"])
            finally:
                await judge.aclose()

        first, second = asyncio.run(one()), asyncio.run(one())
        assert first.ok and second.ok
        assert [r.status for r in fake.chat_requests()] == [400, 200, 200]


def _rows_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": i, **ROWS["semantic_equivalence_en"]}) + "\n" for i in range(n)), encoding="utf-8")
    return path


def test_grade_with_a_reasoning_model_judges_every_row_with_at_most_two_400s(tmp_path: Path) -> None:
    forget_dialects()
    out = tmp_path / "out.jsonl"
    with FakeProvider(dialect="openai-reasoning", responder=answer_for("llmbar_pairwise")) as fake:
        pairs = tmp_path / "pairs.jsonl"
        pairs.write_text("".join(json.dumps({"id": i, **ROWS["llmbar_pairwise"]}) + "\n" for i in range(20)), encoding="utf-8")
        done = CliRunner().invoke(app, ["grade", str(pairs), "-r", "llmbar_pairwise", "-o", str(out), "--model", "gpt-5-mini",
                                        "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json",
                                        "--judge-param", "reasoning_effort=low"])
        requests = fake.chat_requests()
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert "temperature no longer sent" in done.stderr  # what was learnt is said once, on stderr
    assert summary["errors"] == 0 and summary["ok"] == 20
    assert sum(r.status == 400 for r in requests) <= 2
    assert summary["reasoning_tokens"] > 0 and "cached_tokens" in summary
    assert all(r.body.get("reasoning_effort") == "low" for r in requests)  # --judge-param reaches every request
    assert not any("temperature" in r.body or "max_tokens" in r.body for r in requests if r.status == 200)


def test_grade_on_a_dashscope_thinking_model_streams_and_keeps_the_reasoning(tmp_path: Path) -> None:
    forget_dialects()
    source, out = _rows_file(tmp_path / "in.jsonl", 8), tmp_path / "out.jsonl"
    with FakeProvider(dialect="dashscope-thinking", responder=answer_for("semantic_equivalence_en")) as fake:
        done = CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "qwen3-32b",
                                        "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json", "--keep-reasoning"])
        requests = fake.chat_requests()
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["label"] for r in rows] == ["correct"] * 8  # the final answer; the draft says incorrect
    assert all(r["reasoning"] and "Let me think" in r["reasoning"] for r in rows)  # the draft, kept apart
    assert all(r.body.get("stream") for r in requests if r.status == 200)
    # One 400 to learn streaming, then one per output mode thinking refuses (json_schema, tool, json_object).
    assert sum(r.status == 400 for r in requests) <= 4


def test_judge_param_values_parse_as_json_else_string(tmp_path: Path) -> None:
    forget_dialects()
    source, out = _rows_file(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    with FakeProvider(dialect="ark-thinking", responder=answer_for("semantic_equivalence_en")) as fake:
        done = CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url,
                                        "--api-key", "k", "--no-cache", "--judge-param", 'thinking={"type": "disabled"}',
                                        "--judge-param", "seed=7", "--judge-param", "note=plain text", "--temperature", "0.2"])
        bodies = [r.body for r in fake.chat_requests()]
    assert done.exit_code == 0, done.output
    assert all(b["thinking"] == {"type": "disabled"} and b["seed"] == 7 and b["note"] == "plain text" and b["temperature"] == 0.2
               for b in bodies)
    bad = CliRunner().invoke(app, ["grade", str(source), "-r", "tone", "-o", str(out), "--judge-param", "no-equals-sign"])
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output
