"""`gradekit grade --grader`: any grader config over CSV, JSONL and Parquet rows, one output row per input row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

runner = CliRunner()

MATCH = """
type: weighted
parts:
  exact: {weight: 3, type: string_match, expression: "{{references.answer}}", operation: EXACT_MATCH,
          parse: {type: REGEX_EXTRACT, regex: "<answer>(.*?)</answer>"}}
  short: {weight: 1, type: python, source: "def grade(sample, item):\\n    return 1.0 if len(sample['output_text']) < 40 else 0.0"}
"""
ROWS = [
    {"id": 1, "prompt": "2+2?", "response": "<answer>4</answer>", "answer": "4"},
    {"id": 2, "prompt": "3+3?", "response": "I think <answer>5</answer>, or maybe something much longer", "answer": "6"},
    {"id": 3, "prompt": "no answer column", "response": "<answer>1</answer>"},
]


def _write(path: Path, rows: list[dict]) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["id", "prompt", "response", "answer"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _read(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_deterministic_grader_needs_no_judge_and_keeps_every_row(tmp_path, suffix) -> None:
    config = tmp_path / "match.yaml"
    config.write_text(MATCH, encoding="utf-8")
    source, output = tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"
    _write(source, ROWS)
    result = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(output), "--json"])
    out = _read(output)
    assert [str(r["id"]) for r in out] == ["1", "2", "3"]
    assert float(out[0]["score"]) == 1.0 and float(out[1]["score"]) == -0.75  # (3 * 1 + 1 * 1) / 4 and (3 * -1 + 0) / 4
    summary = json.loads(result.output)
    if suffix == ".csv":  # a CSV cell cannot be absent, only empty: "1" against "" is a wrong answer
        assert result.exit_code == 0 and float(out[2]["score"]) == -0.5
    else:  # row 3 has no answer, so it cannot be graded: exit 1, the file still complete
        assert result.exit_code == 1, result.output
        assert (summary["rows"], summary["ok"], summary["errors"]) == (3, 2, 1)
        assert out[2]["status"] == "invalid" and "row 3" in out[2]["error"] and "answer" in out[2]["error"]
    parts = out[0]["parts"] if suffix == ".jsonl" else json.loads(out[0]["parts"])
    assert parts == {"exact": 1.0, "short": 1.0}


def test_map_points_sample_paths_at_other_columns(tmp_path) -> None:
    config = tmp_path / "match.yaml"
    config.write_text("type: string_match\nexpression: '{{references.answer}}'\noperation: PARTIAL_MATCH\n", encoding="utf-8")
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, [{"model_output": "it is 42", "gold": "42"}, {"model_output": "it is 41", "gold": "42"}])
    result = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(output),
                                 "--map", "response=model_output", "--map", "references.answer=gold"])
    assert result.exit_code == 0, result.output
    assert [r["score"] for r in _read(output)] == [1.0, -1.0]
    bad = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(tmp_path / "o.csv"), "--map", "answer=gold"])
    assert bad.exit_code == 2 and "not a sample path" in bad.output


def test_an_llm_grader_config_uses_the_command_lines_judge(tmp_path) -> None:
    config = tmp_path / "llm.yaml"
    config.write_text("type: llm\nrubric: tone\nmap: {response: response, tone: references.tone}\n", encoding="utf-8")
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, [{"response": "Thank you kindly.", "tone": "polite"}, {"response": "Whatever.", "tone": "polite"}])
    with FakeProvider(script=[Reply(content="Polite. <answer>Yes</answer>"), Reply(status=403)]) as fake:
        result = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(output), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache", "--concurrency", "1", "--timeout", "5"])
        assert len(fake.chat_requests()) == 2
    rows = _read(output)
    assert rows[0]["score"] == 1.0 and rows[1]["status"] == "error" and rows[1]["score"] is None
    assert rows[1]["error_kind"] == "bad_request" and "row 2" in rows[1]["error"]
    assert result.exit_code == 1


def test_rubric_and_grader_exclude_each_other(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    _write(source, ROWS)
    both = runner.invoke(app, ["grade", str(source), "-r", "tone", "--grader", "x.yaml", "-o", str(tmp_path / "o.jsonl")])
    neither = runner.invoke(app, ["grade", str(source), "-o", str(tmp_path / "o.jsonl")])
    missing = runner.invoke(app, ["grade", str(source), "--grader", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "o.jsonl")])
    assert both.exit_code == neither.exit_code == missing.exit_code == 2
    assert "one of the two" in both.output and "no such grader config" in missing.output


def test_a_grader_run_resumes_only_for_the_same_config_and_judge(tmp_path) -> None:
    config = tmp_path / "match.yaml"
    config.write_text("type: string_match\nexpression: '{{references.answer}}'\n", encoding="utf-8")
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, ROWS[:2])
    args = ["grade", str(source), "--grader", str(config), "-o", str(output)]
    assert runner.invoke(app, args).exit_code == 0
    assert "already complete" in runner.invoke(app, args).output
    assert "already complete" not in runner.invoke(app, [*args, "--model", "another-judge"]).output
    config.write_text("type: string_match\nexpression: '{{references.answer}}'\noperation: PARTIAL_MATCH\n", encoding="utf-8")
    assert "already complete" not in runner.invoke(app, [*args, "--model", "another-judge"]).output


LLM_PART = "{type: llm, rubric: tone, map: {response: response, tone: references.tone}}"
MIXED = {  # an LLM judge beside a deterministic part, in each composite form and nested in another
    "weighted": f"type: weighted\nparts:\n  tone: {{weight: 1, {LLM_PART[1:]}\n"
                "  exact: {weight: 1, type: string_check, input: '{{response}}', reference: 'Thank you kindly.', operation: eq}\n",
    "formula": f"type: formula\nformula: 0.5 * tone + 0.5 * exact\ngraders:\n  tone: {LLM_PART}\n"
               "  exact: {type: string_check, input: '{{response}}', reference: 'Thank you kindly.', operation: eq}\n",
    "formula_over_weighted": f"type: formula\nformula: inner\ngraders:\n  inner:\n    type: weighted\n    parts:\n"
                             f"      tone: {{weight: 1, {LLM_PART[1:]}\n"
                             "      exact: {weight: 1, type: string_check, input: '{{response}}', reference: 'x', operation: ne}\n",
}


@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in MIXED])
def test_a_composite_run_counts_its_judge_parts_tokens_requests_and_cost(tmp_path, kind) -> None:
    """Issue 47's defect: a weighted or formula grader's run reported 0 tokens, 0 requests and $0."""
    config, prices = tmp_path / "mixed.yaml", tmp_path / "prices.yaml"
    config.write_text(MIXED[kind], encoding="utf-8")
    prices.write_text("fake-judge: {input: 1.0, output: 2.0}\n", encoding="utf-8")
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, [{"response": "Thank you kindly.", "tone": "polite"}, {"response": "Whatever.", "tone": "polite"}])
    spent = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
    script = [Reply(content="<answer>Yes</answer>", usage=spent), Reply(status=500), Reply(content="<answer>No</answer>", usage=spent)]
    with FakeProvider(script=script) as fake:
        result = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(output), "--base-url", fake.base_url,
                                     "--api-key", "k", "--model", "fake-judge", "--no-cache", "--concurrency", "1", "--timeout", "5",
                                     "--prices", str(prices), "--json"])
        sent = len(fake.chat_requests())
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert sent == 3 and summary["requests"] == sent, "the retried 500 is a request too"
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (2000, 200)
    assert summary["cost_usd"] == pytest.approx((2000 * 1.0 + 200 * 2.0) / 1e6)
    rows = _read(output)
    assert [r["status"] for r in rows] == ["ok", "ok"] and rows[0]["metrics"]


def test_a_composite_row_whose_judge_failed_says_its_attempts(tmp_path) -> None:
    config = tmp_path / "mixed.yaml"
    config.write_text(MIXED["weighted"], encoding="utf-8")
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, [{"response": "Thank you kindly.", "tone": "polite"}])
    with FakeProvider(script=[Reply(status=403)]) as fake:
        result = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(output), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache", "--timeout", "5", "--json"])
        sent = len(fake.chat_requests())
    assert result.exit_code == 1
    row = _read(output)[0]
    assert row["status"] == "error" and row["error_kind"] == "bad_request" and row["attempts"] == sent == 1
    assert json.loads(result.output)["requests"] == 1
