"""The run summary reports per-row reward time (p50, p99) and the slowest rows, by id."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import reference_judge


def test_the_run_summary_names_the_slowest_rows(tmp_path: Path) -> None:
    def respond(body: dict) -> Reply:
        slow = "Marseille" in body["messages"][-1]["content"]
        reply = reference_judge(body)
        return reply.model_copy(update={"delay": 0.6}) if slow else reply

    rows = [{"id": f"r{i}", "question": "Capital of France?", "references": ["Paris"], "prediction": "Paris"} for i in range(12)]
    rows[7]["prediction"] = "Marseille"
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with FakeProvider(responder=respond) as fake:
        result = CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "out.jsonl"),
                                          "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["slowest_rows"][0]["id"] == "r7" and summary["slowest_rows"][0]["seconds"] >= 0.6
    assert len(summary["slowest_rows"]) == 10
    assert 0 <= summary["reward_seconds_p50"] <= summary["reward_seconds_p99"]
