"""The gradekit command line: one module per command, each a thin layer over library calls."""

from __future__ import annotations

import typer

from . import _calibrate, _export, _grade, _llmbar, _render, _rubrics, _validate
from . import _report, _serve, _view

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
app.command("calibrate")(_calibrate.calibrate)
app.command("llmbar")(_llmbar.llmbar)
app.command("validate")(_validate.validate)
app.command("export")(_export.export)
app.command("serve")(_serve.serve)
app.command("view")(_view.view)
app.command("report")(_report.report)


def main() -> None:
    app()
