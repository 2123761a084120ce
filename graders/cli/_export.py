"""`gradekit export`: a grader config as a platform's own grader (Vertex evaluate/spec, OpenAI JSON).

The export runs the platform's grader on the platform, without gradekit; the command refuses
(exit 2) and lists each part that has no form there rather than export something that scores
differently.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer

from ._common import fail


class Target(str, Enum):
    vertex_evaluate = "vertex-evaluate"
    vertex_spec = "vertex-spec"
    openai = "openai"


def export(
    grader: Path = typer.Argument(..., help="Grader config (YAML/JSON), or a Vertex reinforcementTuningSpec JSON.", show_default=False),
    to: Target = typer.Option(..., "--to", help="vertex-evaluate: a standalone evaluate(example, response) .py file; vertex-spec: "
                              "reinforcementTuningSpec JSON; openai: OpenAI RFT grader JSON."),
    out: Path = typer.Option(None, "-o", "--output", help="Write here instead of standard output."),
    rescale: bool = typer.Option(False, "--rescale", help="openai: map gradekit's [-1, 1] onto OpenAI's 0..1 as (score + 1) / 2."),
    on_invalid: float = typer.Option(None, "--on-invalid", help="vertex-evaluate, openai: the score for an example the grader "
                                     "cannot grade (default: raise, so the platform leaves it unscored)."),
    model: str = typer.Option(None, "--model", envvar="GRADEKIT_MODEL", help="openai: the score_model model [default: the config's judge.model]."),
) -> None:
    """Export GRADER to a platform's own grader format.

    Exit status: 0 when written, 2 when the config is wrong or the grader cannot be expressed
    on the target (the message lists why, part by part).
    """
    from .._config import GraderConfigError
    from ..platforms import ExportError, export_openai_grader, export_vertex_evaluate, export_vertex_spec

    try:
        if to is Target.vertex_evaluate:
            text = export_vertex_evaluate(grader, on_invalid=on_invalid)
        elif to is Target.vertex_spec:
            text = json.dumps(export_vertex_spec(grader), ensure_ascii=False, indent=2) + "\n"
        else:
            text = json.dumps(export_openai_grader(grader, rescale=rescale, model=model, on_invalid=on_invalid),
                              ensure_ascii=False, indent=2) + "\n"
    except (ExportError, GraderConfigError) as e:
        raise fail(str(e)) from e
    except ValueError as e:  # on_invalid out of range and the like
        raise fail(str(e)) from e
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise fail(f"{out}: {e.strerror or e}") from e
    typer.echo(f"wrote {out} ({to.value})", err=True)
