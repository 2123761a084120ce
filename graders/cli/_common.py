"""Options and helpers the commands share."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import typer

JSON_VERSION = 1

# The judge options every command that talks to a judge takes: one declaration, so the flag, its
# environment variable and its help read the same in grade, meta-eval, probe and validate.
ApiKeyOption = Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY",
                                                 help="API key (read from OPENAI_API_KEY by default).", show_default=False)]
RpsOption = Annotated[float | None, typer.Option("--rps", envvar="GRADEKIT_RPS", help="Requests per second for the whole process.")]
TpmOption = Annotated[float | None, typer.Option("--tpm", envvar="GRADEKIT_TPM", help="Tokens per minute for the whole process.")]
ConcurrencyOption = Annotated[int, typer.Option("--concurrency", envvar="GRADEKIT_CONCURRENCY", help="Requests in flight at once.")]
TimeoutOption = Annotated[float, typer.Option("--timeout", envvar="GRADEKIT_TIMEOUT", help="Seconds per judge request.")]
NoCacheOption = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the response cache.")]


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def print_json(payload: dict[str, Any]) -> None:
    typer.echo(json.dumps({"version": JSON_VERSION, **payload}, ensure_ascii=False, indent=2))


class _Echo(logging.Handler):
    """Library warnings (a checkpoint started over, a corrupt cache moved aside) as plain lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.echo(self.format(record), err=True)  # sys.stderr as it is now: the CLI runner's, in tests


def warnings_to_stderr() -> None:
    """Show a file run's warnings (``gradekit.runs``, ``gradekit.cache``) to the user, once, whatever logging is set up."""
    for name in ("gradekit.runs", "gradekit.cache"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _Echo) for h in logger.handlers):
            logger.addHandler(_Echo(logging.WARNING))
            logger.propagate = False  # not twice when the host logs to stderr too
