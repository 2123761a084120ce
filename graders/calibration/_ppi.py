"""Prediction-powered inference: a few hundred human labels plus many judge scores -> an honest interval.

The classical PPI mean estimator (Angelopoulos et al., "Prediction-powered inference", Science
2023): the judge's mean over the unlabelled rows, corrected by the judge's mean error on the
labelled rows (the rectifier). Its normal interval is valid whatever the judge's quality; a good
judge makes it narrower than the interval from the human labels alone, a bad one does not.

    theta = mean(f over unlabelled) - mean(f - y over labelled)
    theta +/- z(1 - alpha/2) * sqrt(var_f / N + var_d / n)

with N unlabelled and n labelled rows, var_f the sample variance (ddof 1) of the judge score f
over the unlabelled rows and var_d that of f - y over the labelled rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from statistics import NormalDist, fmean, variance
from typing import Any

from pydantic import BaseModel

from ._agreement import _as_float, as_label


class PPIError(ValueError):
    """Not enough rows, or labels that cannot be scored; the message says which."""


class Estimate(BaseModel):
    estimate: float
    ci_low: float | None = None
    ci_high: float | None = None


class Mean(BaseModel):
    estimate: float


class PPIReport(BaseModel):
    """The PPI estimate of the mean human score over all rows, beside the human-only and judge-only means."""

    estimate: float
    ci_low: float
    ci_high: float
    n_labeled: int
    n_unlabeled: int
    alpha: float
    human_only: Estimate
    judge_only: Mean  # the judge's mean over every row: no interval, its bias is unknown without labels
    width_ratio: float | None  # PPI interval width / human-only width (< 1: the judge bought precision)
    rows_without_judge_score: int = 0  # graded rows left out: the judge failed on them
    labels_without_graded_row: int = 0


def _z(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise PPIError(f"alpha must lie between 0 and 1, not {alpha}")
    return NormalDist().inv_cdf(1 - alpha / 2)


def ppi_mean(judge_unlabeled: Sequence[float], judge_labeled: Sequence[float], human_labeled: Sequence[float],
             *, alpha: float = 0.05) -> PPIReport:
    """The PPI mean and its normal interval, from plain lists (``judge_labeled[i]`` and ``human_labeled[i]`` are one row)."""
    z = _z(alpha)
    f, g, y = list(map(float, judge_unlabeled)), list(map(float, judge_labeled)), list(map(float, human_labeled))
    if len(g) != len(y):
        raise PPIError(f"{len(g)} judge scores but {len(y)} human scores on the labelled rows")
    if len(y) < 2 or len(f) < 2:
        raise PPIError(f"PPI needs at least 2 labelled and 2 unlabelled rows with a judge score; have {len(y)} and {len(f)}")
    diff = [a - b for a, b in zip(g, y)]
    theta = fmean(f) - fmean(diff)
    half = z * math.sqrt(variance(f) / len(f) + variance(diff) / len(y))
    human = fmean(y)
    human_half = z * math.sqrt(variance(y) / len(y))
    return PPIReport(
        estimate=theta, ci_low=theta - half, ci_high=theta + half, n_labeled=len(y), n_unlabeled=len(f), alpha=alpha,
        human_only=Estimate(estimate=human, ci_low=human - human_half, ci_high=human + human_half),
        judge_only=Mean(estimate=fmean(f + g)),
        width_ratio=half / human_half if human_half > 0 else None,
    )


def _number(value: Any) -> float | None:
    number = _as_float(value) if not isinstance(value, bool) else None
    return number if number is not None and math.isfinite(number) else None


def _keys(rows: Sequence[Mapping[str, Any]], on: str, where: str) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    """(row number, key, row) with every key present and unique, or a PPIError naming the row."""
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        key = as_label(row.get(on))
        if key is None:
            raise PPIError(f"{where} row {number}: no {on!r}")
        if key in seen:
            raise PPIError(f"{where} row {number}: key {on}={key!r} appears twice")
        seen.add(key)
        yield number, key, row


def human_score_map(graded: Sequence[Mapping[str, Any]], label_scores: Mapping[str, float] | None) -> dict[str, float]:
    """How a human label becomes a score: the rubric's map, else pairwise winners, else the graded rows' own labels."""
    if label_scores is not None:
        return {str(k): float(v) for k, v in label_scores.items()}
    if graded and "winner_ab" in graded[0]:
        return {"1": 1.0, "2": -1.0, "tie": 0.0}  # a pairwise score > 0 favours output_1
    found: dict[str, float] = {}
    for row in graded:
        label, score = as_label(row.get("label")), _number(row.get("score"))
        if label is not None and score is not None and row.get("status") in (None, "", "ok"):
            found.setdefault(label, score)
    return found


def ppi_rows(
    graded: Sequence[Mapping[str, Any]],
    label_rows: Sequence[Mapping[str, Any]],
    *,
    on: str,
    human_column: str = "label",
    label_scores: Mapping[str, float] | None = None,
    alpha: float = 0.05,
    source: str = "graded file",
    labels_source: str = "labels file",
) -> PPIReport:
    """PPI over a graded file (every row has the judge's ``score``) and a labels file joined on ``on``.

    The human score of a row is the labels file's numeric ``score`` column when it has one, else
    ``label_scores[label]`` (the rubric's map), else the label read as a pairwise winner or through
    the judge's own label -> score pairs in the graded file. Graded rows without a judge score
    (errors) are left out and counted.
    """
    scores = human_score_map(graded, label_scores)
    human: dict[str, float] = {}
    for number, key, row in _keys(label_rows, on, labels_source):
        value = _number(row.get("score")) if "score" in row else None
        if value is None:
            label = as_label(row.get(human_column))
            if label is None:
                raise PPIError(f"{labels_source} row {number}: no {human_column!r} and no numeric 'score'")
            if label not in scores:
                raise PPIError(f"{labels_source} row {number}: label {label!r} has no score "
                               f"(known: {', '.join(sorted(scores)) or 'none'}); pass the rubric with -r or add a numeric 'score' column")
            value = scores[label]
        human[key] = value
    unlabeled: list[float] = []
    judge_labeled: list[float] = []
    human_labeled: list[float] = []
    missing = 0
    seen: set[str] = set()
    for _, key, row in _keys(graded, on, source):
        seen.add(key)
        f = _number(row.get("score")) if row.get("status") in (None, "", "ok") else None
        if f is None:
            missing += 1
            continue
        if key in human:
            judge_labeled.append(f)
            human_labeled.append(human[key])
        else:
            unlabeled.append(f)
    report = ppi_mean(unlabeled, judge_labeled, human_labeled, alpha=alpha)
    report.rows_without_judge_score = missing
    report.labels_without_graded_row = len(set(human) - seen)
    return report
