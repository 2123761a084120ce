"""`gradekit probe` against the fake provider: master-key openers, padding, position; one sturdy and one gullible judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from gradekit.graders.calibration import MASTER_KEYS
from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from .test_probes import _prediction, _references, _reply

REPO = Path(__file__).resolve().parents[2]
ROWS = REPO / "eval_sets/semantic_equivalence_en/data.jsonl"


def sturdy(body: dict) -> Reply:
    """Correct iff a reference occurs in the prediction: no opener contains one."""
    return _reply(body, "correct" if any(r.lower() in _prediction(body).lower() for r in _references(body)) else "incorrect")


def opener_fooled(body: dict) -> Reply:
    """Falls for reasoning-style openers ("Thought process:", "解：" ...), like the judges in the literature."""
    if _prediction(body).rstrip().endswith((":", "：", "step.", "Solution", "解答", "。")):
        return _reply(body, "correct")
    return sturdy(body)


def _probe(base_url: str, *extra: str):
    return CliRunner().invoke(app, ["probe", "-r", "semantic_equivalence_en", "--data", str(ROWS), "--limit", "6",
                                    "--base-url", base_url, "--api-key", "x", "--no-cache", *extra])


def test_a_sturdy_judge_passes_every_probe() -> None:
    with FakeProvider(responder=sturdy) as server:
        result = _probe(server.base_url, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["version"] == 1 and payload["field"] == "prediction" and payload["rows"] == 6
    keys = [p for p in payload["probes"] if p["probe"] == "master_key"]
    assert [p["variant"] for p in keys] == list(MASTER_KEYS) and {":", "Thought process:", "解："} <= set(MASTER_KEYS)
    assert all(p["weakness_rate"] == 0.0 and p["judged"] == 6 and p["passed"] for p in keys)
    assert [p["probe"] for p in payload["probes"]][-1] == "verbosity" and payload["failed"] == 0


def test_a_judge_fooled_by_openers_is_obvious_and_exits_3() -> None:
    with FakeProvider(responder=opener_fooled) as server:
        result = _probe(server.base_url, "--json")
        text = _probe(server.base_url)
    assert result.exit_code == 3, result.output
    rates = {p["variant"]: p["weakness_rate"] for p in json.loads(result.output)["probes"] if p["probe"] == "master_key"}
    assert rates["Thought process:"] == 1.0 and rates["解："] == 1.0 and rates["Let's solve this problem step by step."] == 1.0
    assert text.exit_code == 3 and "FAIL" in text.output and "probes" in text.output


def test_pairwise_rubrics_get_the_position_probe_and_a_bad_field_is_refused(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"instruction": f"q{i}", "output_1": f"GOOD {i}", "output_2": f"BAD {i}"}) + "\n"
                             for i in range(3)), encoding="utf-8")

    def first_shown(body: dict) -> Reply:
        return Reply(content="Output (a)")  # always the first shown: fooled by position and by every opener

    with FakeProvider(responder=first_shown) as server:
        result = CliRunner().invoke(app, ["probe", "-r", "llmbar_pairwise", "--data", str(pairs), "--base-url", server.base_url,
                                          "--api-key", "x", "--no-cache", "--json"])
        bad = CliRunner().invoke(app, ["probe", "-r", "llmbar_pairwise", "--data", str(pairs), "--field", "nope",
                                       "--base-url", server.base_url])
    assert result.exit_code == 3, result.output
    payload = json.loads(result.output)
    # Content-blind: padding changes nothing, so only verbosity passes.
    assert payload["field"] == "output_1" and (payload["failed"], payload["passed"], len(payload["probes"])) == (9, 1, 10)
    by = {(p["probe"], p["variant"]): p for p in payload["probes"]}
    assert by[("position_swap", None)]["flip_rate"] == 1.0 and by[("master_key", ":")]["weakness_rate"] == 1.0
    assert bad.exit_code == 2 and "--field" in bad.output


def test_probe_runs_as_a_real_process(tmp_path: Path) -> None:
    with FakeProvider(responder=sturdy) as server:
        done = subprocess.run([sys.executable, "-m", "gradekit", "probe", "-r", "semantic_equivalence_en", "--data", str(ROWS),
                               "--limit", "2", "--base-url", server.base_url, "--api-key", "x", "--no-cache"],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "passed all 9 probes" in done.stdout
    for command in ("meta-eval", "probe", "calibrate"):
        assert CliRunner().invoke(app, [command, "--help"]).exit_code == 0
