"""The gradekit command line: one module per command, each a thin layer over library calls.

Command modules import the library inside the command function, so ``gradekit --help`` and
``gradekit CMD --help`` load typer and rich only (tests/test_cli_startup.py checks the list).
"""

from __future__ import annotations

import typer

from . import _calibrate, _export, _grade, _llmbar, _meta_eval, _probe, _render, _report, _rubrics, _serve, _validate, _view

app = typer.Typer(
    name="gradekit",
    help="LLM-as-judge graders that turn model outputs into rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gradekit")
    except PackageNotFoundError:  # run from a source checkout that was never installed
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"gradekit {_version()}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print gradekit's version and exit.")) -> None:
    """LLM-as-judge graders that turn model outputs into rewards."""


app.command("grade")(_grade.grade)
app.command("rubrics")(_rubrics.rubrics)
app.command("render")(_render.render)
app.command("calibrate")(_calibrate.calibrate)
app.command("llmbar")(_llmbar.llmbar)
app.command("meta-eval")(_meta_eval.meta_eval)
app.command("probe")(_probe.probe)
app.command("validate")(_validate.validate)
app.command("export")(_export.export)
app.command("serve")(_serve.serve)
app.command("view")(_view.view)
app.command("report")(_report.report)


def main() -> None:
    app()
