"""`gradekit meta-eval` against the fake provider: LLMBar replayed to its published rows, panels, rules, suite files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.calibration import suite_replay_responder
from gradekit.graders.calibration._suites import SuiteError, load_suite
from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

RESULT_FIELDS = {"suite", "subset", "judge", "n", "accuracy", "agreement", "first_position_win_rate", "parse_failures",
                 "errors", "requests", "cost_usd"}


def test_meta_eval_replayed_from_gpt4_reproduces_the_published_llmbar_rows() -> None:
    with FakeProvider(responder=suite_replay_responder("GPT-4", "Vanilla_NoRules")) as server:
        result = CliRunner().invoke(app, ["meta-eval", "--suite", "llmbar", "-r", "llmbar_pairwise", "--model", "gpt-4",
                                          "--base-url", server.base_url, "--api-key", "x", "--no-cache", "--json"])
        assert result.exit_code == 0, result.output
        assert len(server.chat_requests()) == 2 * 419  # every pair in both orders, through the real client
    payload = json.loads(result.output)
    assert payload["version"] == 1 and payload["rubric"] == "llmbar_pairwise" and payload["on_conflict"] == "tie"
    rows = {r["subset"]: r for r in payload["results"]}
    assert list(rows) == ["Natural", "Neighbor", "GPTInst", "GPTOut", "Manual", "overall"]
    assert all(RESULT_FIELDS <= set(r) for r in rows.values())
    published = {p["subset"]: p for p in payload["published"] if p["judge"] == "GPT-4/Vanilla_NoRules"}
    assert set(published) == set(rows)
    for subset, row in rows.items():
        assert (row["n"], row["errors"]) == (published[subset]["n"], 0)
        assert row["accuracy"] == pytest.approx(published[subset]["accuracy"], abs=1e-9), subset
        assert row["agreement"] == pytest.approx(published[subset]["agreement"], abs=1e-9), subset
    assert (rows["Natural"]["accuracy"], rows["Natural"]["agreement"]) == (93.5, 97.0)


def _shown(body: dict) -> tuple[str, str]:
    user = body["messages"][-1]["content"]
    return tuple(re.search(rf"<{t}>\n?(.*?)\n?</{t}>", user, re.S).group(1) for t in ("output_a", "output_b"))  # type: ignore[return-value]


def panel(body: dict) -> Reply:
    """Three judges by model name: 'sharp' picks GOOD, 'first' always the first shown, 'blunt' GOOD only on easy pairs."""
    first, second = _shown(body)
    good_first = first.startswith("GOOD")
    if body["model"] == "first":
        return Reply(content="Output (a)")
    if body["model"] == "blunt" and "hard" in first + second:
        return Reply(content="Output (b)" if good_first else "Output (a)")
    return Reply(content="Output (a)" if good_first else "Output (b)")


@pytest.fixture
def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "mine.jsonl"
    lines = []
    for i in range(6):
        category = "easy" if i < 4 else "hard"
        good, bad = f"GOOD {category} {i}", f"BAD {category} {i}"
        o1, o2, label = (good, bad, 1) if i % 2 == 0 else (bad, good, 2)
        lines.append({"id": f"p{i}", "instruction": f"task {i}", "output_1": o1, "output_2": o2, "label": label, "category": category})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_a_panel_gets_one_row_per_judge_and_a_jury_row(suite_file: Path, tmp_path: Path) -> None:
    with FakeProvider(responder=panel) as server:
        result = CliRunner().invoke(app, ["meta-eval", "--suite", str(suite_file), "-r", "llmbar_pairwise", "--model", "sharp",
                                          "--model", "first", "--model", "blunt", "--base-url", server.base_url, "--api-key", "x",
                                          "--no-cache", "--on-conflict", "vote", "--json", "--plots", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    rows = {(r["subset"], r["judge"]): r for r in payload["results"]}
    assert {s for s, _ in rows} == {"easy", "hard", "overall"} and {j for _, j in rows} == {"sharp", "first", "blunt", "jury"}
    assert rows[("overall", "sharp")]["accuracy"] == 100.0 and rows[("overall", "sharp")]["agreement"] == 100.0
    # Always "Output (a)": every order flips, so votes sum to a tie; all verdicts favour the first shown.
    assert rows[("overall", "first")]["accuracy"] == 0.0 and rows[("overall", "first")]["first_position_win_rate"] == 100.0
    assert rows[("hard", "blunt")]["accuracy"] == 0.0 and rows[("easy", "blunt")]["accuracy"] == 100.0
    assert rows[("overall", "jury")]["accuracy"] == pytest.approx(100 * 4 / 6)  # sharp vs blunt split on hard pairs: a tie
    assert rows[("overall", "sharp")]["requests"] == 12 and rows[("overall", "jury")]["requests"] == 36
    jury = {j["subset"]: j for j in payload["jury"]}
    assert jury["overall"]["best_member"] == "sharp" and jury["overall"]["beats_best"] is False
    assert sorted(Path(p).name for p in payload["plots"]) == ["accuracy.png", "position_bias.png"]
    assert all(Path(p).stat().st_size > 1000 for p in payload["plots"])


def test_arena_hard_defaults_to_vote_and_marks_pairs_read_from_one_order(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"instruction": "q", "output_1": "GOOD", "output_2": "BAD", "label": 1}) + "\n"
                    + json.dumps({"instruction": "q2", "output_1": "BAD 2", "output_2": "GOOD 2", "label": 2}) + "\n", encoding="utf-8")

    def arena(body: dict) -> Reply:
        user = body["messages"][-1]["content"]
        first = re.search(r"<assistant_a>\n?(.*?)\n?</assistant_a>", user, re.S).group(1)
        if first == "GOOD 2":
            return Reply(content="I refuse to pick.")  # unreadable: this order abstains
        return Reply(content="[[A>>B]]" if first.startswith("GOOD") else "[[B>A]]")

    with FakeProvider(responder=arena) as server:
        result = CliRunner().invoke(app, ["meta-eval", "--suite", str(path), "-r", "arena_hard_pairwise", "--model", "m",
                                          "--base-url", server.base_url, "--api-key", "x", "--no-cache", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    (row,) = payload["results"]
    assert payload["on_conflict"] == "vote" and row["subset"] == "overall"
    assert (row["accuracy"], row["one_order"], row["parse_failures"], row["errors"]) == (100.0, 1, 1, 0)


@pytest.mark.parametrize(("line", "message"), [
    pytest.param('{"instruction": "q", "output_1": "a", "output_2": "b", "label": 3}', "label must be 1 or 2", id="bad_label"),
    pytest.param('{"instruction": "q", "output_1": "a", "label": 1}', "missing output_2", id="missing_field"),
    pytest.param("not json", "not valid JSON", id="not_json"),
    pytest.param('{"instruction": "q", "output_1": "a", "output_2": "b", "label": 1, "category": "overall"}', "reserved", id="reserved"),
])
def test_a_broken_suite_file_stops_before_any_request_and_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"instruction": "q", "output_1": "a", "output_2": "b", "label": 2}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=f"line 2: .*{message}"):
        load_suite(str(path))
    result = CliRunner().invoke(app, ["meta-eval", "--suite", str(path), "-r", "llmbar_pairwise", "--base-url", "http://127.0.0.1:9/v1"])
    assert result.exit_code == 2 and "line 2" in result.output


def test_unknown_suite_non_pairwise_rubric_and_limit_are_checked() -> None:
    runner = CliRunner()
    assert "neither a shipped suite" in runner.invoke(app, ["meta-eval", "--suite", "nope", "-r", "llmbar_pairwise"]).output
    assert "not pairwise" in runner.invoke(app, ["meta-eval", "--suite", "faireval", "-r", "tone"]).output
    limited = load_suite("llmbar", limit=3)
    assert [p.subset for p in limited.pairs] == [s for s in limited.subsets for _ in range(3)]
    assert {p.subset for p in load_suite("faireval").pairs} == {"FairEval"} and len(load_suite("mtbench-human").pairs) == 200


def test_meta_eval_records_and_replays_its_traffic_and_a_dead_endpoint_is_an_error_not_a_score(suite_file: Path, tmp_path: Path) -> None:
    tape = tmp_path / "tape.yaml"
    args = ["meta-eval", "--suite", str(suite_file), "-r", "llmbar_pairwise", "--model", "sharp", "--api-key", "x", "--json"]
    with FakeProvider(responder=panel) as server:
        recorded = CliRunner().invoke(app, [*args, "--base-url", server.base_url, "--record", str(tape)])
        base_url = server.base_url
    assert recorded.exit_code == 0, recorded.output
    replayed = CliRunner().invoke(app, [*args, "--base-url", base_url, "--replay", str(tape)])  # the server is gone
    assert replayed.exit_code == 0, replayed.output
    strip = lambda out: [{k: v for k, v in r.items() if k != "cache_hits"} for r in json.loads(out)["results"]]  # noqa: E731
    assert strip(replayed.output) == strip(recorded.output)
    dead = CliRunner().invoke(app, ["meta-eval", "--suite", str(suite_file), "-r", "llmbar_pairwise", "--limit", "1", "--json",
                                    "--base-url", base_url, "--api-key", "x", "--no-cache", "--timeout", "2"])
    assert dead.exit_code == 1, dead.output
    rows = json.loads(dead.output)["results"]
    # Every pair failed: no accuracy at all (was 0.0, a figure over nothing), and the errors counted by kind.
    assert all(r["errors"] == r["n"] and r["accuracy"] is None for r in rows) and rows[0]["errors_by_kind"]
