"""The gradekit command line: one module per command, each a thin layer over library calls.

Command modules import the library inside the command function, so ``gradekit --help`` and
``gradekit CMD --help`` load typer and rich only (tests/cli/test_cli_startup.py checks the list).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

from gradekit import __version__
from gradekit._extras import as_missing_extra

from . import _align, _calibrate, _cascade, _export, _grade, _llmbar, _meta_eval, _probe, _render, _report, _rubrics, _schema, _serve, _validate, _view


def _help_flag_defaults_to_false(option: Any) -> Any:
    """Give the help flag a False default, so typer does not load pydantic on every command.

    typer (0.2x) coerces each option whose value is not already a bool through a pydantic
    TypeAdapter. The help flag's default is None, so every run paid pydantic's import (more than
    `typer` and `rich` together) only to learn that --help was not given.
    """
    if option is not None and option.default is None:
        option.default = False
    return option


@contextlib.contextmanager
def _help_as_plain_text(*objects: Any) -> Iterator[None]:
    """Show help strings as written: rich markup would eat ``[default: gpt-4o-mini]`` and ``gradekit[ray]``.

    typer renders every help string as rich markup; gradekit's help is plain text, so each one is
    escaped for the one rendering and put back after it (the strings themselves stay plain, for
    click's own formatter and for anything else that reads them).
    """
    from rich.markup import escape

    saved = [(o, a, getattr(o, a)) for o in objects for a in ("help", "short_help", "epilog") if isinstance(getattr(o, a, None), str)]
    try:
        for o, a, text in saved:
            setattr(o, a, escape(text))
        yield
    finally:
        for o, a, text in saved:
            setattr(o, a, text)


class _Command(TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag_defaults_to_false(super().get_help_option(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _help_as_plain_text(self, *self.params):
            return super().format_help(ctx, formatter)


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for param in params:  # --install-completion / --show-completion (typer appends them late): the help flag's None default
            if param.name in ("install_completion", "show_completion"):
                _help_flag_defaults_to_false(param)
        return params

    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag_defaults_to_false(super().get_help_option(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _help_as_plain_text(self, *self.params, *self.commands.values()):
            return super().format_help(ctx, formatter)


app = typer.Typer(
    name="gradekit",
    cls=_Group,
    help="LLM-as-judge graders that turn model outputs into rewards.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion: bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"gradekit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print gradekit's version and exit."),
          verbose: bool = typer.Option(False, "-v", "--verbose",
                                       help="Show each judge request on stderr, keys redacted (GRADEKIT_VERBOSE=2: openai's debug "
                                            "lines too); put it before the command: gradekit -v grade ...")) -> None:
    """LLM-as-judge graders that turn model outputs into rewards."""
    # A bool flag, not a count: typer coerces an int option through pydantic, which `gradekit rubrics` must not load.
    level = os.environ.get("GRADEKIT_VERBOSE", "")
    if verbose or level:
        from ._verbose import show_requests

        show_requests(2 if level == "2" else 1)


# Every command with the help flag above; in this order in `gradekit --help`.
for _name, _command in (
    ("grade", _grade.grade),
    ("rubrics", _rubrics.rubrics),
    ("render", _render.render),
    ("calibrate", _calibrate.calibrate),
    ("align", _align.align),
    ("llmbar", _llmbar.llmbar),
    ("meta-eval", _meta_eval.meta_eval),
    ("probe", _probe.probe),
    ("validate", _validate.validate),
    ("schema", _schema.schema),
    ("export", _export.export),
    ("serve", _serve.serve),
    ("view", _view.view),
    ("report", _report.report),
):
    app.command(_name, cls=_Command)(_command)

cascade_app = typer.Typer(name="cascade", cls=_Group, no_args_is_help=True, help="Cascades of judges: cheap first, escalate when unsure (docs/juries.md).")
cascade_app.command("fit", cls=_Command)(_cascade.fit)
app.add_typer(cascade_app, name="cascade")


def main() -> None:
    # One name however it is started (`gradekit` or `python -m gradekit`): usage lines and the shell
    # completion's _GRADEKIT_COMPLETE variable would otherwise read "python -m gradekit".
    try:
        app(prog_name="gradekit")
    except ImportError as e:  # an optional feature without its extra: one line naming it, as a usage error
        missing = as_missing_extra(e, "this command")
        if missing is None:
            _crashed(e)
        sys.stderr.write(f"error: {missing}\n")
        raise SystemExit(2) from None
    except Exception as e:
        _crashed(e)


def _crashed(e: BaseException) -> NoReturn:
    """A bug, not a user's mistake: one line to report, with the version first."""
    import traceback

    sys.stderr.write(f"gradekit {__version__} crashed: {type(e).__name__}: {e}\n")
    if os.environ.get("GRADEKIT_TRACEBACK"):
        traceback.print_exc()
    else:
        sys.stderr.write("please report it with the command that ran; GRADEKIT_TRACEBACK=1 shows the traceback\n")
    raise SystemExit(1) from None
