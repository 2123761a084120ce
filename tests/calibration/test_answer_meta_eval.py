"""`gradekit meta-eval --suite answer-verification`: FP and FN apart with intervals, for the symbolic check, a judge and the hybrid.

The judge is the loopback fake, scripted with the human verdicts and a known bias (it says
"correct" whenever the response is shown as the reference), so each rule's figures are known.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders._answer_judge import decide
from gradekit.graders.calibration._answer_eval import load_answer_suite, scripted_responder, wilson
from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider

NAME, ROWS = load_answer_suite()
HUMAN_INCORRECT = sum(r.verdict == "incorrect" for r in ROWS)


def _meta_eval(fake: FakeProvider, *extra: str) -> tuple[int, dict]:
    done = CliRunner().invoke(app, ["meta-eval", "--suite", "answer-verification", "--model", "scripted", "--base-url", fake.base_url,
                                    "--api-key", "k", "--no-cache", "--json", *extra])
    return done.exit_code, (json.loads(done.stdout) if done.stdout.strip().startswith("{") else {"output": done.output})


def test_the_shipped_set_has_its_documented_rows_and_verdicts() -> None:
    assert NAME == "answer-verification" and len(ROWS) == 1167 and HUMAN_INCORRECT == 480
    assert {r.id.split("-")[0] for r in ROWS} == {"nemo", "mv", "gk"}
    kinds = Counter(r.kind for r in ROWS)
    assert set(kinds) == {"number", "expression", "choice", "string"} and min(kinds.values()) >= 150, kinds
    assert Counter(r.split for r in ROWS) == {"dev": 787, "heldout": 220, "heldout2": 160}
    readme = (Path(__file__).parents[2] / "eval_sets" / "answer_verification" / "README.md").read_text(encoding="utf-8")
    assert "1,167 rows" in readme and "correct 687 / incorrect 480" in readme


@pytest.mark.parametrize(("count", "n"), [(0, 10), (3, 62), (62, 62), (17, 269), (1, 1)])
def test_the_wilson_interval_is_scipys(count: int, n: int) -> None:
    from scipy.stats import binomtest

    expected = binomtest(count, n).proportion_ci(0.95, "wilson")
    got = wilson(count, n)
    assert (got.rate, got.method, got.n) == (count / n, "wilson", n)
    assert got.low == pytest.approx(expected.low, abs=1e-12) and got.high == pytest.approx(expected.high, abs=1e-12)
    assert wilson(0, 0).rate is None and wilson(0, 0).low is None


@pytest.mark.parametrize(("readings", "require", "decision"), [
    (("correct", "correct"), "both", "correct"),
    (("correct", "incorrect"), "both", "incorrect"),
    (("incorrect", "correct"), "either", "correct"),
    (("correct", "error"), "both", "error"),  # one order cannot confirm: no decision, never a guess
    (("error", "incorrect"), "both", "incorrect"),
    (("invalid", "correct"), "both", "invalid"),
    (("invalid", "incorrect"), "both", "incorrect"),
    (("error", "error"), "either", "error"),
    (("correct", "error"), "either", "correct"),
])
def test_the_two_orders_decide_by_the_require_rule(readings, require, decision) -> None:
    assert decide(readings, require) == decision


def test_the_judge_is_asked_twice_per_row_and_both_orders_cancel_its_bias() -> None:
    with FakeProvider(responder=scripted_responder(ROWS)) as fake:
        code, both = _meta_eval(fake, "--mode", "judge", "--require", "both")
        assert len(fake.chat_requests()) == 2 * len(ROWS)
    assert code == 0, both
    row = both["suites"][0]["results"][0]
    assert (row["mode"], row["judge"], row["n"], row["decided"], row["requests"]) == ("judge", "scripted", len(ROWS), len(ROWS), 2 * len(ROWS))
    assert (row["false_positives"]["count"], row["false_negatives"]["count"]) == (0, 0)
    assert row["false_positives"]["n"] == HUMAN_INCORRECT and row["false_positives"]["method"] == "wilson"
    assert 0.0 < row["false_positives"]["high"] < 0.1  # 0 of 62: the interval still says how little that proves
    with FakeProvider(responder=scripted_responder(ROWS)) as fake:
        code, either = _meta_eval(fake, "--mode", "judge", "--require", "either")
    lenient = either["suites"][0]["results"][0]
    assert code == 0 and lenient["false_positives"]["count"] == HUMAN_INCORRECT and lenient["false_negatives"]["count"] == 0
    assert len(lenient["false_positive_ids"]) == HUMAN_INCORRECT


def test_the_text_report_names_both_rates_with_intervals() -> None:
    with FakeProvider(responder=scripted_responder(ROWS)) as fake:
        done = CliRunner().invoke(app, ["meta-eval", "--suite", "answer-verification", "--mode", "judge", "--limit", "20",
                                        "--model", "scripted", "--base-url", fake.base_url, "--api-key", "k", "--no-cache"])
    assert done.exit_code == 0, done.output
    assert "false positives" in done.output and "false negatives" in done.output and "Wilson" in done.output
    assert "answer-verification: 20 rows" in done.output


def test_a_judge_that_fails_leaves_rows_undecided_and_exits_1() -> None:
    """A judge that fails some rows: those are undecided, counted by kind (a judge that fails every row stops the
    run as `grade` stops: tests/runs/test_trust_errors.py)."""
    from gradekit.judge.testing import Reply

    _, limited = load_answer_suite(limit=3)
    bad = limited[1]
    scripted = scripted_responder(limited)

    def answer(body: dict) -> Reply:
        text = body["messages"][-1]["content"]
        return Reply(content="not json at all") if bad.response in text and bad.gold in text else scripted(body)

    with FakeProvider(responder=answer) as fake:
        code, payload = _meta_eval(fake, "--mode", "judge", "--limit", "3", "--judge-param", "seed=1")
    assert code == 1, payload
    row = payload["suites"][0]["results"][0]
    assert row["decided"] == len(limited) - 1 and row["undecided"] == 1 and row["undecided_by_kind"] == {"parse_failure": 1}


def test_bad_options_and_suites_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"gold": "1", "response": "1", "verdict": "maybe"}) + "\n", encoding="utf-8")
    for args, message in ((["--suite", str(bad), "--mode", "judge"], "verdict must be correct or incorrect"),
                          (["--suite", "answer-verification", "--mode", "vibes"], "--mode is symbolic (also: rules), judge or hybrid"),
                          (["--suite", "answer-verification", "--require", "most"], "--require is both or either"),
                          (["--suite", "answer-verification", "-r", "llmbar_pairwise"], "not an answer-equivalence rubric"),
                          (["--suite", "answer-verification", "--suite", "llmbar"], "cannot be mixed")):
        done = CliRunner().invoke(app, ["meta-eval", *args, "--base-url", "http://127.0.0.1:9", "--api-key", "k", "--no-cache"])
        assert done.exit_code == 2 and message in done.output, (args, done.output)


def test_three_modes_symbolic_judge_and_hybrid_on_one_set_of_requests() -> None:
    with FakeProvider(responder=scripted_responder(ROWS)) as fake:
        code, payload = _meta_eval(fake, "--limit", "60")
        sent = len(fake.chat_requests())
    assert code == 0, payload
    modes = {r["mode"]: r for r in payload["suites"][0]["results"]}
    assert list(modes) == ["symbolic", "judge", "hybrid"]
    symbolic, judge, hybrid = modes["symbolic"], modes["judge"], modes["hybrid"]
    assert symbolic["requests"] == 0 and symbolic["judge"] is None and symbolic["n"] == 60
    assert sent == 2 * 60 == judge["requests"]  # the hybrid's verdicts are the judge mode's: no extra request
    accepted = hybrid["decided_by"]["symbolic"]
    assert hybrid["decided_by"] == {"symbolic": accepted, "judge": 60 - accepted} and 0 < accepted < 60
    assert hybrid["judge_rows"] == 60 - accepted and hybrid["requests"] == 2 * (60 - accepted)
    assert hybrid["judge_calls_saved"] == 2 * accepted
    # The rules' acceptances stand in the hybrid: its false positives include the symbolic ones.
    assert set(symbolic["false_positive_ids"]) <= set(hybrid["false_positive_ids"])
    assert hybrid["false_negatives"]["count"] == 0  # every rule's "no" went to the (here exact) judge


def test_recall_and_false_positives_per_kind_and_mode() -> None:
    """Every kind of answer gets its recall and its false positives, with an interval, in every mode."""
    picked = [r for r in ROWS if r.split == "heldout2"]  # 160 rows, every kind, half of them right
    with FakeProvider(responder=scripted_responder(ROWS)) as fake:
        code, payload = _meta_eval(fake, "--limit", str(len(ROWS)))
    assert code == 0, payload
    modes = {r["mode"]: r for r in payload["suites"][0]["results"]}
    for mode in ("symbolic", "judge", "hybrid"):
        figures = modes[mode]["by_kind"]
        assert set(figures) == {"number", "expression", "choice", "string"}
        for kind, cell in figures.items():
            right = sum(r.kind == kind and r.verdict == "correct" for r in ROWS)
            assert (cell["recall"]["n"], cell["recall"]["method"]) == (right, "wilson") and cell["recall"]["low"] <= cell["recall"]["rate"]
            assert cell["false_positives"]["n"] == sum(r.kind == kind and r.verdict == "incorrect" for r in ROWS)
    assert all(cell["recall"]["rate"] == 1.0 and cell["false_positives"]["count"] == 0 for cell in modes["judge"]["by_kind"].values())
    rules = modes["symbolic"]["by_kind"]
    assert rules["choice"]["recall"]["rate"] > 0.9 and rules["string"]["recall"]["rate"] > 0.8  # the rules read choices and strings
    assert len(picked) == 160


def test_the_text_report_has_the_per_kind_table_and_rules_names_the_rules_mode() -> None:
    done = CliRunner().invoke(app, ["meta-eval", "--suite", "answer-verification", "--mode", "rules", "--limit", "40"])
    assert done.exit_code == 0, done.output
    assert "per kind of answer" in done.output and "recall" in done.output and "symbolic" in done.output
    assert "answer-verification: 40 rows" in done.output
