"""Options and helpers the commands share."""

from __future__ import annotations

import json
from typing import Any

import typer

JSON_VERSION = 1


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def print_json(payload: dict[str, Any]) -> None:
    typer.echo(json.dumps({"version": JSON_VERSION, **payload}, ensure_ascii=False, indent=2))
