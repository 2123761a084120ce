"""Checklist calibration: a checklist judge's verdicts against per-criterion human labels.

Agreement is reported per criterion id (accuracy, kappa, failures: the usual
:func:`~graders.calibration._agreement.calibrate` report for that criterion's items), pooled over
every criterion, and for the whole row: how often every human-labelled criterion of a row agrees,
and how the judge's row score (the weighted mean of the criteria it read) tracks the human row
score computed the same way from the human labels. A criterion the judge could not read is a
judge failure of that item, never a disagreement scored as 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from gradekit.judge._criteria import DEFAULT_CRITERION_LABELS

from .._checklist import row_criteria
from ._agreement import CalibrationReport, CorrelationReport, as_label, calibrate, correlations


class RowAgreement(BaseModel):
    """The whole row: every labelled criterion agreeing, and the row score against the human one."""

    n: int  # rows with at least one human criterion label and a judged checklist
    all_agree: float | None  # share of those rows whose every human-labelled criterion the judge read and agreed with
    mean_abs_score_error: float | None  # |judge row score - human row score| over rows with both
    correlation: CorrelationReport | None = None
    judge_errors: int = 0  # labelled rows the judge gave no checklist (an error row)


class ChecklistCalibration(BaseModel):
    graded: str
    labels_column: str
    criteria: dict[str, CalibrationReport] = Field(default_factory=dict)  # by criterion id, in first-seen order
    pooled: CalibrationReport | None = None  # every (row, criterion) item
    row: RowAgreement
    unknown_criteria: int = 0  # human labels naming a criterion the row's checklist lacks


def _labels_of(row: Mapping[str, Any], column: str) -> dict[str, str] | None:
    value = row.get(column)
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, Mapping):
        return None
    out = {str(k): label for k, v in value.items() if (label := as_label(v)) is not None}
    return out or None


def _label_scores(row: Mapping[str, Any], rubric_labels: Mapping[str, Mapping[str, float]] | None,
                  default: Mapping[str, float]) -> dict[str, Mapping[str, float]]:
    """Criterion id -> its label scores: the rubric's, else the row's own criteria column's, else the default."""
    scores: dict[str, Mapping[str, float]] = dict(rubric_labels or {})
    given = row.get("criteria")
    if isinstance(given, str) and given.strip().startswith("["):
        try:
            given = json.loads(given)
        except json.JSONDecodeError:
            given = None
    if isinstance(given, list):
        for item in given:
            if isinstance(item, Mapping) and isinstance(item.get("id"), str) and isinstance(item.get("labels"), Mapping):
                scores.setdefault(item["id"], item["labels"])
    return scores


def _weighted(pairs: Sequence[tuple[float, float]]) -> float | None:
    total = sum(w for _, w in pairs)
    return sum(s * w for s, w in pairs) / total if pairs and total > 0 else None


def calibrate_checklist(rows: Sequence[Mapping[str, Any]], labels_column: str, *, source: str = "", bootstrap: int = 1000,
                        rubric_labels: Mapping[str, Mapping[str, float]] | None = None,
                        default_labels: Mapping[str, float] = DEFAULT_CRITERION_LABELS) -> ChecklistCalibration:
    """Per-criterion, pooled and whole-row agreement of a graded checklist file with human labels.

    Args:
        rows: the graded rows (a ``checklist`` column from ``gradekit grade``), each with ``labels_column``
            holding ``{criterion id: human label}`` (a mapping or its JSON text).
        rubric_labels: criterion id -> label scores (a rubric's fixed criteria) for the human row score;
            otherwise a row's ``criteria`` column's labels, else ``default_labels``.

    Raises:
        ValueError: no row has both a checklist and human criterion labels (the message says which is lacking).
    """
    items: dict[str, dict[str, list[Any]]] = {}
    pooled: dict[str, list[Any]] = {"human": [], "judge": [], "kinds": [], "ids": []}
    row_n = agree_rows = judge_errors = unknown = 0
    errors: list[float] = []
    human_scores: list[float | None] = []
    judge_scores: list[float | None] = []
    with_labels = with_checklist = 0
    for number, row in enumerate(rows):
        human = _labels_of(row, labels_column)
        checklist = row_criteria(row)
        with_labels += human is not None
        with_checklist += checklist is not None
        if human is None:
            continue
        if checklist is None:
            judge_errors += 1
            continue
        key = row.get("id", number)
        judged = {c["id"]: c for c in checklist}
        scores = _label_scores(row, rubric_labels, default_labels)
        all_agree = True
        human_pairs: list[tuple[float, float]] = []
        for cid, label in human.items():
            c = judged.get(cid)
            if c is None:
                unknown += 1
                continue
            judge_label = c.get("label") if c.get("status") == "ok" else None
            table = items.setdefault(cid, {"human": [], "judge": [], "kinds": [], "ids": []})
            for target in (table, pooled):
                target["human"].append(label)
                target["judge"].append(judge_label)
                target["kinds"].append(None if judge_label is not None else "parse_failure")
                target["ids"].append(f"{key}:{cid}")
            all_agree = all_agree and judge_label is not None and str(judge_label) == label
            offered = scores.get(cid, default_labels)
            if label in offered:
                human_pairs.append((float(offered[label]), float(c.get("weight", 1.0))))
        row_n += 1
        agree_rows += all_agree
        human_score = _weighted(human_pairs)
        judge_score = row.get("score")
        judge_score = float(judge_score) if isinstance(judge_score, (int, float)) or (isinstance(judge_score, str) and judge_score) else None
        human_scores.append(human_score)
        judge_scores.append(judge_score)
        if human_score is not None and judge_score is not None:
            errors.append(abs(human_score - judge_score))
    if not pooled["human"]:
        lacking = (f"no row has a {labels_column!r} column of {{criterion id: label}}" if not with_labels
                   else "no labelled row has a judge checklist (a 'checklist' column from gradekit grade with a checklist rubric)")
        raise ValueError(f"{source}: {lacking}")

    def report(table: Mapping[str, list[Any]]) -> CalibrationReport:
        return calibrate(table["human"], table["judge"], error_kinds=table["kinds"], ids=table["ids"], bootstrap=bootstrap)

    pairs = [(h, j) for h, j in zip(human_scores, judge_scores) if h is not None and j is not None]
    correlation = correlations([h for h, _ in pairs], [j for _, j in pairs], bootstrap=bootstrap) if len(pairs) >= 3 else None
    return ChecklistCalibration(
        graded=source, labels_column=labels_column, criteria={cid: report(t) for cid, t in items.items()}, pooled=report(pooled),
        row=RowAgreement(n=row_n, all_agree=agree_rows / row_n if row_n else None,
                         mean_abs_score_error=sum(errors) / len(errors) if errors else None, correlation=correlation,
                         judge_errors=judge_errors),
        unknown_criteria=unknown)
