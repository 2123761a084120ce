"""`gradekit render`: the exact messages a row would send, to debug a rubric without a judge."""

from __future__ import annotations

import json

import typer

from ._common import fail


def render(
    rubric: str = typer.Option(..., "-r", "--rubric", help="Rubric name or path to a .yaml spec."),
    row: str = typer.Option(..., "--row", help='The row as JSON, e.g. \'{"question": "...", "prediction": "..."}\'.'),
    mode: str = typer.Option(None, "--mode", help="Ask mode: json_schema, tool, json_object, tags or text (default: the rubric's first)."),
    model: str = typer.Option("gpt-4o-mini", "--model", envvar="GRADEKIT_MODEL"),
) -> None:
    """Print the chat.completions request a row would produce."""
    from gradekit.judge import RubricError, RubricInputError, build_request, load_rubric

    try:
        spec = load_rubric(rubric)
        values = json.loads(row)
    except RubricError as e:
        raise fail(str(e)) from e
    except json.JSONDecodeError as e:
        raise fail(f"--row is not valid JSON: {e}") from e
    if not isinstance(values, dict):
        raise fail("--row must be a JSON object")
    from gradekit.judge._checklist import bind_row

    spec = bind_row(spec, values)  # a per-row checklist: the row's criteria, and their JSON schema
    ask = mode or spec.ask_modes[0]
    if ask not in spec.ask_modes:
        raise fail(f"rubric {spec.name!r} is asked in {', '.join(spec.ask_modes)}, not {ask!r}")
    try:
        messages = spec.render(values, ask)  # type: ignore[arg-type]
    except (RubricInputError, RubricError) as e:
        raise fail(f"--row: {e}") from e
    request = build_request(spec, messages, ask, model, {})  # type: ignore[arg-type]
    typer.echo(json.dumps(request, ensure_ascii=False, indent=2))
