"""Options and helpers the commands share."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import typer

from .._flags import in_flags

JSON_VERSION = 1

# The judge options (model, endpoint, parameters, pacing, cache, budget) live in _judge_options.py.


def fail(message: str, code: int = 2) -> typer.Exit:
    from gradekit.judge._redact import redact

    typer.echo(f"error: {redact(in_flags(message))}", err=True)  # an error may quote a URL with credentials or an echoed key
    return typer.Exit(code)


def print_or_write(text: str, out: Path | None, what: str = "") -> None:
    """``text`` on stdout, or into the file ``out`` with a line on stderr saying so (``what`` after its name)."""
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise fail(f"{out}: {e.strerror or e}") from e
    typer.echo(f"wrote {out}{what}", err=True)


def print_json(payload: dict[str, Any]) -> None:
    from gradekit.judge._redact import redact

    typer.echo(redact(json.dumps({"version": JSON_VERSION, **payload}, ensure_ascii=False, indent=2)))


class _Echo(logging.Handler):
    """Library warnings (a checkpoint started over, a corrupt cache moved aside) as plain lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        from gradekit.judge._redact import redact

        typer.echo(redact(self.format(record)), err=True)  # sys.stderr as it is now: the CLI runner's, in tests


def warnings_to_stderr() -> None:
    """Show a file run's warnings (``gradekit.runs``, ``gradekit.cache``) to the user, once, whatever logging is set up,
    and the certificate of an aligned rubric when one is loaded."""
    for name in ("gradekit.runs", "gradekit.cache", "gradekit.judge"):
        _echo(name, logging.WARNING)
    certificates_to_stderr()


def certificates_to_stderr() -> None:
    """Print an aligned rubric's certificate when it is loaded (``gradekit.certificate``, INFO): `grade` and `serve` do."""
    _echo("gradekit.certificate", logging.INFO)


def _echo(name: str, level: int) -> None:
    logger = logging.getLogger(name)
    if level < logging.WARNING:
        logger.setLevel(level)
    if not any(isinstance(h, _Echo) for h in logger.handlers):
        logger.addHandler(_Echo(level))
        logger.propagate = False  # not twice when the host logs to stderr too
