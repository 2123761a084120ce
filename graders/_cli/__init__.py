"""The gradekit command line: one module per command, each a thin layer over library calls."""

from __future__ import annotations

import typer

from . import _grade, _render, _rubrics

app = typer.Typer(
    name="gradekit",
    help="LLM-as-judge graders that turn model outputs into rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("grade")(_grade.grade)
app.command("rubrics")(_rubrics.rubrics)
app.command("render")(_render.render)


def main() -> None:
    app()
