"""Options and helpers the commands share."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import typer

JSON_VERSION = 1

# The judge options (model, endpoint, parameters, pacing, cache, budget) live in _judge_options.py.

# The one flag table: the judge spec field (judge._spec, judge.Budget) each judge flag sets. The judge core names
# fields in its messages (`base_url`), never flags; in_flags says them as the command line's flags.
FLAGS: dict[str, str] = {
    "model": "--model", "base_url": "--base-url", "api_key": "--api-key", "params": "--judge-param", "timeout": "--timeout",
    "limits.rps": "--rps", "limits.tpm": "--tpm", "limits.concurrency": "--concurrency", "limits.adapt": "--no-adapt",
    "limits.url": "--limiter", "limits.key": "--limiter-key", "max_cost_usd": "--max-cost", "max_tokens": "--max-tokens",
    "prices": "--prices",
}
_FIELD = re.compile(r"`([a-z_.]+)`")


def in_flags(message: str) -> str:
    """A judge core message with each `field` it names said as the flag that sets it."""
    return _FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(0)), message)


def fail(message: str, code: int = 2) -> typer.Exit:
    from judge._redact import redact

    typer.echo(f"error: {redact(in_flags(message))}", err=True)  # an error may quote a URL with credentials or an echoed key
    return typer.Exit(code)


def print_json(payload: dict[str, Any]) -> None:
    from judge._redact import redact

    typer.echo(redact(json.dumps({"version": JSON_VERSION, **payload}, ensure_ascii=False, indent=2)))


class _Echo(logging.Handler):
    """Library warnings (a checkpoint started over, a corrupt cache moved aside) as plain lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        from judge._redact import redact

        typer.echo(redact(self.format(record)), err=True)  # sys.stderr as it is now: the CLI runner's, in tests


def warnings_to_stderr() -> None:
    """Show a file run's warnings (``gradekit.runs``, ``gradekit.cache``) to the user, once, whatever logging is set up."""
    for name in ("gradekit.runs", "gradekit.cache", "gradekit.judge"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _Echo) for h in logger.handlers):
            logger.addHandler(_Echo(logging.WARNING))
            logger.propagate = False  # not twice when the host logs to stderr too
