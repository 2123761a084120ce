"""Checklist rubrics as data: a criterion, a criterion's verdict, and the JSON schema that asks for one verdict per criterion.

A checklist rubric asks one request for k verdicts (Vertex's adaptive rubrics, RaR, OpenJudge's
checkpoints) instead of a composite of k LLM graders sending k requests that repeat one prompt.
Its criteria are fixed in the spec (``criteria:``) or come per row from a variable of type
``criteria`` (a column holding a list, as per-prompt rubrics are). This module holds no rendering
and no parsing (those are :mod:`judge._checklist`'s), so :mod:`judge._rubric` and
:mod:`judge._verdict` import it without a circle.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

# Labels a criterion offers when neither it nor the rubric names any: met or not, scored as a pass rate.
DEFAULT_CRITERION_LABELS: dict[str, float] = {"yes": 1.0, "no": 0.0}
# A criterion id is a JSON key, a tag name (the tags fallback) and part of a column name.
_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
VERDICT_KEY = "verdict"  # the key of a criterion's label inside its JSON object
RATIONALE_KEY = "rationale"


class Criterion(BaseModel):
    """One item of a checklist: what is checked, how much it weighs, how its verdicts score."""

    model_config = ConfigDict(extra="forbid")

    id: str
    statement: str
    weight: float = 1.0
    labels: dict[str, float] | None = None  # None: the rubric's labels (default yes 1, no 0)
    required: bool = False  # in error, the whole row is an error instead of a score over the others

    @field_validator("id")
    @classmethod
    def _id_shape(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"criterion id {v!r} must start with a letter or _ and hold only letters, digits, _ and - (at most 64)")
        return v

    @field_validator("statement")
    @classmethod
    def _statement(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a criterion needs a statement")
        return v

    @field_validator("weight")
    @classmethod
    def _weight(cls, v: float) -> float:
        if not (v > 0 and v < float("inf")):
            raise ValueError(f"a criterion's weight must be a positive number, got {v}")
        return v

    @field_validator("labels")
    @classmethod
    def _scores(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("a criterion's labels must name at least one label")
        bad = {k: s for k, s in v.items() if not -1.0 <= s <= 1.0}
        if bad:
            raise ValueError(f"label scores must lie in [-1, 1]: {bad}")
        return v

    def offered(self, default: Mapping[str, float]) -> dict[str, float]:
        return dict(self.labels) if self.labels is not None else dict(default)


class CriterionVerdict(BaseModel):
    """One criterion's verdict in a checklist reply: a label and its score, or why it has none.

    ``status="error"`` has ``score is None`` as every failure does: a missing criterion is never a 0.
    """

    id: str
    status: Literal["ok", "error"]
    label: str | None = None
    score: float | None = None
    weight: float = 1.0
    required: bool = False
    rationale: str | None = None
    error: str | None = None  # missing, duplicate, unparseable, not an offered label


def check_criteria(criteria: Sequence[Criterion]) -> list[Criterion]:
    """Raise ValueError unless ``criteria`` are at least one, with distinct ids."""
    if not criteria:
        raise ValueError("a checklist needs at least one criterion")
    seen: set[str] = set()
    twice = [c.id for c in criteria if c.id in seen or seen.add(c.id)]  # type: ignore[func-returns-value]
    if twice:
        raise ValueError(f"criterion ids must be distinct; repeated: {', '.join(sorted(set(twice)))}")
    return list(criteria)


def criteria_from_cell(value: Any) -> list[Criterion]:
    """A row's criteria: a list (or JSON text of one, or pandas' repr) of statements or criterion objects.

    A bare statement gets the id ``c<position>`` (c1, c2, ...). Raises ValueError saying what is wrong.
    """
    if isinstance(value, str):
        text = value.strip()
        parsed: Any = None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            try:
                parsed = ast.literal_eval(text)  # literals only: nothing in the cell is run
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise ValueError("criteria must be a list of statements or {id, statement, weight, labels, required} "
                                 "objects; the cell is not a JSON list") from None
        value = parsed
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # numpy / pyarrow arrays from pandas
    if isinstance(value, Mapping):  # {id: statement} written as one object
        value = [{"id": k, "statement": v} if isinstance(v, str) else {"id": k, **dict(v)} for k, v in value.items()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"criteria must be a list, got {type(value).__name__}")
    out: list[Criterion] = []
    for number, item in enumerate(value, start=1):
        if isinstance(item, str):
            item = {"id": f"c{number}", "statement": item}
        elif hasattr(item, "items"):
            item = {k: v for k, v in dict(item).items() if v is not None}  # Parquet structs carry absent keys as None
            item.setdefault("id", f"c{number}")
        else:
            raise ValueError(f"criterion {number} must be a statement or an object, got {type(item).__name__}")
        try:
            out.append(Criterion.model_validate(item))
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"criterion {number}: {'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}") from None
    return check_criteria(out)


def checklist_schema(criteria: Sequence[Criterion], default_labels: Mapping[str, float]) -> dict[str, Any]:
    """The structured output of a checklist: one required property per criterion id, each an object
    with a short rationale and the verdict as an enum of that criterion's labels (strict-mode valid)."""
    properties = {
        c.id: {
            "type": "object",
            "properties": {RATIONALE_KEY: {"type": "string"}, VERDICT_KEY: {"type": "string", "enum": list(c.offered(default_labels))}},
            "required": [RATIONALE_KEY, VERDICT_KEY],
            "additionalProperties": False,
        }
        for c in criteria
    }
    return {"type": "object", "properties": properties, "required": [c.id for c in criteria], "additionalProperties": False}


def row_score(verdicts: Sequence[CriterionVerdict]) -> float | None:
    """The weighted mean score of the criteria that were read (None when none was)."""
    read = [v for v in verdicts if v.status == "ok" and v.score is not None]
    total = sum(v.weight for v in read)
    if not read or total <= 0:
        return None
    return sum(v.weight * float(v.score) for v in read) / total  # type: ignore[arg-type]


__all__ = ["Criterion", "CriterionVerdict", "DEFAULT_CRITERION_LABELS", "checklist_schema", "criteria_from_cell", "row_score",
           "check_criteria"]
