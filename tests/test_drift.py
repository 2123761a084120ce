"""Drift, seen and caught: every row records who answered it, the summary says when that changed, and a canary
(`grade --canary`) stops a run, or flags its rows, when the served judge's answers change mid-run.

Everything runs against the loopback fake provider over HTTP, through the real `gradekit grade` command."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.graders.runs._drift import LONG_RUN_ROWS, ServedTally, alias_note, is_alias
from gradekit.judge.testing import FakeProvider, Reply

from .conftest import reference_judge

runner = CliRunner()


def grade(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["grade", *args])
    return result.exit_code, result.output


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_rows(path: Path, count: int, start: int = 0) -> Path:
    """``count`` rows: the even ones answer with their reference (correct), the odd ones do not (incorrect)."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(start, start + count):
            answer = str(i) if i % 2 == 0 else "no idea"
            f.write(json.dumps({"id": f"r{i}", "question": f"what is number {i}?", "references": [str(i)],
                                "prediction": answer, "label": "correct" if i % 2 == 0 else "incorrect"}) + "\n")
    return path


class Switch:
    """A judge the provider replaces after ``after`` requests: a new served fingerprint, and (``flip``) inverted answers."""

    def __init__(self, after: int, *, flip: bool = True, model: str = "fake-judge-2024-01-01") -> None:
        self.after, self.flip, self.model = after, flip, model
        self.seen = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict) -> Reply:
        with self._lock:
            self.seen += 1
            changed = self.seen > self.after
        reply = reference_judge(body)
        if changed and self.flip and reply.content:
            verdict = json.loads(reply.content)
            verdict["judgement"] = {"correct": "incorrect", "incorrect": "correct"}[verdict["judgement"]]
            reply = Reply(content=json.dumps(verdict))
        return reply.model_copy(update={"model": self.model, "system_fingerprint": "fp_new" if changed else "fp_old"})


# ---- drift, seen ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model, alias", [
    pytest.param("gpt-4o", True, id="openai_alias"),
    pytest.param("gpt-4o-mini", True, id="openai_mini_alias"),
    pytest.param("gpt-4o-2024-08-06", False, id="dated_snapshot"),
    pytest.param("gpt-4-0613", False, id="four_digit_release"),
    pytest.param("gemini-1.5-pro-002", False, id="three_digit_snapshot"),
    pytest.param("claude-3-5-sonnet@20240620", False, id="vertex_at_date"),
    pytest.param("anthropic.claude-v2:1", False, id="bedrock_version"),
    pytest.param("qwen-max-latest", True, id="latest_is_an_alias"),
    pytest.param("doubao-1.5-pro-32k-250115", False, id="ark_date"),
    pytest.param("Qwen/Qwen2.5-7B-Instruct", False, id="weights_a_server_loaded"),
    pytest.param("deepseek-chat", True, id="deepseek_alias"),
])
def test_alias_names(model: str, alias: bool) -> None:
    assert is_alias(model) is alias


def test_alias_note_only_for_long_runs_and_names_what_was_served() -> None:
    served = [{"model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_1", "rows": 5}]
    assert alias_note("gpt-4o", served, LONG_RUN_ROWS - 1, 1.0) is None  # short
    assert alias_note("gpt-4o-2024-08-06", served, 10 * LONG_RUN_ROWS, 1.0) is None  # pinned
    note = alias_note("gpt-4o", served, LONG_RUN_ROWS, 1.0)
    assert note is not None and "'gpt-4o' is an alias" in note and "gpt-4o-2024-08-06" in note and "\n" not in note
    assert alias_note("gpt-4o", served, 3, 3600.0) is not None  # long in time


def test_served_tally_counts_groups_and_changes_through_a_checkpoint() -> None:
    tally = ServedTally()
    for row, fp in enumerate(["a", "a", None, "b", "b", "a"], start=1):
        tally.add(row, "m" if fp else None, fp)
    again = ServedTally.restore(json.loads(json.dumps(tally.state())))
    again.add(7, "m", "a")
    assert [(g["system_fingerprint"], g["rows"], g["first_row"], g["last_row"]) for g in again.groups] == [
        ("a", 4, 1, 7), ("b", 2, 4, 5)]
    assert [c["row"] for c in again.changes] == [4, 6] and again.change_count == 2
    assert again.changes[0]["was"] == {"model": "m", "system_fingerprint": "a"}


def test_every_row_records_who_answered_and_the_summary_says_when_it_changed(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 12)
    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=Switch(after=5, flip=False)) as fake:
        code, text = grade(str(data), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                           "--model", "fake-judge", "--concurrency", "1", "--no-cache", "--json")
    assert code == 0, text
    written = rows(out)
    assert [r["served_model"] for r in written] == ["fake-judge-2024-01-01"] * 12
    assert [r["system_fingerprint"] for r in written] == ["fp_old"] * 5 + ["fp_new"] * 7
    summary = json.loads(text)
    assert summary["served"] == [
        {"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_old", "rows": 5, "first_row": 1, "last_row": 5},
        {"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_new", "rows": 7, "first_row": 6, "last_row": 12}]
    assert summary["served_changes"] == [{"row": 6, "model": "fake-judge-2024-01-01", "system_fingerprint": "fp_new",
                                          "was": {"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_old"}}]
    assert summary["served_changes_total"] == 1 and summary["served_note"] is None  # 12 rows is not a long run


def test_a_cached_row_records_who_answered_when_it_was_cached_and_streams_keep_the_fingerprint(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 4)
    cache = tmp_path / "c.sqlite3"
    with FakeProvider(responder=reference_judge, system_fingerprint="fp_then") as fake:
        base = [str(data), "-r", "semantic_equivalence_en", "--base-url", fake.base_url, "--api-key", "k", "--cache", str(cache)]
        assert grade(*base, "-o", str(tmp_path / "a.jsonl"), "--judge-param", "stream=true")[0] == 0
        assert {r["system_fingerprint"] for r in rows(tmp_path / "a.jsonl")} == {"fp_then"}  # read off the stream's chunks
        fake.system_fingerprint = "fp_now"
        assert grade(*base, "-o", str(tmp_path / "b.jsonl"), "--judge-param", "stream=true")[0] == 0
    again = rows(tmp_path / "b.jsonl")
    assert all(r["cached"] for r in again) and {r["system_fingerprint"] for r in again} == {"fp_then"}


def test_view_filters_rows_by_who_answered(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    from gradekit.graders.view._results import ResultsFile, ViewError, as_filter
    from gradekit.graders.view._summary import summarise

    data = write_rows(tmp_path / "rows.jsonl", 9)
    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=Switch(after=4, flip=False)) as fake:
        assert grade(str(data), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                     "--concurrency", "1", "--no-cache")[0] == 0
    results = ResultsFile(out, background=False)
    try:
        newer = results.rows(as_filter({"system_fingerprint": "fp_new"}))
        assert newer.total == 5 and [r["index"] for r in newer.rows] == [4, 5, 6, 7, 8]
        assert results.rows(as_filter({"served_model": "fake-judge-2024-01-01", "system_fingerprint": "fp_old"})).total == 4
        assert summarise(results)["system_fingerprints"] == {"fp_new": 5, "fp_old": 4}
        with pytest.raises(ViewError, match="drift"):
            results.rows(as_filter({"drift": "true"}))  # no run flagged this file: a named error, never a silent "no filter"
    finally:
        results.close()
