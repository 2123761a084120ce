"""Checklist rubrics: one request asks for one verdict per criterion; the reply is read strictly.

The one reader of replies (:func:`judge._parse.read_completion`) reads a checklist as one more
output mode: :func:`parse_checklist` instead of a single label. Its rules:

- exactly one verdict per criterion. A criterion the reply leaves out, names twice (in one
  object or across objects: a quoted one is indistinguishable from the judge's), or answers with
  something that is not one of its labels is an error *for that criterion*;
- a ``required`` criterion in error makes the row an error (a parse failure, re-asked as any);
- otherwise the row's score is the weighted mean of the criteria that were read, and the verdict
  lists every criterion's verdict (``Verdict.criteria``): a missing criterion is never a made-up 0;
- a reply in which no criterion can be read is a parse failure.

Per-row criteria (a variable of type ``criteria``) are bound to the row first (:func:`bind_row`):
the bound rubric renders, asks (its JSON schema has one property per criterion id) and reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._criteria import (DEFAULT_CRITERION_LABELS, RATIONALE_KEY, VERDICT_KEY, Criterion, CriterionVerdict, checklist_schema,
                        criteria_from_cell, row_score)
from ._normalize import normalize_label

if TYPE_CHECKING:
    from ._parse import Parsed
    from ._rubric import AskMode, Rubric

CHECKLIST_FIELD = "criteria"  # the OutputSpec field a checklist rubric carries (never read as one label)
_WRAPPERS = ("criteria", "verdicts", "checklist", "results")  # {"criteria": {...}} around the verdicts: read inside
_VERDICT_KEYS = (VERDICT_KEY, "label", "answer")


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


def criteria_of(rubric: Rubric, values: Mapping[str, Any] | None = None) -> list[Criterion]:
    """The criteria a checklist rubric asks: its spec's, or the (prepared) row's."""
    if rubric.criteria is not None:
        return list(rubric.criteria)
    var = rubric.criteria_variable
    if var is None or values is None or not isinstance(values.get(var), list):
        return []
    return list(values[var])


def checklist_context(rubric: Rubric, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a checklist template iterates (``{% for c in checklist %}``): each criterion's id,
    statement, offered labels (a list), weight and whether it is required."""
    return [{"id": c.id, "statement": c.statement, "labels": list(c.offered(rubric.labels)), "weight": c.weight,
             "required": c.required} for c in criteria_of(rubric, values)]


def bind_row(rubric: Rubric, row: Mapping[str, Any]) -> Rubric:
    """The rubric one row is asked with: a per-row checklist gets that row's criteria (and their
    JSON schema); every other rubric is returned as it is. A cell that holds no usable criteria is
    left to the rubric's own ``prepare`` to report as the row's input error."""
    var = rubric.criteria_variable
    if var is None or rubric.criteria is not None:
        return rubric
    try:
        criteria = criteria_from_cell(row.get(var))
    except ValueError:
        return rubric
    schema = checklist_schema(criteria, rubric.labels)
    bound = rubric.model_copy(update={"criteria": criteria, "output": rubric.output.model_copy(update={"json_schema": schema})})
    bound._unbound = rubric
    return bound


def unbound(rubric: Rubric) -> Rubric:
    """The rubric a bound per-row checklist came from (itself for every other rubric)."""
    return rubric._unbound or rubric


# ---- reading a reply --------------------------------------------------------------------------


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
    from ._parse import ParseFailure

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
            raise ParseFailure("the reply is not a JSON object of criterion verdicts")
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
        raise ParseFailure("the reply holds no JSON object naming a criterion")
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


def _verdict(c: Criterion, offered: dict[str, float], **fields: Any) -> CriterionVerdict:
    return CriterionVerdict(id=c.id, weight=c.weight, required=c.required, **fields)


def _read_json(criteria: list[Criterion], rubric: Rubric, text: str) -> list[CriterionVerdict]:
    ids = {c.id for c in criteria}
    entries = _json_entries(text, ids)
    by_id: dict[str, list[Any]] = {}
    for key, value in entries:
        by_id.setdefault(key, []).append(value)
    unknown = [k for k in by_id if k not in ids and k not in _WRAPPERS]
    note = f" (the reply names criteria not asked: {', '.join(map(repr, unknown[:5]))})" if unknown else ""
    out = []
    for c in criteria:
        offered = c.offered(rubric.labels)
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


def _read_tags(criteria: list[Criterion], rubric: Rubric, text: str) -> list[CriterionVerdict]:
    from ._parse import AmbiguousVerdict, _drop_menus, _one_verdict, _tags

    out = []
    for c in criteria:
        offered = c.offered(rubric.labels)
        shim = rubric.model_copy(update={"labels": offered})  # the label guards read rubric.labels
        found = _drop_menus(shim, _tags(text, c.id), text)
        if not found:
            out.append(_verdict(c, offered, status="error", error=f"missing: the reply has no <{c.id}>…</{c.id}>"))
            continue
        try:
            answer = _one_verdict(shim, [a for _, _, a in found], f"in <{c.id}> tags")
        except AmbiguousVerdict as e:
            out.append(_verdict(c, offered, status="error", error=f"duplicate: {e}"))
            continue
        matched = _match(offered, answer)
        if matched is None:
            out.append(_verdict(c, offered, status="error",
                                error=f"unparseable: {answer.strip()[:60]!r} is not one of its labels ({', '.join(map(repr, offered))})"))
            continue
        out.append(_verdict(c, offered, status="ok", label=matched[0], score=matched[1]))
    return out


def parse_checklist(rubric: Rubric, content: str | None, mode: AskMode, tool_arguments: str | None = None) -> Parsed:
    """A checklist reply -> a Parsed whose ``criteria`` hold one verdict per criterion, or ParseFailure.

    The row fails (ParseFailure) when the reply is empty or holds nothing readable, when no
    criterion was read, or when a required criterion is in error; otherwise its score is the
    weighted mean over the criteria read.
    """
    from ._parse import ParseFailure, Parsed

    criteria = criteria_of(rubric)
    if not criteria:
        raise ParseFailure("the checklist has no criteria for this row")
    source = tool_arguments if mode == "tool" else content
    if not source or not source.strip():
        raise ParseFailure("empty reply")
    if mode in ("json_schema", "json_object", "tool"):
        verdicts = _read_json(criteria, rubric, source)
    else:
        verdicts = _read_tags(criteria, rubric, source)
    failed_required = [v for v in verdicts if v.required and v.status != "ok"]
    if failed_required:
        raise ParseFailure("; ".join(f"required criterion {v.id!r}: {v.error}" for v in failed_required))
    score = row_score(verdicts)
    if score is None:
        raise ParseFailure("no criterion could be read: " + "; ".join(f"{v.id}: {v.error}" for v in verdicts[:5]))
    return Parsed(label=None, score=score, rationale=None, criteria=tuple(verdicts))
