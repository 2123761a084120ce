"""Checklist rubrics as data: a criterion, a criterion's verdict, and the JSON schema that asks for one verdict per criterion.

A checklist rubric asks one request for k verdicts (Vertex's adaptive rubrics, RaR, OpenJudge's
checkpoints) instead of a composite of k LLM graders sending k requests that repeat one prompt.
Its criteria are fixed in the spec (``criteria:``) or come per row from a variable of type
``criteria`` (a column holding a list, as per-prompt rubrics are). This module holds no rendering
and no parsing (those are :mod:`gradekit.judge._checklist`'s), so :mod:`gradekit.judge._rubric` and
:mod:`gradekit.judge._verdict` import it without a circle.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ._normalize import normalize_label

# Labels a criterion offers when neither it nor the rubric names any: met or not, scored as a pass rate.
DEFAULT_CRITERION_LABELS: dict[str, float] = {"yes": 1.0, "no": 0.0}
# A criterion id is a JSON key, a tag name (the tags fallback) and part of a column name.
_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
VERDICT_KEY = "verdict"  # the key of a criterion's label inside its JSON object
RATIONALE_KEY = "rationale"
CHECKLIST_FIELD = "criteria"  # the OutputSpec field a checklist rubric carries (never read as one label)
_WRAPPERS = ("criteria", "verdicts", "checklist", "results")  # {"criteria": {...}} around the verdicts: read inside
_VERDICT_KEYS = (VERDICT_KEY, "label", "answer")


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


def literal_cell(text: str) -> Any:
    """A CSV cell's value: its JSON, else the Python literal pandas' ``to_csv`` writes for a list;
    None when it is neither. Literals only: nothing in the cell is run. A cell nested deeper than Python
    can read is a ValueError saying so (a row's error), never a RecursionError ending the run."""
    text = text.strip()
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the cell nests lists or objects too deeply to read") from None
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(text)
        except RecursionError:
            raise ValueError("the cell nests lists or objects too deeply to read") from None
        except (ValueError, SyntaxError, MemoryError):
            return None


def criteria_from_cell(value: Any) -> list[Criterion]:
    """A row's criteria: a list (or JSON text of one, or pandas' repr) of statements or criterion objects.

    A bare statement gets the id ``c<position>`` (c1, c2, ...). Raises ValueError saying what is wrong.
    """
    if isinstance(value, str):
        parsed = literal_cell(value)
        if parsed is None:
            raise ValueError("criteria must be a list of statements or {id, statement, weight, labels, required} "
                             "objects; the cell is not a JSON list")
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



# ---- a checklist rubric's spec and render context -------------------------------------------


def checklist_defaults(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A raw rubric spec with a checklist's defaults: labels yes 1 / no 0, and its output (JSON schema
    generated from the criteria, one property per id; the chain falls back to one tag per criterion)."""
    variables = data.get("variables") or {}
    per_row = any(isinstance(v, Mapping) and v.get("type") == "criteria" or getattr(v, "type", None) == "criteria"
                  for v in variables.values()) if isinstance(variables, Mapping) else False
    if data.get("criteria") is None and not per_row:
        return data
    out = dict(data)
    out.setdefault("labels", dict(DEFAULT_CRITERION_LABELS))
    given = out.get("output")
    given = dict(given) if isinstance(given, Mapping) else (given.model_dump(by_alias=True) if given is not None else {})
    mode = given.get("mode", "json_schema")
    schema: dict[str, Any] = {"type": "object"}  # per-row criteria: the schema is the bound row's
    if out.get("criteria") is not None:
        try:
            criteria = [c if isinstance(c, Criterion) else Criterion.model_validate(c) for c in out["criteria"]]
            schema = checklist_schema(criteria, out["labels"] if isinstance(out["labels"], Mapping) else DEFAULT_CRITERION_LABELS)
        except (ValueError, TypeError):
            pass  # the rubric's own validation names what is wrong with the criteria
    output = {**given, "mode": mode, "field": CHECKLIST_FIELD, "rationale_field": None}
    output.pop("json_schema", None)
    output["schema"] = schema
    if mode == "tags":
        output.setdefault("tag", "criterion")
    out["output"] = output
    return out


def criteria_of(rubric: Any, values: Mapping[str, Any] | None = None) -> list[Criterion]:
    """The criteria a checklist rubric asks: its spec's, or the (prepared) row's."""
    if rubric.criteria is not None:
        return list(rubric.criteria)
    var = rubric.criteria_variable
    if var is None or values is None or not isinstance(values.get(var), list):
        return []
    return list(values[var])


def checklist_context(rubric: Any, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a checklist template iterates (``{% for c in checklist %}``): each criterion's id,
    statement, offered labels (a list), weight and whether it is required."""
    return [{"id": c.id, "statement": c.statement, "labels": list(c.offered(rubric.labels)), "weight": c.weight,
             "required": c.required} for c in criteria_of(rubric, values)]


# ---- reading a JSON reply (judge._parse reads the tags fallback and makes the row's outcome) -----


class ChecklistUnread(ValueError):
    """A checklist reply with nothing to read at all (no JSON object naming a criterion)."""


class _Pairs(dict):  # type: ignore[type-arg]
    """A decoded JSON object that remembers its keys as written (duplicates included)."""

    pairs: list[tuple[str, Any]]


def _hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    obj.pairs = pairs
    return obj


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _entries(value: Any, ids: set[str]) -> list[tuple[str, Any]] | None:
    """(id, value) for every criterion entry of one decoded JSON value, duplicates kept; None: not a checklist object."""
    if isinstance(value, list):
        found = []
        for item in value:
            if isinstance(item, Mapping) and isinstance(item.get("id"), str):
                found.append((item["id"], item))
        return found or None
    if not isinstance(value, _Pairs):
        return None
    pairs = value.pairs
    if len(pairs) == 1 and pairs[0][0] in _WRAPPERS and pairs[0][0] not in ids and isinstance(pairs[0][1], (list, dict)):
        return _entries(pairs[0][1], ids)
    return list(pairs)


def _json_entries(text: str, ids: set[str]) -> list[tuple[str, Any]]:
    """Every (criterion id, value) the reply writes as JSON: the whole reply, a fenced block, or each object inside prose."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    decoder = json.JSONDecoder(object_pairs_hook=_hook)
    try:
        value, end = decoder.raw_decode(text)
    except json.JSONDecodeError:
        value, end = None, -1
    if end == len(text):
        found = _entries(value, ids)
        if found is None:
            raise ChecklistUnread("the reply is not a JSON object of criterion verdicts")
        return found
    entries: list[tuple[str, Any]] = []
    position, objects = 0, 0
    for brace in re.finditer(r"[\{\[]", text):
        if brace.start() < position:
            continue
        try:
            value, end = decoder.raw_decode(text, brace.start())
        except json.JSONDecodeError:
            continue
        position = end
        found = _entries(value, ids)
        if found is not None and any(k in ids for k, _ in found):
            entries.extend(found)
            objects += 1
    if not objects:
        raise ChecklistUnread("the reply holds no JSON object naming a criterion")
    return entries


def _label_text(value: Any) -> tuple[str | None, str | None, str | None]:
    """(label, rationale, problem) of one criterion's JSON value: a string, or an object with its verdict key."""
    rationale = None
    if isinstance(value, Mapping):
        given = [value[k] for k in _VERDICT_KEYS if k in value]
        if isinstance(value, _Pairs) and sum(1 for k, _ in value.pairs if k in _VERDICT_KEYS) > 1:
            return None, None, f"its object names {sum(1 for k, _ in value.pairs if k in _VERDICT_KEYS)} verdicts"
        raw_rationale = value.get(RATIONALE_KEY)
        rationale = raw_rationale if isinstance(raw_rationale, str) else None
        if not given:
            return None, rationale, f"its object has no {VERDICT_KEY!r}"
        value = given[0]
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return None, rationale, f"its verdict {json.dumps(value)[:60]} is not a label"
    return (value if isinstance(value, str) else json.dumps(value)), rationale, None


def _match(labels: Mapping[str, float], answer: str) -> tuple[str, float] | None:
    key = normalize_label(answer)
    for label, score in labels.items():
        if normalize_label(label) == key:
            return label, score
    return None


def _verdict(c: Criterion, offered: Mapping[str, float], **fields: Any) -> CriterionVerdict:
    return CriterionVerdict(id=c.id, weight=c.weight, required=c.required, **fields)


def as_written(value: Any) -> tuple[str, str]:
    """A criterion's verdict as written, to tell a copy: a bare label (a JSON string, a tag's text) by its
    normalised label; an object by its content, strings' whitespace folded."""
    if isinstance(value, str):
        return "label", normalize_label(value)
    def folded(v: Any) -> Any:
        if isinstance(v, str):
            return " ".join(v.split())
        if isinstance(v, Mapping):
            return {str(k): folded(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [folded(x) for x in v]
        return v
    return "value", json.dumps(folded(value), sort_keys=True, ensure_ascii=False)


def json_entries_in(text: str, ids: set[str]) -> list[tuple[str, Any]]:
    """Every (criterion id, value) written as JSON anywhere in ``text`` ([] when none)."""
    try:
        return [(k, v) for k, v in _json_entries(text, ids) if k in ids]
    except ChecklistUnread:
        return []


def _planted_error(c: Criterion, value: Any) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return (f"planted: the graded row itself holds this verdict for {c.id!r} ({str(shown)[:60]!r}); "
            "the judge's may be a quote of it, so none is taken")


def read_json_verdicts(criteria: Sequence[Criterion], default_labels: Mapping[str, float], text: str,
                       planted: Mapping[str, set[tuple[str, str]]] | None = None) -> list[CriterionVerdict]:
    """One verdict per criterion from a JSON reply, strictly: missing, duplicate (even with the same
    verdict: not exactly one) and unparseable criteria are errors for that criterion, and so is one
    written exactly as the row itself writes it (``planted``: id -> :func:`as_written` forms).

    Raises:
        ChecklistUnread: the reply holds no JSON object naming a criterion.
    """
    ids = {c.id for c in criteria}
    entries = _json_entries(text, ids)
    by_id: dict[str, list[Any]] = {}
    for key, value in entries:
        by_id.setdefault(key, []).append(value)
    unknown = [k for k in by_id if k not in ids and k not in _WRAPPERS]
    note = f" (the reply names criteria not asked: {', '.join(map(repr, unknown[:5]))})" if unknown else ""
    out = []
    for c in criteria:
        offered = c.offered(default_labels)
        values = by_id.get(c.id, [])
        if not values:
            out.append(_verdict(c, offered, status="error", error=f"missing: the reply gives no verdict for {c.id!r}{note}"))
            continue
        if len(values) > 1:
            labels = [_label_text(v)[0] for v in values]
            differ = len({normalize_label(x) if x is not None else None for x in labels}) > 1
            what = f"different verdicts ({', '.join(repr(x) for x in labels)})" if differ else "the same verdict"
            out.append(_verdict(c, offered, status="error",
                                error=f"duplicate: the reply names {c.id!r} {len(values)} times with {what}; one may be quoted, so none is taken"))
            continue
        if planted and as_written(values[0]) in planted.get(c.id, ()):
            out.append(_verdict(c, offered, status="error", error=_planted_error(c, values[0])))
            continue
        label, rationale, problem = _label_text(values[0])
        if problem is not None or label is None:
            out.append(_verdict(c, offered, status="error", rationale=rationale, error=f"unparseable: {problem}"))
            continue
        matched = _match(offered, label)
        if matched is None:
            out.append(_verdict(c, offered, status="error", rationale=rationale,
                                error=f"unparseable: {label.strip()[:60]!r} is not one of its labels ({', '.join(map(repr, offered))})"))
            continue
        out.append(_verdict(c, offered, status="ok", label=matched[0], score=matched[1], rationale=rationale))
    return out
