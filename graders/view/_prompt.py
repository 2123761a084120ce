"""The judge prompt of one graded row, rendered again from its rubric.

An output file does not store the prompt (it would double the file); the rubric and the row's
input columns decide it, so the viewer renders it on demand, for the one row being looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gradekit.judge import Rubric, RubricInputError


def _result_columns() -> set[str]:
    from ..runs._pairwise import PAIRWISE_COLUMNS
    from ..runs._file import RESULT_COLUMNS

    return set(RESULT_COLUMNS) | set(PAIRWISE_COLUMNS)


def input_values(row: Mapping[str, Any]) -> dict[str, Any]:
    """The input row back from an output row: result columns dropped, ``input_<name>`` renamed to ``<name>``."""
    results = _result_columns()
    values = {k: v for k, v in row.items() if k not in results and k != "index" and not k.startswith(("score_", "metric_"))}
    for name in list(values):
        if name.startswith("input_") and name[len("input_"):] in results:
            values[name[len("input_"):]] = values.pop(name)
    return values


def render_prompt(rubric: Rubric, row: Mapping[str, Any], mapping: Mapping[str, str] | None = None,
                  pairwise: bool = False) -> dict[str, Any]:
    """``{"rubric", "messages"}`` (and ``"messages_ba"`` for a pairwise row), or ``{"rubric", "error"}``."""
    values = input_values(row)
    variables = {var: values.get((mapping or {}).get(var, var)) for var in rubric.variables}
    try:
        out: dict[str, Any] = {"rubric": rubric.name, "messages": rubric.render(variables)}
        if pairwise:
            from .._pairwise import swapped

            out["messages_ba"] = rubric.render(swapped(rubric, variables))
        return out
    except (RubricInputError, ValueError) as e:
        return {"rubric": rubric.name, "error": str(e)}
