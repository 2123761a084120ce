"""Prediction-powered inference: the estimator against an independent computation, its coverage, and `calibrate --ppi`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from gradekit.graders.calibration._ppi import PPIError, ppi_mean
from gradekit.graders.cli import app


def test_estimate_and_interval_match_an_independent_numpy_computation() -> None:
    rng = np.random.default_rng(3)
    f_u = rng.normal(0.3, 1.0, 500)
    f_l = rng.normal(0.3, 1.0, 60)
    y = f_l - 0.2 + rng.normal(0, 0.5, 60)  # a judge biased by +0.2
    report = ppi_mean(f_u, f_l, y, alpha=0.1)
    theta = f_u.mean() - (f_l - y).mean()
    half = norm.ppf(0.95) * np.sqrt(f_u.var(ddof=1) / 500 + (f_l - y).var(ddof=1) / 60)
    assert report.estimate == pytest.approx(theta, abs=1e-12)
    assert (report.ci_low, report.ci_high) == (pytest.approx(theta - half, abs=1e-12), pytest.approx(theta + half, abs=1e-12))
    hh = norm.ppf(0.95) * y.std(ddof=1) / np.sqrt(60)
    assert (report.human_only.estimate, report.human_only.ci_high) == (pytest.approx(y.mean()), pytest.approx(y.mean() + hh))
    assert report.judge_only.estimate == pytest.approx(np.concatenate([f_u, f_l]).mean())
    assert report.width_ratio == pytest.approx(half / hh) and report.width_ratio < 1  # a good judge narrows it
    assert (report.n_labeled, report.n_unlabeled) == (60, 500)


def test_a_biased_judge_is_corrected_and_the_interval_covers_in_a_seeded_simulation() -> None:
    rng = random.Random(7)
    covered = 0
    for _ in range(400):
        truth = [rng.choice((1.0, -1.0)) for _ in range(1000)]
        judge = [t if rng.random() < 0.8 else 1.0 for t in truth]  # errs towards +1: its raw mean is biased
        labelled = set(rng.sample(range(1000), 100))
        r = ppi_mean([judge[i] for i in range(1000) if i not in labelled], [judge[i] for i in labelled],
                     [truth[i] for i in labelled])
        covered += r.ci_low <= sum(truth) / 1000 <= r.ci_high
    assert covered / 400 >= 0.92  # nominal 95%; fixed seed, so this is a deterministic check of the formula


def test_too_few_rows_and_a_bad_alpha_are_named_errors() -> None:
    with pytest.raises(PPIError, match="at least 2 labelled"):
        ppi_mean([0.0, 1.0], [1.0], [1.0])
    with pytest.raises(PPIError, match="alpha"):
        ppi_mean([0.0, 1.0], [1.0, 0.0], [1.0, 0.0], alpha=1.5)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_calibrate_ppi_json_has_the_documented_fields(tmp_path: Path) -> None:
    rng = random.Random(1)
    graded, labels = [], []
    for i in range(300):
        truth = rng.random() < 0.6
        said = truth if rng.random() < 0.85 else not truth
        graded.append({"id": i, "label": "correct" if said else "incorrect", "score": 1.0 if said else -1.0, "status": "ok"})
        if i % 5 == 0:
            labels.append({"id": i, "label": "correct" if truth else "incorrect"})
    graded.append({"id": 300, "label": None, "score": None, "status": "error", "error_kind": "timeout"})
    g, lab = _write(tmp_path / "graded.jsonl", graded), _write(tmp_path / "labels.jsonl", labels)
    result = CliRunner().invoke(app, ["calibrate", str(g), "--labels", str(lab), "--on", "id", "--ppi", "--json",
                                      "--bootstrap", "0", "-r", "semantic_equivalence_en"])
    assert result.exit_code == 0, result.output
    ppi = json.loads(result.output)["ppi"]
    assert {"estimate", "ci_low", "ci_high", "n_labeled", "n_unlabeled", "human_only", "judge_only"} <= set(ppi)
    assert set(ppi["human_only"]) == {"estimate", "ci_low", "ci_high"} and set(ppi["judge_only"]) == {"estimate"}
    assert (ppi["n_labeled"], ppi["n_unlabeled"], ppi["rows_without_judge_score"]) == (60, 240, 1)
    truth_y = [1.0 if r["label"] == "correct" else 0.0 for r in labels]  # the rubric scores incorrect 0, not -1
    assert ppi["human_only"]["estimate"] == pytest.approx(sum(truth_y) / 60)
    text = CliRunner().invoke(app, ["calibrate", str(g), "--labels", str(lab), "--on", "id", "--ppi", "--alpha", "0.1",
                                    "--bootstrap", "0"])
    assert text.exit_code == 0, text.output
    assert "90% intervals" in text.output and "human labels only (60)" in text.output and "judge only" in text.output


def test_calibrate_ppi_takes_numeric_scores_and_refuses_what_it_cannot_score(tmp_path: Path) -> None:
    g = _write(tmp_path / "graded.jsonl", [{"id": i, "label": "Yes", "score": 0.5 + (i % 3) / 10, "status": "ok"} for i in range(20)])
    scores = _write(tmp_path / "scores.jsonl", [{"id": i, "score": 0.4 + (i % 2) / 10} for i in range(0, 20, 4)])
    result = CliRunner().invoke(app, ["calibrate", str(g), "--labels", str(scores), "--on", "id", "--ppi", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ppi"]["n_labeled"] == 5
    odd = _write(tmp_path / "odd.jsonl", [{"id": 0, "label": "Maybe"}, {"id": 4, "label": "Yes"}])
    bad = CliRunner().invoke(app, ["calibrate", str(g), "--labels", str(odd), "--on", "id", "--ppi", "--bootstrap", "0"])
    assert bad.exit_code == 2 and "'Maybe' has no score" in bad.output
    assert CliRunner().invoke(app, ["calibrate", str(g), "--ppi"]).exit_code == 2
