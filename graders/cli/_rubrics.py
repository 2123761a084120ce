"""`gradekit rubrics`: what rubrics ship, and what each needs."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from ._common import print_json


def rubrics(json_output: bool = typer.Option(False, "--json", help="Print JSON (with a version field).")) -> None:
    """List the shipped rubrics with their variables, output mode and labels."""
    # The specs as read, not validated Rubric models: pydantic's import alone would double this command's time.
    from gradekit.judge._specs import rubric_summaries

    found = rubric_summaries()
    if json_output:
        print_json({
            "rubrics": [
                {
                    "name": r.name,
                    "description": r.description,
                    "language": r.language,
                    "variables": r.variables,
                    "output_mode": r.output_mode,
                    "labels": r.labels,
                    "unmatched": r.unmatched,
                }
                for r in found
            ]
        })
        return
    table = Table()
    table.add_column("rubric", no_wrap=True)
    for heading in ("variables", "output", "labels -> score"):
        table.add_column(heading)
    for r in found:
        labels = ", ".join(f"{k} {v:+g}" for k, v in r.labels.items())
        if r.unmatched != "error":
            labels += f", other {float(r.unmatched):+g}"
        variables = ", ".join(f"{k}{'[]' if kind == 'list' else ''}" for k, kind in r.variables.items())
        table.add_row(r.name, variables, r.output_mode, labels)
    Console().print(table)
