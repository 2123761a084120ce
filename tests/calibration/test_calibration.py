"""Calibration metrics against textbook values, the conventions they name, plots, the CLI, and logprob scores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gradekit.graders.calibration._agreement import (
    as_label,
    calibrate,
    calibrate_rows,
    correlations,
    judge_agreement,
    majority_vote,
    mean_vote,
    pairwise_report,
    plot_confusion,
    plot_position_bias,
    plot_scores,
)
from gradekit.graders.cli import app
from gradekit.judge import load_rubric
from gradekit.judge.testing import Reply

# Wikipedia's Cohen's kappa example: 50 items, yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> kappa 0.4.
KAPPA_HUMAN = ["yes"] * 25 + ["no"] * 25
KAPPA_JUDGE = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15


def test_textbook_kappa_accuracy_confusion_and_per_label_figures() -> None:
    r = calibrate(KAPPA_HUMAN, KAPPA_JUDGE, labels=["yes", "no"], bootstrap=0)
    assert r.kappa == pytest.approx(0.4)
    assert r.accuracy == pytest.approx(35 / 50)
    assert r.confusion == [[20, 5], [10, 15]]
    assert r.per_label["yes"].precision == pytest.approx(20 / 30) and r.per_label["yes"].recall == pytest.approx(20 / 25)
    assert r.per_label["no"].f1 == pytest.approx(2 * (15 / 20) * (15 / 25) / (15 / 20 + 15 / 25))
    assert r.base_rates == {"human": {"yes": 0.5, "no": 0.5}, "judge": {"yes": 0.6, "no": 0.4}}
    assert len(r.disagreements) == 15 and r.accuracy_ci is None


def test_failures_are_skipped_and_counted_never_scored() -> None:
    human = ["a", "b", "a", "b", None]
    judge = ["a", None, None, "b", "a"]
    kinds = [None, "parse_failure", "timeout", None, None]
    r = calibrate(human, judge, error_kinds=kinds, ids=["q1", "q2", "q3", "q4", "q5"], bootstrap=0)
    assert (r.n, r.unlabelled, r.judged, r.failures) == (4, 1, 2, 2)
    assert r.accuracy == 1.0  # over the judged items only
    assert r.failure_rate == 0.5 and r.parse_failure_rate == 0.25
    assert r.failures_by_kind == {"parse_failure": 1, "timeout": 1}
    assert [(d.id, d.judge, d.error_kind) for d in r.disagreements] == [("q2", None, "parse_failure"), ("q3", None, "timeout")]


def test_weighted_kappa_follows_the_given_label_order() -> None:
    human = ["low", "mid", "high", "mid", "low", "high", "mid", "high"]
    judge = ["low", "high", "high", "mid", "mid", "mid", "mid", "low"]
    ordered = calibrate(human, judge, labels=["low", "mid", "high"], ordinal=True, bootstrap=0)
    alphabetical = calibrate(human, judge, labels=["high", "low", "mid"], ordinal=True, bootstrap=0)
    plain = calibrate(human, judge, labels=["low", "mid", "high"], bootstrap=0)
    assert ordered.kappa_weights == "quadratic" and plain.kappa_weights is None
    assert ordered.kappa != pytest.approx(alphabetical.kappa)  # the order reached the weights
    assert ordered.kappa != pytest.approx(plain.kappa)
    with pytest.raises(ValueError, match="explicit order"):
        calibrate(human, judge, ordinal=True)


def test_numeric_labels_sort_as_numbers_and_give_correlations() -> None:
    r = calibrate([1, 2, 10, 2, 1], ["1", "2", "10", "10", "1"], bootstrap=0)
    assert r.labels == ["1", "2", "10"]
    assert r.correlation is not None and r.correlation.n == 5 and r.correlation.spearman is not None


def test_bootstrap_interval_is_seeded_contains_the_estimate_and_survives_degenerate_data() -> None:
    human = ["a", "b"] * 30
    judge = ["a", "b"] * 25 + ["b", "a"] * 5
    one = calibrate(human, judge, bootstrap=200, seed=1)
    two = calibrate(human, judge, bootstrap=200, seed=1)
    assert one.accuracy_ci == two.accuracy_ci and one.accuracy_ci.resamples == 200
    assert one.accuracy_ci.low < one.accuracy < one.accuracy_ci.high
    assert one.kappa_ci.low < one.kappa < one.kappa_ci.high
    perfect = calibrate(human, human, bootstrap=200)
    assert (perfect.accuracy_ci.low, perfect.accuracy_ci.high) == (1.0, 1.0)
    assert perfect.kappa_ci.low == pytest.approx(1.0)  # single-label resamples are skipped, not nan


def test_per_group_correlation_is_the_geval_average_not_the_pooled_one() -> None:
    # Within each document the judge ranks perfectly; across documents its scale is inverted.
    human = [1, 2, 3, 11, 12, 13, 21, 22, 23, 5, 5]
    judge = [21, 22, 23, 11, 12, 13, 1, 2, 3, 7, 8]
    groups = ["d1"] * 3 + ["d2"] * 3 + ["d3"] * 3 + ["flat"] * 2
    r = correlations(human, judge, groups=groups, bootstrap=0)
    assert r.spearman < 0 and r.kendall < 0
    assert r.spearman_group_mean == pytest.approx(1.0) and r.kendall_group_mean == pytest.approx(1.0)
    assert (r.groups, r.groups_skipped) == (3, 1)  # the constant-human group has no defined correlation


def test_pairwise_report_llmbar_convention_counts_failures_as_wrong_and_double_failures_as_agreeing() -> None:
    ab = ["1", "2", "1", None, "2"]
    ba = ["1", "1", "1", None, None]
    gold = [1, 2, 2, 1, 2]
    llmbar = pairwise_report(ab, ba, gold)
    assert (llmbar.correct_ab, llmbar.correct_ba, llmbar.agree_count) == (3, 1, 3)
    assert llmbar.acc == pytest.approx((3 + 1) / 2 / 5) and llmbar.agr == pytest.approx(3 / 5)
    skip = pairwise_report(ab, ba, gold, convention="skip")
    assert skip.acc_ab == pytest.approx(3 / 4) and skip.acc_ba == pytest.approx(1 / 3)
    assert skip.agr == pytest.approx(2 / 3)  # pairs judged in both orders only
    assert (skip.failures_ab, skip.failures_ba, skip.conflicts, skip.both_judged) == (1, 2, 1, 3)


def test_a_judge_that_always_picks_the_first_output_shows_full_position_bias() -> None:
    n = 40
    r = pairwise_report(["1"] * n, ["2"] * n, ["1", "2"] * (n // 2))
    assert r.first_position_win_rate == 1.0 and r.conflict_rate == 1.0 and r.agr == 0.0
    assert r.acc == 0.5 and r.position_bias_p < 1e-20
    fair = pairwise_report(["1", "2"] * 20, ["1", "2"] * 20, ["1", "2"] * 20)
    assert fair.first_position_win_rate == 0.5 and fair.position_bias_p == 1.0 and fair.acc == 1.0


def test_krippendorff_alpha_matches_the_reference_example() -> None:
    # The krippendorff package's documented example: nominal 0.691, interval 0.811 (nan = missing).
    nan = None
    data = {
        "A": [nan, nan, nan, nan, nan, 3, 4, 1, 2, 1, 1, 3, 3, nan, 3],
        "B": [1, nan, 2, 1, 3, 3, 4, 3, nan, nan, nan, nan, nan, nan, nan],
        "C": [nan, nan, 2, 1, 3, 4, 4, nan, 2, 1, 1, 3, 3, nan, 4],
    }
    assert judge_agreement(data).krippendorff_alpha == pytest.approx(0.691, abs=1e-3)
    assert judge_agreement(data, level="interval").krippendorff_alpha == pytest.approx(0.811, abs=1e-3)
    report = judge_agreement(data)
    assert report.pairwise_agreement["A | C"] == pytest.approx(6 / 8)
    assert set(report.pairwise_kappa) == {"A | B", "A | C", "B | C"}


def test_votes_across_judges() -> None:
    votes = {"gpt": ["a", "b", "a", None], "claude": ["a", "b", "b", None], "qwen": ["b", "a", "c", "a"]}
    assert majority_vote(votes) == ["a", "b", None, "a"]  # a three-way split has no majority
    assert mean_vote({"x": [1, None, 0.5], "y": [0, None, None]}) == [0.5, None, 0.5]
    with pytest.raises(ValueError, match="item counts differ"):
        majority_vote({"x": ["a"], "y": ["a", "b"]})


def test_labels_are_one_spelling() -> None:
    assert [as_label(v) for v in (1, 1.0, "1", " 1 ", np.int64(1), float("nan"), "", None, True)] == \
        ["1", "1", "1", "1", "1", None, None, None, "true"]


def test_plots_are_png_files(tmp_path: Path) -> None:
    report = calibrate(KAPPA_HUMAN, KAPPA_JUDGE, bootstrap=0)
    paths = [tmp_path / "c.png", tmp_path / "s.png", tmp_path / "p.png"]
    plot_confusion(report, paths[0])
    plot_scores([1, 2, 3, 4], [1, 3, 2, 4], paths[1])
    plot_position_bias({"gpt-4": pairwise_report(["1", "2"], ["1", "1"], [1, 2]),
                        "biased": pairwise_report(["1"] * 4, ["2"] * 4, [1, 2, 1, 2])}, paths[2])
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_labels_file_joins_on_a_key_and_bad_files_are_named() -> None:
    graded = [{"id": "q1", "label": "correct", "score": 1, "status": "ok"},
              {"id": "q2", "label": "incorrect", "score": 0, "status": "ok"},
              {"id": "q3", "label": None, "score": None, "status": "error", "error_kind": "parse_failure"}]
    labels = [{"id": "q2", "label": "correct"}, {"id": "q1", "label": "correct"}, {"id": "q9", "label": "incorrect"}]
    result = calibrate_rows(graded, labels, on="id", bootstrap=0)
    c = result.classification
    assert (c.n, c.unlabelled, c.judged, c.accuracy) == (2, 1, 2, 0.5)
    assert result.labels_without_graded_row == 1 and result.human_scores == [1.0, 1.0, None]
    with pytest.raises(ValueError, match="labels.jsonl row 2: key id='q1' appears twice"):
        calibrate_rows(graded, [labels[1], labels[1]], on="id", labels_source="labels.jsonl")
    with pytest.raises(ValueError, match="holds the judge's verdict"):
        calibrate_rows(graded)


def test_calibrate_command_on_a_pairwise_file(tmp_path: Path) -> None:
    rows = [{"idx": i, "label": 1 + i % 2, "winner": w, "winner_ab": w, "winner_ba": w, "status": "ok", "score": 1.0}
            for i, w in enumerate(["1", "2", "1", "1", "2", "2"])]
    graded = _write_jsonl(tmp_path / "graded.jsonl", rows)
    result = CliRunner().invoke(app, ["calibrate", str(graded), "--json", "--bootstrap", "50", "--plots", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["version"] == 1 and payload["kind"] == "pairwise"
    assert payload["pairwise"]["acc"] == pytest.approx(4 / 6) and payload["pairwise"]["agr"] == 1.0
    assert {Path(p).name for p in payload["plots"]} == {"confusion.png", "position_bias.png"}
    text = CliRunner().invoke(app, ["calibrate", str(graded), "--bootstrap", "0"])
    assert text.exit_code == 0 and "Acc 66.7%" in text.output and "idx=" not in text.output.split("disagreements")[0]
    missing = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(graded)])
    assert missing.exit_code == 2 and "--on KEY" in missing.output


# ---- G-Eval-style scores from logprobs ------------------------------------------------------------


def _token(text: str, alternatives: dict[str, float]) -> dict:
    chosen = alternatives.get(text, 1.0)
    return {"token": text, "logprob": math.log(chosen),
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in alternatives.items()]}


PAIR = load_rubric("llmbar_pairwise")
PAIR_ROW = {"instruction": "Name a prime.", "output_1": "11", "output_2": "12"}


async def test_logprob_score_weights_the_verdict_token_and_ignores_tokens_below_one_percent(fake, make_judge) -> None:
    tokens = [_token("Output", {"Output": 1.0}), _token(" (", {" (": 1.0}),
              _token("a", {"a": 0.7, "b": 0.295, "c": 0.004}), _token(")", {")": 0.99, ").": 0.009})]
    fake.push(Reply(content="Output (a)", logprobs=tokens))
    verdict = await make_judge(logprobs=5).judge(PAIR, PAIR_ROW)
    assert verdict.label == "Output (a)" and verdict.read.score_source == "logprobs"
    assert verdict.score == pytest.approx((0.7 - 0.295) / (0.7 + 0.295))
    sent = fake.chat_requests()[0].body
    assert sent["logprobs"] is True and sent["top_logprobs"] == 5


async def test_logprob_score_searches_from_the_end_past_labels_in_the_reasoning(fake, make_judge) -> None:
    zh = load_rubric("semantic_equivalence_zh")
    words = ['{"', "rationale", '":"', "不", "正确", "的", "说法", '","', "judgement", '":"', "正确", '"}']
    tokens = [_token(w, {w: 1.0}) for w in words]
    tokens[4] = _token("正确", {"正确": 0.5, "错误": 0.5})  # the label word inside the rationale
    tokens[10] = _token("正确", {"正确": 0.8, "错误": 0.2})
    fake.push(Reply(content="".join(words), logprobs=tokens))
    verdict = await make_judge(logprobs=3).judge(zh, {"question": "q", "references": ["a"], "prediction": "a"})
    assert verdict.label == "正确" and verdict.score == pytest.approx(0.8) and verdict.read.score_source == "logprobs"


async def test_without_logprobs_from_the_server_the_row_says_the_plain_verdict_was_used(fake, make_judge) -> None:
    fake.push(Reply(content="Output (b)"))
    judge = make_judge(logprobs=5)
    verdict = await judge.judge(PAIR, PAIR_ROW)
    assert (verdict.score, verdict.read.score_source) == (-1.0, "label_no_logprobs")
    plain = await make_judge().judge(PAIR, {**PAIR_ROW, "output_2": "13"})
    assert plain.read.score_source == "label" and "logprobs" not in fake.chat_requests()[-1].body
    with pytest.raises(ValueError, match="between 1 and 20"):
        make_judge(logprobs=0)


def test_a_graded_eval_set_calibrates_against_its_own_kept_label_column(tmp_path: Path) -> None:
    # grade_file keeps an input column it would overwrite as input_<name>: the human label beside the judge's.
    graded = [{"id": i, "input_label": h, "label": j, "score": {"correct": 1, "incorrect": 0}[j], "status": "ok"}
              for i, (h, j) in enumerate([("correct", "correct"), ("incorrect", "correct"), ("incorrect", "incorrect")])]
    result = calibrate_rows(graded, bootstrap=0)
    assert result.human_column == "input_label" and result.classification.accuracy == pytest.approx(2 / 3)
    assert result.human_scores == [1.0, 0.0, 0.0] and result.classification.correlation.n == 3


def test_calibrate_errors_name_the_columns_and_the_option_to_pick_another(tmp_path: Path) -> None:
    graded = tmp_path / "graded.jsonl"
    graded.write_text(json.dumps({"id": 1, "label": "Yes", "status": "ok", "score": 1.0}) + "\n", encoding="utf-8")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"id": 1, "verdict": "Yes"}) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(labels), "--on", "id"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "'label' is missing" in text and "columns are id, verdict" in text, text
    assert "--human-column verdict" in text
    result = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(labels), "--on", "key"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "'key' is missing" in text and "columns are id, verdict" in text and "--on COLUMN" in text, text


@pytest.mark.parametrize("n", [1, 2, 3, 10, 11, 57, 400, 2001])
def test_fair_coin_p_is_scipys_binomtest(n: int) -> None:
    """The pairwise report's position-bias p-value is exact without SciPy (the core install) and equals SciPy's."""
    from scipy.stats import binomtest

    from gradekit.graders.calibration._agreement import fair_coin_p

    for k in sorted({0, 1, n // 3, n // 2, (n + 1) // 2, n - 1, n} - {-1}):
        assert fair_coin_p(k, n) == pytest.approx(binomtest(k, n, 0.5).pvalue, rel=1e-9, abs=1e-300), (k, n)
    with pytest.raises(ValueError):
        fair_coin_p(n + 1, n)
