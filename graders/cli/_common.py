"""Options and helpers the commands share."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, TypeVar

import typer

from .._flags import in_flags

JSON_VERSION = 1
T = TypeVar("T")

# The judge options (model, endpoint, parameters, pacing, cache, budget) live in _judge_options.py; the options
# below are the ones several commands declare alike (each a fresh typer.Option: typer reads one per parameter).


def json_option(what: str) -> Any:
    """``--json``: print the command's ``what`` (report, summary, result, ...) as JSON, with ``JSON_VERSION``."""
    return typer.Option(False, "--json", help=f"Print the {what} as JSON (with a version field).")


def map_option(help: str = "VAR=COLUMN: read rubric variable VAR from COLUMN (repeatable).") -> Any:
    """``--map VAR=COLUMN`` (repeatable): where a rubric variable is read from."""
    return typer.Option([], "--map", help=help)


def human_column_option(help: str = "Column holding the human label (a label the rubric offers).") -> Any:
    """``--human-column`` (default ``label``): the column of labelled rows holding the human label."""
    return typer.Option("label", "--human-column", help=help)


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

        typer.echo(redact(in_flags(self.format(record))), err=True)  # sys.stderr as it is now: the CLI runner's, in tests


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


def run_judging(run: Callable[[], Coroutine[Any, Any, T]], cache: Any, *contexts: AbstractContextManager[Any],
                interrupted: str | Callable[[], None] | None, errors: tuple[type[Exception], ...] = (ValueError,),
                broken_exit: bool = False) -> T:
    """Run a command's judging to its end: inside ``contexts`` (the cassette, a progress bar), the cache closed
    whatever happens, each way out an exit status with a message instead of a traceback.

    ``errors`` become exit 2 with their message; with ``broken_exit`` a tripped breaker (the judge is broken, not
    the input) is exit 3, as `grade` stops; Ctrl-C is exit 130 after ``interrupted`` (a message, or a callable
    that prints one; None lets it through). Anything else goes up to the caller.
    """
    import asyncio

    from gradekit.judge._breaker import BreakerTripped

    try:
        with ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context)
            return asyncio.run(run())
    except Exception as e:
        if broken_exit and isinstance(e, BreakerTripped):
            raise fail(str(e), 3) from None
        if isinstance(e, errors):
            raise fail(str(e)) from e
        raise
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        if isinstance(interrupted, str):
            raise fail(interrupted, 130) from None
        interrupted()
        raise typer.Exit(130) from None
    finally:
        if cache is not None:
            cache.close()
