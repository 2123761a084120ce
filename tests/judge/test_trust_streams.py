"""Issue 35: a stream that never ends (keep-alive comments, or reasoning deltas for ever) is bounded by --timeout."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply


@pytest.mark.timeout(120)
def test_six_streams_that_never_end_each_end_as_timeout_within_the_run(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["x"], "prediction": "x"}) + "\n"
                              for i in range(6)))
    kinds: list[str] = []

    def forever(body: dict) -> Reply:
        kinds.append("keep-alive" if len(kinds) % 2 else "deltas")
        return Reply(endless=kinds[-1], endless_every=0.2)  # type: ignore[arg-type]

    with FakeProvider(dialect="vllm-reasoning-parser") as fake:
        fake.set_responder(forever)
        done = CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"),
                                        "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--timeout", "2",
                                        "--judge-param", "stream=true"])
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(rows) == 6, done.output
    assert {"keep-alive", "deltas"} <= set(kinds) and all(r.body["stream"] for r in fake.chat_requests())
    assert [(r["status"], r.get("error_kind")) for r in rows] == [("error", "timeout")] * 6, rows
