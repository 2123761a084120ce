"""One judge spec: the merge rule every layering uses, and the field names the judge core's errors carry.

The spec is built and merged for real and then built into a Judge that speaks HTTP to the fake provider,
so what is asserted is what the provider saw.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge import JudgeSpec, Limits, load_rubric
from gradekit.judge.testing import FakeProvider, Reply

ROW = {"question": "q", "references": ["a"], "prediction": "a"}


def test_merge_gives_the_other_sides_fields_params_key_by_key_and_the_endpoint_whole() -> None:
    file = JudgeSpec.of("file-judge", endpoints=[{"base_url": "http://a.example/v1"}], params={"seed": 7, "top_p": 0.5},
                        max_prompt_tokens=4000)
    line = JudgeSpec.of(None, base_url="http://b.example/v1", params={"top_p": 0.9}, timeout=5, limits=Limits(rps=2))
    merged = file.merge(line)
    assert (merged.model, merged.base_url, merged.endpoints) == ("file-judge", ("http://b.example/v1",), None)
    assert merged.params == {"seed": 7, "top_p": 0.9}
    assert (merged.timeout, merged.max_prompt_tokens, merged.limits.rps, merged.limits.tpm) == (5, 4000, 2, None)
    assert file.merge(JudgeSpec()) == file  # nothing given: nothing changes
    assert JudgeSpec().merge(file) == file


def test_a_built_spec_sends_its_params_and_nothing_for_what_is_unset() -> None:
    rubric = load_rubric("semantic_equivalence_en")

    async def ask(spec: JudgeSpec) -> None:
        async with spec.build() as judge:
            assert (await judge.judge(rubric, ROW)).ok

    with FakeProvider() as fake:
        base = JudgeSpec.of("fake-judge", base_url=fake.base_url, api_key="k")
        asyncio.run(ask(base))
        asyncio.run(ask(base.merge(JudgeSpec.of(params={"seed": 7, "reasoning_effort": "low"}))))
        first, second = (r.body for r in fake.chat_requests())
    assert "seed" not in first and "reasoning_effort" not in first
    assert (second["seed"], second["reasoning_effort"]) == (7, "low")
    assert {k: v for k, v in second.items() if k not in ("seed", "reasoning_effort")} == first


def test_the_judge_core_names_the_field_and_the_command_line_its_flag(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"^`base_url` 'localhost:8000/v1' has no http"):
        JudgeSpec.of("m", base_url="localhost:8000/v1").build()
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "q", "references": ["a"], "prediction": "a"}\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["grade", str(rows), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "out.jsonl"),
                                      "--base-url", "localhost:8000/v1", "--api-key", "k", "--no-cache"])
    assert result.exit_code == 2, result.output
    assert "--base-url 'localhost:8000/v1' has no http" in " ".join(result.output.split()) and "`" not in result.output


def _grade(tmp_path, fake: FakeProvider, name: str, *extra: str):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({**ROW, "question": f"q{i}"}) + "\n" for i in range(3)), encoding="utf-8")
    output = tmp_path / f"{name}.jsonl"
    result = CliRunner().invoke(app, ["grade", str(rows), "-r", "correctness_3way", "-o", str(output), "--model", "fake-judge",
                                      "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--concurrency", "1", *extra])
    return result, output


def test_a_judge_error_names_the_field_in_python_and_the_flag_in_a_commands_rows_summary_and_stop(tmp_path) -> None:
    rubric = load_rubric("correctness_3way")
    cut, missing = Reply(content='{"rationale": "cut', finish_reason="length"), Reply(status=404, error_message="no such model")
    ok = Reply(content=json.dumps({"rationale": "fine", "grade": "CORRECT"}))

    async def ask(spec: JudgeSpec) -> list[str]:
        async with spec.build() as judge:
            return [(await judge.judge(rubric, ROW)).error or "" for _ in range(2)]

    with FakeProvider(script=[cut, missing]) as fake:
        said = asyncio.run(ask(JudgeSpec.of("fake-judge", base_url=fake.base_url, api_key="k")))
    assert "raise max_tokens (`params.max_completion_tokens`)" in said[0]
    assert "check `model` and that `base_url` ends in the API root" in said[1]

    with FakeProvider(script=[cut, missing, ok]) as fake:
        result, output = _grade(tmp_path, fake, "graded", "--keep-going")
    assert result.exit_code == 1, result.output
    errors = [row["error"] for row in map(json.loads, output.read_text(encoding="utf-8").splitlines()) if row["error"]]
    assert errors == ["row 1: reply cut off at the token limit (finish_reason=length); raise max_tokens (--max-completion-tokens)",
                      "row 2: HTTP 404: not found: check --model and that --base-url ends in the API root (often …/v1) — Error code: 404 - no such model"]
    summary = " ".join(result.output.split())
    assert "raise max_tokens (--max-completion-tokens)" in summary and "check --model and that --base-url" in summary
    assert "`" not in result.output

    with FakeProvider(script=[Reply(status=401, error_message="bad key")] * 6) as fake:
        result, _ = _grade(tmp_path, fake, "stopped", "--json")
    assert result.exit_code == 3, result.output
    stopped = json.loads(result.stdout)
    assert "check OPENAI_API_KEY or --api-key" in stopped["example"] and "check OPENAI_API_KEY or --api-key" in stopped["message"]
    assert "check OPENAI_API_KEY or --api-key" in " ".join(result.stderr.split()) and "`" not in result.output


def test_a_jurys_row_says_each_jurors_error_in_flags(tmp_path) -> None:
    with FakeProvider(script=[Reply(status=404, error_message="no such model")] * 6) as fake:
        result, output = _grade(tmp_path, fake, "jury", "--model", "judge-b", "--keep-going")
    assert result.exit_code == 1, result.output
    row = json.loads(output.read_text(encoding="utf-8").splitlines()[0])
    jurors = json.loads(row["jurors"])
    assert [j["model"] for j in jurors] == ["fake-judge", "judge-b"]
    assert all("check --model and that --base-url ends in the API root" in j["error"] for j in jurors), jurors
    assert row["error"].count("check --model and that --base-url") == 2 and "`" not in output.read_text(encoding="utf-8")
