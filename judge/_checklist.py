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
- a reply in which no criterion can be read is a parse failure.

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


def unbound(rubric: Rubric) -> Rubric:
    """The rubric a bound per-row checklist came from (itself for every other rubric)."""
    return rubric._unbound or rubric
