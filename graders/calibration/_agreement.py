"""Calibration: how well a judge agrees with human labels, with itself across orders, and with other judges.

Pure functions over lists, returning pydantic reports; the statistics come from scikit-learn and
scipy (and ``krippendorff`` for Krippendorff's alpha), not from formulas written here. A judge
failure is passed as ``None``: aggregates skip it and count it, except where a convention that
says otherwise is named (LLMBar's Acc / Agr, which count a failure as a wrong answer).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections import Counter
from fractions import Fraction
from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from gradekit._extras import require

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.figure import Figure

Weights = Literal["linear", "quadratic"]
PairConvention = Literal["llmbar", "skip"]

__all__ = [
    "CalibrationReport",
    "CorrelationReport",
    "FileCalibration",
    "Interval",
    "JudgeAgreementReport",
    "PairwiseReport",
    "calibrate",
    "calibrate_rows",
    "correlations",
    "judge_agreement",
    "majority_vote",
    "mean_vote",
    "pairwise_report",
    "plot_confusion",
    "plot_position_bias",
    "plot_scores",
]


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------


class Interval(BaseModel):
    """A bootstrap confidence interval (percentile method)."""

    low: float | None
    high: float | None
    confidence: float = 0.95
    resamples: int = 0


class LabelStats(BaseModel):
    precision: float
    recall: float
    f1: float
    support: int  # items with this human label


class Disagreement(BaseModel):
    """One item where the judge's verdict differs from the human label (or the judge failed)."""

    index: int  # 0-based position in the inputs
    id: str | None = None
    human: str
    judge: str | None  # None: the judge failed on this item
    error_kind: str | None = None


class CorrelationReport(BaseModel):
    """Rank correlation of judge scores with human scores, per item and averaged per group (G-Eval)."""

    n: int
    spearman: float | None = None
    spearman_p: float | None = None
    spearman_ci: Interval | None = None
    kendall: float | None = None  # tau-b, which corrects for ties (scipy's default)
    kendall_p: float | None = None
    kendall_ci: Interval | None = None
    groups: int = 0  # groups that entered the per-group average
    groups_skipped: int = 0  # groups with < 2 items or a constant score: correlation undefined
    spearman_group_mean: float | None = None
    kendall_group_mean: float | None = None


class CalibrationReport(BaseModel):
    """Judge verdicts against human labels for one labelled set."""

    n: int  # items with a human label
    unlabelled: int = 0  # items dropped because they carry no human label
    judged: int  # items the judge gave a verdict on
    failures: int
    failure_rate: float
    parse_failure_rate: float
    failures_by_kind: dict[str, int] = Field(default_factory=dict)
    labels: list[str]
    accuracy: float | None
    accuracy_ci: Interval | None = None
    per_label: dict[str, LabelStats] = Field(default_factory=dict)
    macro_f1: float | None = None
    confusion: list[list[int]] = Field(default_factory=list)  # rows: human label, columns: judge label
    kappa: float | None = None
    kappa_weights: Weights | None = None
    kappa_ci: Interval | None = None
    base_rates: dict[str, dict[str, float]] = Field(default_factory=dict)  # {"human": {...}, "judge": {...}}
    correlation: CorrelationReport | None = None
    disagreements: list[Disagreement] = Field(default_factory=list)


class PairwiseReport(BaseModel):
    """A pairwise judge asked in both orders: LLMBar's Acc and Agr, position bias and conflicts.

    ``ab`` is the order the input gives (output_1 shown first), ``ba`` the swapped order; every
    winner is already in the input's numbering ("1", "2", "tie", or None when the judge failed).
    """

    n: int
    convention: PairConvention
    labelled: bool
    orders: int = 2  # 1: a one-order (--no-swap) file: Acc is the input order's, and no Agr, conflicts or bias exist
    acc: float | None = None  # mean over the two orders of winner == label (LLMBar's Acc)
    acc_ab: float | None = None
    acc_ba: float | None = None
    acc_ci: Interval | None = None
    both_correct: float | None = None
    agr: float | None = None  # share of pairs whose two orders name the same winner (LLMBar's Agr)
    correct_ab: int = 0
    correct_ba: int = 0
    both_correct_count: int = 0
    agree_count: int = 0
    failures_ab: int = 0
    failures_ba: int = 0
    ties: int = 0  # tie verdicts over both orders
    first_position_wins: int = 0
    decisive_verdicts: int = 0  # verdicts over both orders that named a winner
    first_position_win_rate: float | None = None  # 0.5 is unbiased
    position_bias_p: float | None = None  # two-sided binomial test against 0.5
    both_judged: int = 0
    conflicts: int = 0  # pairs judged in both orders whose winners differ
    conflict_rate: float | None = None


