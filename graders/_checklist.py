"""A checklist verdict's criteria as the front doors show them: grade parts, output columns, metrics.

One name per criterion everywhere: ``criteria.<id>`` is the part of a Grade (so ``serve`` returns
``part.criteria.<id>`` and the adapters their metrics), and ``criteria.<id>.label`` /
``criteria.<id>.score`` are the columns of a ``grade`` output. A criterion in error has no score
(None), never a 0; ``criteria_read`` of ``criteria_total`` says how many were read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gradekit.judge._criteria import CriterionVerdict

from ._sample import Grade

PART_PREFIX = "criteria."
# ``checklist``, not ``criteria``: a per-row checklist's input column is often named criteria, and keeps its name.
CHECKLIST_TYPES = {"criteria_read": "int64", "criteria_total": "int64", "checklist": "string"}


def criterion_columns(ids: Iterable[str]) -> dict[str, str]:
    """The flat columns of fixed criteria (name -> Arrow type alias), in the rubric's order."""
    out: dict[str, str] = {}
    for cid in ids:
        out[f"criteria.{cid}.label"] = "string"
        out[f"criteria.{cid}.score"] = "float64"
    return out


def checklist_cells(criteria: Sequence[CriterionVerdict] | None, *, total: int | None = None, flat: bool = True) -> dict[str, Any]:
    """A row's checklist cells: ``criteria_read``, ``criteria_total``, ``checklist`` (every criterion's
    verdict as one JSON list) and, with ``flat``, ``criteria.<id>.label`` / ``.score`` per criterion."""
    if criteria is None:
        return {"criteria_read": None, "criteria_total": total, "checklist": None}
    cells: dict[str, Any] = {
        "criteria_read": sum(c.status == "ok" for c in criteria),
        "criteria_total": len(criteria),
        "checklist": json.dumps([c.model_dump(exclude_none=True) for c in criteria], ensure_ascii=False),
    }
    if flat:
        for c in criteria:
            cells[f"criteria.{c.id}.label"] = c.label
            cells[f"criteria.{c.id}.score"] = c.score
    return cells


def criteria_parts(criteria: Sequence[CriterionVerdict], grader: str) -> dict[str, Grade]:
    """Each criterion as a part of the row's Grade: its score, or an error part saying why it has none."""
    parts: dict[str, Grade] = {}
    for c in criteria:
        if c.status == "ok" and c.score is not None:
            parts[f"{PART_PREFIX}{c.id}"] = Grade.scored(c.score, metrics={"weight": c.weight},
                                                         debug=[f"{grader}: {c.id}: {c.label!r}" + (f" ({c.rationale[:200]})" if c.rationale else "")])
        else:
            parts[f"{PART_PREFIX}{c.id}"] = Grade.failed("error", f"criterion {c.id!r}: {c.error}", error_kind="parse_failure",
                                                         metrics={"weight": c.weight})
    return parts


def criteria_metrics(criteria: Sequence[CriterionVerdict]) -> dict[str, float]:
    return {"criteria_read": float(sum(c.status == "ok" for c in criteria)), "criteria_total": float(len(criteria))}


def group_criteria_metrics(grades: Sequence[Grade]) -> dict[str, float]:
    """Per criterion, the mean score over the trajectories that read it (Ark's console aggregates each)."""
    sums: dict[str, list[float]] = {}
    for grade in grades:
        for name, part in grade.parts.items():
            if name.startswith(PART_PREFIX) and part.ok and part.score is not None:
                sums.setdefault(name, []).append(part.score)
    return {name: sum(v) / len(v) for name, v in sums.items()}


def row_criteria(row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The checklist of an output row (its ``checklist`` JSON cell), or None when the row has none."""
    value = row.get("checklist")
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, list) and all(isinstance(c, dict) and "id" in c and "status" in c for c in value):
        return value
    return None
