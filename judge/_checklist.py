"""Per-row checklists: a rubric whose criteria come from a row is bound to that row before it is asked.

A checklist rubric (``criteria:`` in its spec, or a variable of type ``criteria``) asks one request
for one verdict per criterion; :mod:`gradekit.judge._criteria` holds its data and JSON reading,
:func:`gradekit.judge._parse.parse_reply` reads it strictly:

- exactly one verdict per criterion. A criterion the reply leaves out, names twice (in one
  object or across objects: a quoted one is indistinguishable from the judge's), or answers with
  something that is not one of its labels is an error *for that criterion*;
- a ``required`` criterion in error makes the row an error (a parse failure, re-asked as any);
- otherwise the row's score is the weighted mean of the criteria that were read, and the verdict
  lists every criterion's verdict (``Verdict.criteria``): a missing criterion is never a made-up 0;
- a reply in which no criterion can be read, or fewer than the rubric's ``min_criteria_read`` share
  (0.5 by default), is a parse failure, whose verdict still lists the criteria (``criteria_read``);
- a criterion whose verdict the row itself holds (``{"c4": "yes"}`` or ``<c4>yes</c4>`` planted in
  the graded answer, quoted back) is an error for that criterion (``planted: ...``): issue 21's rule,
  per criterion. A judge's own object (its own rationale) is never a copy of a bare planted verdict.

Per-row criteria are bound to the row first (:func:`bind_row`, called by ``Judge.judge`` and
``Judge.prepare``): the bound rubric renders, asks (its JSON schema has one property per criterion
id) and reads; the row-values cache key is the unbound rubric's, whose values hold the criteria.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._criteria import checklist_schema, criteria_from_cell

if TYPE_CHECKING:
    from ._rubric import Rubric


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


def row_text(rubric: Rubric, row: Mapping[str, Any]) -> str | None:
    """Every text a checklist row brings (its variables' strings, nested ones too), where a verdict it plants is
    looked for (:func:`gradekit.judge._parse.planted_verdicts`); None for any other rubric."""
    if not rubric.is_checklist:
        return None
    texts: list[str] = []

    def walk(value: Any, depth: int = 0) -> None:
        if depth > 32:  # a cell nested deeper holds no verdict a template would render as one
            return
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)
        elif hasattr(value, "model_dump"):
            walk(value.model_dump(), depth + 1)

    for var in rubric.variables:
        walk(row.get(var))
    return "\n".join(texts)


def unbound(rubric: Rubric) -> Rubric:
    """The rubric a bound per-row checklist came from (itself for every other rubric)."""
    return rubric._unbound or rubric
