"""Prediction-powered inference: a few hundred human labels plus many judge scores -> an honest interval.

The classical PPI mean estimator (Angelopoulos et al., "Prediction-powered inference", Science
2023): the judge's mean over the unlabelled rows, corrected by the judge's mean error on the
labelled rows (the rectifier). Its normal interval is valid whatever the judge's quality; a good
judge makes it narrower than the interval from the human labels alone, a bad one does not.

    theta = mean(f over unlabelled) - mean(f - y over labelled)
    theta +/- z(1 - alpha/2) * sqrt(var_f / N + var_d / n)

with N unlabelled and n labelled rows, var_f the sample variance (ddof 1) of the judge score f
over the unlabelled rows and var_d that of f - y over the labelled rows.

Labels drawn with recorded probabilities (the viewer's ``/api/next?strategy=active`` prefers rows
where the judge is unsure) are weighted by them (active statistical inference, Zrnic and Candès
2024). Rows are drawn one at a time without replacement, so the weighting is Des Raj's (1956)
sequential form: draw t picks row i_t with probability p_t among the rows still unlabelled, and

    z_t = sum(d over the rows drawn before t) + d_{i_t} / p_t,     d = y - f

is unbiased for the total of d over every row given the draws before it; their mean is too, and
their spread gives its variance (a martingale CLT). theta = mean(f) + mean(z) / N: the mean human
score over these N rows (design-based: the draws are the only randomness, so no var_f / N term). A label without
``p`` is taken as a uniform draw (p = 1 / rows left).

Intervals are normal (CLT) intervals intersected with the score's range: the mean lies in that
range, so the intersection covers whenever the interval does (coverage unchanged, never an end
past the scale). Below ~30 labels the normal approximation itself is rough; the report says so.
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
    method: str = "ppi"  # "ppi" (a uniform sample) or "ipw-ppi" (recorded draw probabilities, Des Raj weighting)
    score_range: tuple[float, float] | None = None  # what the intervals are clipped to
    warnings: list[str] = []


def _z(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise PPIError(f"alpha must lie between 0 and 1, not {alpha}")
    return NormalDist().inv_cdf(1 - alpha / 2)


SMALL_N = 30


def _clip(report: PPIReport, bounds: tuple[float, float] | None) -> PPIReport:
    """Intervals and estimates inside ``bounds`` (the score's range); width ratio from the clipped widths."""
    if report.n_labeled < SMALL_N:
        report.warnings.append(f"only {report.n_labeled} labels: the normal interval is approximate below {SMALL_N}")
    if bounds is None:
        return report
    lo, hi = bounds
    cut = lambda v: min(hi, max(lo, v))  # noqa: E731
    report.score_range = (lo, hi)
    report.estimate, report.ci_low, report.ci_high = cut(report.estimate), cut(report.ci_low), cut(report.ci_high)
    h = report.human_only
    h.estimate = cut(h.estimate)
    h.ci_low, h.ci_high = (cut(h.ci_low) if h.ci_low is not None else None), (cut(h.ci_high) if h.ci_high is not None else None)
    report.judge_only.estimate = cut(report.judge_only.estimate)
    human_width = (h.ci_high or 0) - (h.ci_low or 0)
    report.width_ratio = (report.ci_high - report.ci_low) / human_width if human_width > 0 else None
    return report


def ppi_mean_active(judge: Sequence[float | None], draws: Sequence[tuple[int, float, float | None]], *, alpha: float = 0.05,
                    bounds: tuple[float, float] | None = None) -> PPIReport:
    """IPW PPI over a pool of rows: ``judge[i]`` the judge's score of row i (None: no score, outside the population),
    ``draws`` the labelled rows in the order they were drawn as (row, human score, p or None for uniform)."""
    z = _z(alpha)
    pool = len(judge)
    population = [i for i, f in enumerate(judge) if f is not None]
    n_pop = len(population)
    if len({i for i, _, _ in draws}) != len(draws):
        raise PPIError("a row is labelled twice among the draws")
    if len(draws) < 2 or n_pop < 2:
        raise PPIError(f"PPI needs at least 2 labelled rows and 2 rows with a judge score; have {len(draws)} and {n_pop}")
    zs_d: list[float] = []
    zs_y: list[float] = []
    before_d = before_y = 0.0
    for t, (i, y, p) in enumerate(draws):
        if p is None:
            p = 1.0 / (pool - t)
        if not 0 < p <= 1 or not math.isfinite(p):
            raise PPIError(f"draw {t + 1} (row {i}): p={p} is not a probability in (0, 1]")
        f = judge[i]
        d = (y - f) if f is not None else 0.0  # a row without a judge score is outside the population: it adds nothing
        yy = y if f is not None else 0.0
        zs_d.append(before_d + d / p)
        zs_y.append(before_y + yy / p)
        before_d += d
        before_y += yy
    n = len(draws)
    f_all = [judge[i] for i in population]
    mean_f = fmean(f_all)  # type: ignore[arg-type]
    total_d, total_y = fmean(zs_d), fmean(zs_y)
    theta = mean_f + total_d / n_pop
    # Design-based: the target is the mean human score over these rows, so mean(f) is known exactly and only the
    # draws vary (the classic interval's var_f / N term is for a mean over the distribution the rows came from).
    half = z * math.sqrt(variance(zs_d) / n) / n_pop
    human = total_y / n_pop
    human_half = z * math.sqrt(variance(zs_y) / n) / n_pop
    report = PPIReport(
        estimate=theta, ci_low=theta - half, ci_high=theta + half, n_labeled=n, n_unlabeled=n_pop - sum(
            1 for i, _, _ in draws if judge[i] is not None), alpha=alpha,
        human_only=Estimate(estimate=human, ci_low=human - human_half, ci_high=human + human_half),
        judge_only=Mean(estimate=mean_f), width_ratio=half / human_half if human_half > 0 else None, method="ipw-ppi",
        rows_without_judge_score=pool - n_pop)
    return _clip(report, bounds)


def ppi_mean(judge_unlabeled: Sequence[float], judge_labeled: Sequence[float], human_labeled: Sequence[float],
             *, alpha: float = 0.05, bounds: tuple[float, float] | None = None) -> PPIReport:
    """The PPI mean and its normal interval, from plain lists (``judge_labeled[i]`` and ``human_labeled[i]`` are one row);
    ``bounds``: the score's range, which the estimate and intervals are clipped to."""
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
    return _clip(PPIReport(
        estimate=theta, ci_low=theta - half, ci_high=theta + half, n_labeled=len(y), n_unlabeled=len(f), alpha=alpha,
        human_only=Estimate(estimate=human, ci_low=human - human_half, ci_high=human + human_half),
        judge_only=Mean(estimate=fmean(f + g)),
        width_ratio=half / human_half if human_half > 0 else None,
    ), bounds)


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
    chance: dict[str, float | None] = {}
    for number, key, row in _keys(label_rows, on, labels_source):
        value = _number(row.get("score")) if "score" in row else None
        if value is None:
            label = as_label(row.get(human_column))
            if label is None:
                raise PPIError(f"{labels_source} row {number}: no {human_column!r} and no numeric 'score'")
            if label not in scores:
                raise PPIError(f"{labels_source} row {number}: label {label!r} has no score "
                               f"(known: {', '.join(sorted(scores)) or 'none'}); pass the rubric with -r, map the labels "
                               "with `label_map` HUMAN=JUDGE, or add a numeric 'score' column")
            value = scores[label]
        human[key] = value
        raw_p = row.get("p")
        chance[key] = None if raw_p is None or raw_p == "" else _number(raw_p)
        if raw_p not in (None, "") and (chance[key] is None or not 0 < chance[key] <= 1):  # type: ignore[operator]
            raise PPIError(f"{labels_source} row {number}: p={raw_p!r} is not a probability in (0, 1]")
    pool: list[float | None] = []
    at: dict[str, int] = {}
    for _, key, row in _keys(graded, on, source):
        at[key] = len(pool)
        pool.append(_number(row.get("score")) if row.get("status") in (None, "", "ok") else None)
    values = [v for v in pool if v is not None] + list(human.values()) + list(scores.values())
    bounds = (min(values), max(values)) if values else None
    orphans = len(set(human) - set(at))
    if any(p is not None for p in chance.values()):  # drawn with recorded probabilities: IPW in draw order
        draws = [(at[k], human[k], chance[k]) for k in human if k in at]
        report = ppi_mean_active(pool, draws, alpha=alpha, bounds=bounds)
    else:
        unlabeled = [f for k, f in zip(at, pool) if f is not None and k not in human]
        judge_labeled = [f for k, f in zip(at, pool) if f is not None and k in human]
        human_labeled = [human[k] for k, f in zip(at, pool) if f is not None and k in human]
        report = ppi_mean(unlabeled, judge_labeled, human_labeled, alpha=alpha, bounds=bounds)
        report.rows_without_judge_score = sum(1 for f in pool if f is None)
    report.labels_without_graded_row = orphans
    return report