class JudgeAgreementReport(BaseModel):
    """Agreement among several judges on the same items (no human labels needed)."""

    judges: list[str]
    n: int
    level: Literal["nominal", "ordinal", "interval"]
    krippendorff_alpha: float | None
    pairwise_kappa: dict[str, float | None] = Field(default_factory=dict)  # "a | b" -> Cohen's kappa
    pairwise_agreement: dict[str, float | None] = Field(default_factory=dict)  # "a | b" -> share equal


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def as_label(value: Any) -> str | None:
    """One spelling per label: 1, 1.0 and "1" are the same label; None, NaN and "" are no label."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return None
        return str(int(value)) if float(value).is_integer() else str(float(value))
    text = str(value).strip()
    return text or None


def _as_float(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _order_labels(values: set[str], ordinal: bool) -> list[str]:
    def numeric(v: str) -> float | None:
        try:
            return float(v)
        except ValueError:
            return None

    if all(numeric(v) is not None for v in values):
        return sorted(values, key=lambda v: float(v))
    if ordinal:
        raise ValueError("ordinal labels that are not numbers need an explicit order: pass labels=[...]")
    return sorted(values)


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _clean(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def fair_coin_p(k: int, n: int) -> float:
    """Two-sided exact binomial test of ``k`` successes in ``n`` against p = 1/2 (scipy's ``binomtest``).

    Written out (exact integers) so that the pairwise report, which every LLMBar run makes, needs no
    SciPy in the core install. With p = 1/2 the distribution is symmetric, so SciPy's "outcomes no
    more likely than k" rule is twice the smaller tail; tests/calibration/test_calibration.py checks it against SciPy.
    """
    if not 0 <= k <= n:
        raise ValueError(f"fair_coin_p: k={k} is not within 0..n={n}")
    smaller = min(k, n - k)
    if 2 * smaller == n:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(smaller + 1))
    return min(1.0, float(Fraction(2 * tail, 2 ** n)))


def _seeded(function: Callable[..., Any], seed: int) -> dict[str, int]:
    """The seed keyword of a SciPy function: ``rng`` from SciPy 1.15 on (SPEC 7), ``random_state`` before it."""
    return {"rng": seed} if "rng" in inspect.signature(function).parameters else {"random_state": seed}


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Callable[..., float], *, vectorized: bool, resamples: int,
               confidence: float, seed: int) -> Interval | None:
    """Percentile bootstrap CI with scipy; None when there is too little data to resample.

    Percentile rather than scipy's default BCa: BCa is undefined (nan, with a warning) when the
    data are degenerate, e.g. a judge that agrees on every item, which calibration sets often are.
    """
    if resamples <= 0 or len(data[0]) < 2:
        return None
    require("calibration", "bootstrap intervals")
    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # undefined resamples are handled below
        result = bootstrap(data, statistic, n_resamples=resamples, vectorized=vectorized, paired=len(data) > 1,
                           confidence_level=confidence, method="percentile", **_seeded(bootstrap, seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):
        # Some resamples had an undefined statistic (one label only): take percentiles of the rest.
        dist = np.asarray(result.bootstrap_distribution, dtype=float)
        dist = dist[~np.isnan(dist)]
        if dist.size == 0:
            return Interval(low=None, high=None, confidence=confidence, resamples=resamples)
        tail = (1 - confidence) / 2 * 100
        low, high = float(np.percentile(dist, tail)), float(np.percentile(dist, 100 - tail))
    return Interval(low=low, high=high, confidence=confidence, resamples=resamples)


def kappa_interval(a: Sequence[int], b: Sequence[int], labels: int, *, resamples: int, confidence: float,
                   seed: int) -> Interval | None:
    """Percentile bootstrap interval of unweighted Cohen's kappa between two code sequences (0..labels-1), vectorized.

    scikit-learn's ``cohen_kappa_score`` takes about 10 ms a call, so a 2,000-resample interval took 20 s; this computes
    every resample's confusion counts at once (tests/calibration/test_align.py checks it against scikit-learn's value).
    """
    x, y = np.asarray(a, dtype=int), np.asarray(b, dtype=int)

    def statistic(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
        p, q = np.moveaxis(p, axis, -1), np.moveaxis(q, axis, -1)
        n = p.shape[-1]
        observed = (p == q).mean(axis=-1)
        expected = sum((p == k).mean(axis=-1) * (q == k).mean(axis=-1) for k in range(labels))
        with np.errstate(invalid="ignore", divide="ignore"):
            value = (observed - expected) / (1 - expected)
        return np.where(np.isclose(expected, 1.0), np.nan, value) if n else value

    return _bootstrap((x, y), statistic, vectorized=True, resamples=resamples, confidence=confidence, seed=seed)


# ----------------------------------------------------------------------------------------------
# Judge against human labels
# ----------------------------------------------------------------------------------------------


def calibrate(
    human: Sequence[Any],
    judge: Sequence[Any],
    *,
    labels: Sequence[Any] | None = None,
    ordinal: bool = False,
    weights: Weights | None = None,
    error_kinds: Sequence[str | None] | None = None,
    ids: Sequence[Any] | None = None,
    human_scores: Sequence[Any] | None = None,
    judge_scores: Sequence[Any] | None = None,
    groups: Sequence[Any] | None = None,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> CalibrationReport:
    """Compare a judge's labels with human labels item by item.

    Args:
        human: the human label per item; None marks an unlabelled item (dropped and counted).
        judge: the judge's label per item; None marks a judge failure (skipped and counted).
        labels: label order for the confusion matrix and for ordinal weights; default: sorted.
        ordinal: labels are ordered; kappa is then weighted (quadratic unless ``weights`` says).
        weights: Cohen's kappa weighting, as scikit-learn's ``cohen_kappa_score`` takes it.
        error_kinds: the Verdict error_kind per item, to tell parse failures from other failures.
        ids: item ids for the disagreement list.
        human_scores, judge_scores: numbers for rank correlations (e.g. judge score vs a human
            rating); when omitted and all labels are numbers, the labels themselves are used.
        groups: a group per item (e.g. the source document) for G-Eval's per-group average.
        bootstrap: resamples for the 95% intervals (0 skips them).
    """
    count = len(human)
    for name, seq in (("judge", judge), ("error_kinds", error_kinds), ("ids", ids), ("human_scores", human_scores),
                      ("judge_scores", judge_scores), ("groups", groups)):
        if seq is not None and len(seq) != count:
            raise ValueError(f"calibrate: {name} has {len(seq)} items but human has {count}")
    h_all = [as_label(v) for v in human]
    j_all = [as_label(v) for v in judge]
    keep = [i for i in range(count) if h_all[i] is not None]
    kinds = [(error_kinds[i] if error_kinds is not None else None) for i in keep]
    failed = [i for i in keep if j_all[i] is None]
    failures_by_kind = Counter((error_kinds[i] if error_kinds is not None else None) or "unknown" for i in failed)
    judged = [i for i in keep if j_all[i] is not None]
    h = [h_all[i] for i in judged]
    j = [j_all[i] for i in judged]

    if labels is not None:
        order = [as_label(v) for v in labels]
        unknown = {v for v in h + j if v not in order}
        if unknown:
            raise ValueError(f"calibrate: labels {sorted(unknown)} are not in the given label order {order}")
    else:
        order = _order_labels({v for v in h + j if v is not None} | {h_all[i] for i in keep}, ordinal)  # type: ignore[misc]
    if ordinal and weights is None:
        weights = "quadratic"

    report = CalibrationReport(
        n=len(keep), unlabelled=count - len(keep), judged=len(judged), failures=len(failed),
        failure_rate=len(failed) / len(keep) if keep else 0.0,
        parse_failure_rate=(failures_by_kind.get("parse_failure", 0) / len(keep)) if keep else 0.0,
        failures_by_kind=dict(failures_by_kind.most_common()), labels=order, accuracy=None,
        kappa_weights=weights,
    )
    human_counts = Counter(h_all[i] for i in keep)
    judge_counts = Counter(j)
    report.base_rates = {
        "human": {lab: human_counts.get(lab, 0) / len(keep) for lab in order} if keep else {},
        "judge": {lab: judge_counts.get(lab, 0) / len(j) for lab in order} if j else {},
    }
    report.disagreements = [
        Disagreement(index=i, id=None if ids is None else as_label(ids[i]), human=h_all[i], judge=j_all[i],  # type: ignore[arg-type]
                     error_kind=kind if j_all[i] is None else None)
        for i, kind in zip(keep, kinds) if j_all[i] != h_all[i]
    ]
    if not judged:
        return report

    require("calibration", "agreement with human labels (kappa, per-label precision and recall)")
    from sklearn.metrics import cohen_kappa_score, confusion_matrix, precision_recall_fscore_support

    correct = np.array([a == b for a, b in zip(h, j)], dtype=float)
    report.accuracy = float(correct.mean())
    report.accuracy_ci = _bootstrap((correct,), np.mean, vectorized=True, resamples=bootstrap,
                                    confidence=confidence, seed=seed)
    precision, recall, f1, support = precision_recall_fscore_support(h, j, labels=order, zero_division=0)
    report.per_label = {
        lab: LabelStats(precision=float(p), recall=float(r), f1=float(f), support=int(s))
        for lab, p, r, f, s in zip(order, precision, recall, f1, support)
    }
    present = [k for k, lab in enumerate(order) if support[k] > 0]
    report.macro_f1 = float(np.mean([f1[k] for k in present])) if present else None
    with warnings.catch_warnings():
        # One label seen (every human and the judge said "yes" for a criterion): the 1 x 1 matrix is the answer, not a
        # mistake scikit-learn should print on the user's terminal.
        warnings.simplefilter("ignore")
        report.confusion = confusion_matrix(h, j, labels=order).tolist()

    codes = {lab: k for k, lab in enumerate(order)}
    h_codes = np.array([codes[v] for v in h])
    j_codes = np.array([codes[v] for v in j])
    code_order = list(range(len(order)))

    def kappa(a: np.ndarray, b: np.ndarray) -> float:
        # Codes in label order, so linear/quadratic weights follow the given order.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(cohen_kappa_score(a, b, labels=code_order, weights=weights))

    report.kappa = _clean(kappa(h_codes, j_codes))
    if report.kappa is not None:
        report.kappa_ci = _bootstrap((h_codes, j_codes), kappa, vectorized=False, resamples=bootstrap,
                                     confidence=confidence, seed=seed)

    if human_scores is None and judge_scores is None and all(_as_float(v) is not None for v in h + j):
        hs: list[Any] = [float(v) for v in h]  # type: ignore[arg-type]
        js: list[Any] = [float(v) for v in j]  # type: ignore[arg-type]
        gs = None if groups is None else [groups[i] for i in judged]
    elif human_scores is not None and judge_scores is not None:
        hs = [human_scores[i] for i in judged]
        js = [judge_scores[i] for i in judged]
        gs = None if groups is None else [groups[i] for i in judged]
    else:
        hs = js = []
        gs = None
    if hs:
        report.correlation = correlations(hs, js, groups=gs, bootstrap=bootstrap, confidence=confidence, seed=seed)
    return report


def correlations(
    human_scores: Sequence[Any],
    judge_scores: Sequence[Any],
    *,
    groups: Sequence[Any] | None = None,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> CorrelationReport:
    """Spearman's rho and Kendall's tau-b (scipy) over all items, and averaged within groups.

    G-Eval reports correlations computed inside each group (e.g. the summaries of one document)
    and then averaged: a judge can rank within a document well yet put documents on different
    scales. Pairs where either score is missing are dropped.
    """
    require("calibration", "score correlations")
    from scipy.stats import kendalltau, spearmanr

    if len(human_scores) != len(judge_scores) or (groups is not None and len(groups) != len(human_scores)):
        raise ValueError("correlations: human_scores, judge_scores and groups must have the same length")
    pairs = [(i, _as_float(a), _as_float(b)) for i, (a, b) in enumerate(zip(human_scores, judge_scores))]
    pairs = [(i, a, b) for i, a, b in pairs if a is not None and b is not None]
    x = np.array([a for _, a, _ in pairs], dtype=float)
    y = np.array([b for _, _, b in pairs], dtype=float)
    report = CorrelationReport(n=len(pairs))

    def defined(a: np.ndarray, b: np.ndarray) -> bool:
        return len(a) >= 2 and np.ptp(a) > 0 and np.ptp(b) > 0

    def rho(a: np.ndarray, b: np.ndarray) -> float:
        return float(spearmanr(a, b).statistic) if defined(a, b) else float("nan")

    def tau(a: np.ndarray, b: np.ndarray) -> float:
        return float(kendalltau(a, b).statistic) if defined(a, b) else float("nan")

    if defined(x, y):
        s, k = spearmanr(x, y), kendalltau(x, y)
        report.spearman, report.spearman_p = _clean(s.statistic), _clean(s.pvalue)
        report.kendall, report.kendall_p = _clean(k.statistic), _clean(k.pvalue)
        report.spearman_ci = _bootstrap((x, y), rho, vectorized=False, resamples=bootstrap, confidence=confidence, seed=seed)
        report.kendall_ci = _bootstrap((x, y), tau, vectorized=False, resamples=bootstrap, confidence=confidence, seed=seed)
    if groups is not None:
        by_group: dict[Any, list[int]] = {}
        for k_, (i, _, _) in enumerate(pairs):
            by_group.setdefault(groups[i], []).append(k_)
        rhos, taus = [], []
        for members in by_group.values():
            gx, gy = x[members], y[members]
            if not defined(gx, gy):
                report.groups_skipped += 1
                continue
            rhos.append(rho(gx, gy))
            taus.append(tau(gx, gy))
        report.groups = len(rhos)
        report.spearman_group_mean = float(np.mean(rhos)) if rhos else None
        report.kendall_group_mean = float(np.mean(taus)) if taus else None
    return report


# ----------------------------------------------------------------------------------------------
# Pairwise judges: both orders
# ----------------------------------------------------------------------------------------------


def pairwise_report(
    winner_ab: Sequence[Any],
    winner_ba: Sequence[Any],
    labels: Sequence[Any] | None = None,
    *,
    convention: PairConvention = "llmbar",
    bootstrap: int = 0,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairwiseReport:
    """Acc, Agr, position bias and conflicts of a pairwise judge asked in both orders.

    Args:
        winner_ab: winner per pair with the outputs in input order ("1", "2", "tie"; None = failed).
        winner_ba: winner per pair from the swapped order, already mapped back to input numbering.
        labels: the gold winner per pair, or None for an unlabelled set (Agr and bias only).
        convention: ``"llmbar"`` counts a failed order as a wrong answer and two failed orders as
            agreeing, exactly as LLMBar's published ``statistics.json``; ``"skip"`` leaves failed
            orders out of Acc and failed pairs out of Agr. Failures are counted either way.
    """
    n = len(winner_ab)
    if len(winner_ba) != n or (labels is not None and len(labels) != n):
        raise ValueError(f"pairwise_report: winner_ab has {n} pairs, winner_ba {len(winner_ba)}"
                         + ("" if labels is None else f", labels {len(labels)}"))
    ab = [as_label(v) for v in winner_ab]
    ba = [as_label(v) for v in winner_ba]
    gold = None if labels is None else [as_label(v) for v in labels]
    report = PairwiseReport(n=n, convention=convention, labelled=gold is not None)
    report.failures_ab = sum(v is None for v in ab)
    report.failures_ba = sum(v is None for v in ba)
    report.ties = sum(v == "tie" for v in ab + ba)

    both = [i for i in range(n) if ab[i] is not None and ba[i] is not None]
    report.both_judged = len(both)
    report.conflicts = sum(ab[i] != ba[i] for i in both)
    report.conflict_rate = _ratio(report.conflicts, len(both))
    if convention == "llmbar":
        report.agree_count = sum(ab[i] == ba[i] for i in range(n))  # None == None agrees, as upstream
        # ...but over no pair judged in both orders, that "agreement" is two failures agreeing: no figure at all.
        report.agr = _ratio(report.agree_count, n) if both else None
    else:
        report.agree_count = len(both) - report.conflicts
        report.agr = _ratio(report.agree_count, len(both))

    # The output shown first is output_1 in the ab order and output_2 in the ba order.
    first_wins = sum(v == "1" for v in ab) + sum(v == "2" for v in ba)
    decisive = sum(v in ("1", "2") for v in ab + ba)
    report.first_position_wins, report.decisive_verdicts = first_wins, decisive
    report.first_position_win_rate = _ratio(first_wins, decisive)
    if decisive:
        report.position_bias_p = fair_coin_p(first_wins, decisive)

    if gold is None:
        return report
    hit_ab = np.array([a is not None and a == g for a, g in zip(ab, gold)], dtype=float)
    hit_ba = np.array([b is not None and b == g for b, g in zip(ba, gold)], dtype=float)
    report.correct_ab, report.correct_ba = int(hit_ab.sum()), int(hit_ba.sum())
    report.both_correct_count = int((hit_ab * hit_ba).sum())
    judged_any = report.failures_ab < n or report.failures_ba < n
    if convention == "llmbar":
        report.acc_ab, report.acc_ba = _ratio(report.correct_ab, n), _ratio(report.correct_ba, n)
        # A failed order counts as wrong (LLMBar's convention), but with no order answered the 0 is over nothing.
        report.acc = (report.correct_ab + report.correct_ba) / 2 / n if n and judged_any else None
        report.both_correct = _ratio(report.both_correct_count, n)
        per_pair = (hit_ab + hit_ba) / 2
    else:
        judged_ab, judged_ba = n - report.failures_ab, n - report.failures_ba
        report.acc_ab, report.acc_ba = _ratio(report.correct_ab, judged_ab), _ratio(report.correct_ba, judged_ba)
        report.acc = _ratio(report.correct_ab + report.correct_ba, judged_ab + judged_ba)
        report.both_correct = _ratio(report.both_correct_count, len(both))
        per_pair = np.array([(hit_ab[i] + hit_ba[i]) / 2 for i in both])
    report.acc_ci = _bootstrap((per_pair,), np.mean, vectorized=True, resamples=bootstrap, confidence=confidence, seed=seed)
    return report


def one_order_report(winner_ab: Sequence[Any], labels: Sequence[Any] | None = None, *, convention: PairConvention = "llmbar",
                     bootstrap: int = 0, confidence: float = 0.95, seed: int = 0) -> PairwiseReport:
    """The figures a pairwise judge asked in the input order only (``--no-swap``) has: that order's accuracy.

    There is no swapped order, so no Agr, no conflicts and no position bias (one order cannot tell a
    first-position preference from the better output being first); reading the missing order as
    failed would halve the accuracy and report an Agr of 0.
    """
    n = len(winner_ab)
    ab = [as_label(v) for v in winner_ab]
    report = PairwiseReport(n=n, convention=convention, labelled=labels is not None, orders=1)
    report.failures_ab = sum(v is None for v in ab)
    report.ties = sum(v == "tie" for v in ab)
    if labels is None:
        return report
    gold = [as_label(v) for v in labels]
    hit = np.array([a is not None and a == g for a, g in zip(ab, gold)], dtype=float)
    report.correct_ab = int(hit.sum())
    if convention == "skip":
        hit = np.array([h for h, a in zip(hit, ab) if a is not None])
    report.acc = report.acc_ab = _ratio(int(hit.sum()), len(hit))
    report.acc_ci = _bootstrap((hit,), np.mean, vectorized=True, resamples=bootstrap, confidence=confidence, seed=seed)
    return report


# ----------------------------------------------------------------------------------------------
# Several judges
# ----------------------------------------------------------------------------------------------


def _judge_table(ratings: Mapping[str, Sequence[Any]]) -> tuple[list[str], list[list[str | None]]]:
    names = list(ratings)
    if len(names) < 2:
        raise ValueError("judge agreement needs at least two judges")
    sizes = {name: len(values) for name, values in ratings.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every judge must rate the same items; item counts differ: {sizes}")
    return names, [[as_label(v) for v in ratings[name]] for name in names]


def judge_agreement(
    ratings: Mapping[str, Sequence[Any]],
    *,
    level: Literal["nominal", "ordinal", "interval"] = "nominal",
    labels: Sequence[Any] | None = None,
) -> JudgeAgreementReport:
    """Krippendorff's alpha across all judges, plus Cohen's kappa for every pair of judges.

    Alpha rather than Fleiss' kappa because judges fail on different items: alpha takes missing
    ratings (None) as they are, where Fleiss' kappa needs every item rated by every judge.
    """
    require("calibration", "judge agreement (Krippendorff's alpha, Cohen's kappa)")
    import krippendorff
    from sklearn.metrics import cohen_kappa_score

    names, table = _judge_table(ratings)
    values = {v for row in table for v in row if v is not None}
    if labels is not None:
        order = [as_label(v) for v in labels]
    else:
        order = _order_labels(values, level != "nominal") if values else []
    if level == "interval":
        codes = {lab: float(lab) for lab in order}  # type: ignore[arg-type]
    else:
        codes = {lab: float(k) for k, lab in enumerate(order)}
    matrix = np.array([[np.nan if v is None else codes[v] for v in row] for row in table], dtype=float)
    report = JudgeAgreementReport(judges=names, n=matrix.shape[1], level=level, krippendorff_alpha=None)
    if len(values) >= 2:
        report.krippendorff_alpha = _clean(krippendorff.alpha(reliability_data=matrix, level_of_measurement=level))
    for (a, row_a), (b, row_b) in combinations(zip(names, table), 2):
        both = [(x, y) for x, y in zip(row_a, row_b) if x is not None and y is not None]
        key = f"{a} | {b}"
        report.pairwise_agreement[key] = _ratio(sum(x == y for x, y in both), len(both))
        if both:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kappa = cohen_kappa_score([x for x, _ in both], [y for _, y in both], labels=order,
                                          weights="quadratic" if level != "nominal" else None)
            report.pairwise_kappa[key] = _clean(kappa)
        else:
            report.pairwise_kappa[key] = None
    return report


def majority_vote(votes: Mapping[str, Sequence[Any]]) -> list[str | None]:
    """Per item, the label most judges gave; None when the top labels tie or every judge failed."""
    _, table = _judge_table(votes)
    result: list[str | None] = []
    for item in zip(*table):
        counts = Counter(v for v in item if v is not None).most_common()
        if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
            result.append(None)
        else:
            result.append(counts[0][0])
    return result


def mean_vote(scores: Mapping[str, Sequence[Any]]) -> list[float | None]:
    """Per item, the mean score over the judges that gave one; None when all failed."""
    if len(scores) < 1:
        raise ValueError("mean_vote needs at least one judge")
    sizes = {name: len(values) for name, values in scores.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every judge must score the same items; item counts differ: {sizes}")
    result: list[float | None] = []
    for item in zip(*scores.values()):
        numbers = [x for x in (_as_float(v) for v in item) if x is not None]
        result.append(float(np.mean(numbers)) if numbers else None)
    return result


# ----------------------------------------------------------------------------------------------
# Plots (PNG). Figures are built without pyplot, so no global state and no display is needed.
# ----------------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    require("calibration", "plots")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=120)
    return fig


def plot_confusion(report: CalibrationReport, path: str | Path | None = None, *, title: str | None = None) -> Figure:
    """Heatmap of the confusion matrix (rows: human label, columns: judge label)."""
    matrix = np.array(report.confusion or [[0]], dtype=float)
    size = max(3.0, 1.0 + 0.7 * len(report.labels))
    fig = _figure(size + 1, size)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(report.labels)), report.labels, rotation=45, ha="right")
    ax.set_yticks(range(len(report.labels)), report.labels)
    ax.set_xlabel("judge")
    ax.set_ylabel("human")
    top = matrix.max() if matrix.size else 0
    for (r, c), value in np.ndenumerate(matrix):
        ax.text(c, r, f"{int(value)}", ha="center", va="center", color="white" if value > top / 2 else "black")
    accuracy = "n/a" if report.accuracy is None else f"{report.accuracy:.1%}"
    kappa = "n/a" if report.kappa is None else f"{report.kappa:.2f}"
    ax.set_title(title or f"accuracy {accuracy}, kappa {kappa}")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, path)


def plot_scores(human_scores: Sequence[Any], judge_scores: Sequence[Any], path: str | Path | None = None, *,
                title: str | None = None, seed: int = 0) -> Figure:
    """Judge score against human score, jittered so that equal pairs stay visible."""
    pairs = [(_as_float(a), _as_float(b)) for a, b in zip(human_scores, judge_scores)]
    xy = np.array([(a, b) for a, b in pairs if a is not None and b is not None], dtype=float).reshape(-1, 2)
    rng = np.random.default_rng(seed)
    fig = _figure(4.5, 4)
    ax = fig.add_subplot()
    if len(xy):
        span = np.ptp(xy, axis=0)
        jitter = rng.uniform(-0.04, 0.04, size=xy.shape) * np.where(span > 0, span, 1)
        ax.scatter(xy[:, 0] + jitter[:, 0], xy[:, 1] + jitter[:, 1], s=14, alpha=0.5)
    ax.set_xlabel("human score")
    ax.set_ylabel("judge score")
    ax.set_title(title or f"judge vs human ({len(xy)} items)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_position_bias(reports: Mapping[str, PairwiseReport], path: str | Path | None = None, *,
                       title: str = "position bias") -> Figure:
    """Per judge: how often the first-shown output wins (0.5 is unbiased) and the conflict rate."""
    names = list(reports)
    first = [reports[k].first_position_win_rate or 0.0 for k in names]
    conflict = [reports[k].conflict_rate or 0.0 for k in names]
    x = np.arange(len(names))
    fig = _figure(max(4.0, 1.4 * len(names) + 2), 3.6)
    ax = fig.add_subplot()
    ax.bar(x - 0.2, first, width=0.4, label="first-position win rate")
    ax.bar(x + 0.2, conflict, width=0.4, label="conflict rate (orders disagree)")
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_xlim(-0.8, len(names) - 0.2)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------
# Graded files: join human labels to judge verdicts
# ----------------------------------------------------------------------------------------------


class FileCalibration(BaseModel):
    """Calibration of one graded file: a classification report, plus both-order figures if pairwise."""

    kind: Literal["single", "pairwise"]
    human_column: str
    judge_column: str
    key: str | None = None
    rows: int
    labels_without_graded_row: int = 0
    classification: CalibrationReport
    pairwise: PairwiseReport | None = None
    human_scores: list[float | None] = Field(default_factory=list, exclude=True)
    judge_scores: list[float | None] = Field(default_factory=list, exclude=True)


# Names a column of human labels goes by, for the `human_column` hint.
_LABEL_NAMES = ("verdict", "human_label", "human", "gold", "gold_label", "annotation", "rating", "judgement", "judgment",
                "preference", "label", "winner", "answer")


def _columns_hint(row: Mapping[str, Any], field: str) -> str:
    """The row's columns and the argument (`human_column`, `judge_column`, `on`) that names another one, so one message
    is enough to fix the call; the command line says the argument as its flag (graders._flags)."""
    columns = [str(k) for k in row]
    hint = f"its columns are {', '.join(columns) or '(none)'}; name the column with `{field}` COLUMN"
    if field == "human_column":
        guess = next((c for c in _LABEL_NAMES if c in columns), None)
        if guess is not None:
            hint += f" (e.g. `human_column` {guess})"
    return hint


def calibrate_rows(
    graded: Sequence[Mapping[str, Any]],
    label_rows: Sequence[Mapping[str, Any]] | None = None,
    *,
    on: str | None = None,
    human_column: str = "label",
    judge_column: str | None = None,
    source: str = "graded file",
    labels_source: str = "labels file",
    labels: Sequence[Any] | None = None,
    ordinal: bool = False,
    group_column: str | None = None,
    convention: PairConvention = "llmbar",
    bootstrap: int = 1000,
    seed: int = 0,
) -> FileCalibration:
    """Calibrate the rows of a graded file against human labels from a column or a second file.

    A graded file from a pairwise rubric (it has ``winner_ab``) also gets a :class:`PairwiseReport`.
    Human labels come from ``human_column`` of ``label_rows`` joined on column ``on``, or, without
    ``label_rows``, from that column of the graded rows themselves.
    """
    pairwise = bool(graded) and "winner_ab" in graded[0]
    judge_column = judge_column or ("winner" if pairwise else "label")
    if label_rows is None and human_column == judge_column and graded and f"input_{human_column}" in graded[0]:
        human_column = f"input_{human_column}"  # grade_file kept the input's own column under this name
    if label_rows is None and human_column == judge_column:
        raise ValueError(f"{source}: column {judge_column!r} holds the judge's verdict; give human labels with "
                         f"`label_rows` FILE `on` KEY; for labels in this file: {_columns_hint(graded[0] if graded else {}, 'human_column')}")
    for number, row in enumerate(graded, start=1):
        if judge_column not in row:
            raise ValueError(f"{source} row {number}: no column {judge_column!r} with the judge's verdict; "
                             f"{_columns_hint(row, 'judge_column')}")
    if label_rows is not None:
        if not on:
            raise ValueError("human labels from a separate file need `on` KEY, the column both files share")
        human_by_key: dict[str, Any] = {}
        for number, row in enumerate(label_rows, start=1):
            if on not in row or human_column not in row:
                missing = on if on not in row else human_column
                field = "on" if missing == on else "human_column"
                raise ValueError(f"{labels_source} row {number}: field {missing!r} is missing; {_columns_hint(row, field)}")
            key = as_label(row[on])
            if key is None:
                raise ValueError(f"{labels_source} row {number}: field {on!r} is empty")
            if key in human_by_key:
                raise ValueError(f"{labels_source} row {number}: key {on}={key!r} appears twice")
            human_by_key[key] = row[human_column]
        keys = []
        for number, row in enumerate(graded, start=1):
            if on not in row:
                raise ValueError(f"{source} row {number}: field {on!r} is missing; {_columns_hint(row, 'on')}")
            keys.append(as_label(row[on]))
        human = [human_by_key.get(k) if k is not None else None for k in keys]
        orphans = len(set(human_by_key) - {k for k in keys if k is not None})
    else:
        for number, row in enumerate(graded, start=1):
            if human_column not in row:
                raise ValueError(f"{source} row {number}: no column {human_column!r} with the human label; "
                                 f"{_columns_hint(row, 'human_column')}")
        human = [row[human_column] for row in graded]
        keys = [as_label(row.get(on)) for row in graded] if on else [str(i + 1) for i in range(len(graded))]
        orphans = 0

    judge = [row.get(judge_column) if (row.get("status") in (None, "", "ok")) else None for row in graded]
    kinds = [row.get("error_kind") or None for row in graded]
    judge_scores = [_as_float(row.get("score")) if j is not None else None for row, j in zip(graded, judge)]
    # Human labels as numbers for the correlations: numbers already, or the judge's own
    # label -> score map read off the graded rows (e.g. correct -> 1, incorrect -> 0).
    score_of: dict[str, float] = {}
    for j, s in zip(judge, judge_scores):
        if j is not None and s is not None and not pairwise:
            score_of.setdefault(str(as_label(j)), s)
    human_labels = [as_label(h) for h in human]
    if all(h is None or _as_float(h) is not None for h in human_labels) and not pairwise:
        human_scores = [_as_float(h) for h in human_labels]
    elif all(h is None or h in score_of for h in human_labels) and score_of:
        human_scores = [score_of[h] if h is not None else None for h in human_labels]
    else:
        human_scores = []
    groups = [row.get(group_column) for row in graded] if group_column else None
    classification = calibrate(
        human, judge, labels=labels, ordinal=ordinal, error_kinds=kinds, ids=keys,
        human_scores=human_scores or None, judge_scores=judge_scores if human_scores else None,
        groups=groups, bootstrap=bootstrap, seed=seed,
    )
    result = FileCalibration(kind="pairwise" if pairwise else "single", human_column=human_column,
                             judge_column=judge_column, key=on, rows=len(graded), labels_without_graded_row=orphans,
                             classification=classification, human_scores=human_scores, judge_scores=judge_scores)
    # A --no-swap file: no row holds a swapped order's winner and its verdicts were decided by the one order.
    one_order = pairwise and not any(as_label(r.get("winner_ba")) is not None for r in graded) and any(
        r.get("decided_by") == "single" for r in graded)
    if one_order:
        labelled = [i for i, h in enumerate(human_labels) if h is not None]
        result.pairwise = one_order_report([graded[i].get("winner_ab") for i in labelled], [human_labels[i] for i in labelled],
                                           convention=convention, bootstrap=bootstrap, seed=seed)
    elif pairwise:
        labelled = [i for i, h in enumerate(human_labels) if h is not None]
        result.pairwise = pairwise_report([graded[i].get("winner_ab") for i in labelled],
                                          [graded[i].get("winner_ba") for i in labelled],
                                          [human_labels[i] for i in labelled], convention=convention,
                                          bootstrap=bootstrap, seed=seed)
    return result
