"""`gradekit schema`: the JSON schema of a grader file, for editors to complete and check grader files with."""

from __future__ import annotations

from pathlib import Path

import typer

from ._common import print_or_write


def schema(output: Path | None = typer.Option(None, "-o", "--output", help="Write the schema to this file instead of stdout.",
                                       dir_okay=False)) -> None:
    """Print the JSON schema of grader files (YAML or JSON): point an editor at it (docs/graders.md)."""
    # The shipped file, read as text: printing it builds no model and imports no grader.
    from importlib.resources import files

    text = (files("gradekit.graders") / "grader.schema.json").read_text(encoding="utf-8")
    print_or_write(text, output)
