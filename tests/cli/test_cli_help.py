"""Every command's --help shows what its help strings say (defaults, extras), and the CLI conveniences work."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest
import typer
from typer.testing import CliRunner

from gradekit.graders.cli import app

runner = CliRunner()
GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)  # type: ignore[attr-defined]


def rendered_help(*args: str) -> str:
    """The help as a user reads it, with the boxes' borders gone and rich's line wrapping undone."""
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_every_command_is_covered() -> None:
    assert {"grade", "calibrate", "meta-eval", "probe", "validate", "serve", "view", "report"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_shows_every_bracketed_text_and_default(name: str) -> None:
    command: click.Command = GROUP.commands[name]  # type: ignore[attr-defined]
    text = rendered_help(name)
    for param in command.params:
        help_text = " ".join((getattr(param, "help", None) or "").split())
        # Whatever a help string puts in square brackets ([default: ...], gradekit[ray]) reaches the user.
        for bracketed in re.findall(r"\S*\[[^\]]*\]\S*", help_text):
            assert bracketed.rstrip(".,;)") in text, f"{name} {param.name}: {bracketed!r} is not in its --help"
        default = param.default
        if getattr(param, "show_default", None) is not False and isinstance(default, (int, float, str)) \
                and not isinstance(default, bool) and default != "":
            assert f"[default: {default}]" in text, f"{name} {param.name}: its default {default!r} is not in its --help"


def test_grade_help_shows_the_default_model_and_the_ray_extra() -> None:
    text = rendered_help("grade")
    assert "[default: gpt-4o-mini]" in text and "gradekit[ray]" in text and "Judge model ." not in text
    assert "[default: UTF-8, with or without a BOM]" in text and "[default: this process only; with --ray: ray]" in text


def test_version_and_shell_completion() -> None:
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"gradekit {version('gradekit')}"
    # A real process: completion is how the shell calls the program, so no in-process runner.
    done = subprocess.run([sys.executable, "-m", "gradekit", "--show-completion", "bash"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "_GRADEKIT_COMPLETE=complete_bash" in done.stdout and "-F _gradekit_completion gradekit" in done.stdout, done.stderr
    # The completion itself: the shell asks with the words typed so far and gets the commands back.
    env = {"_GRADEKIT_COMPLETE": "complete_bash", "COMP_WORDS": "gradekit ca", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "gradekit"], capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert "calibrate" in done.stdout.split(), (done.stdout, done.stderr)


def test_verbose_shows_each_request_with_the_key_redacted(tmp_path) -> None:
    from gradekit.judge.testing import FakeProvider

    from ..conftest import reference_judge

    source = tmp_path / "in.jsonl"
    source.write_text('{"question": "q", "references": ["a"], "prediction": "a"}\n', encoding="utf-8")
    key = "sk-secret-test-key-12345"
    with FakeProvider(responder=reference_judge) as fake:
        for level in ("", "2"):
            done = subprocess.run([sys.executable, "-m", "gradekit", "-v", "grade", str(source), "-r", "semantic_equivalence_en",
                                   "-o", str(tmp_path / f"out{level}.jsonl"), "--base-url", fake.base_url, "--api-key", key,
                                   "--no-cache"], capture_output=True, text=True, timeout=120, env={**os.environ, "GRADEKIT_VERBOSE": level})
            assert done.returncode == 0, done.stderr
            assert "HTTP Request: POST" in done.stderr and "/chat/completions" in done.stderr, done.stderr
            assert key not in done.stderr and "secret-test" not in done.stderr
        assert "openai._base_client" in done.stderr  # GRADEKIT_VERBOSE=2: openai's own debug lines too


def test_redact_catches_every_form_a_key_travels_in() -> None:
    from gradekit.graders.cli._verbose import REDACTED, redact

    for text in ("Authorization: Bearer abcdef123456", "{'authorization': 'Bearer abcdef123456'}", "'api_key': 'abcdef123456'",
                 "key sk-abcdef123456 here", "x-api-key=abcdef123456"):
        assert "abcdef123456" not in redact(text) and REDACTED in redact(text), text
    assert redact("plain mykey-value", ["mykey-value"]) == f"plain {REDACTED}"


def test_a_crash_is_one_line_with_the_version_and_no_traceback() -> None:
    from importlib.metadata import version

    # Every known mistake has its message; a bug has none. A command that divides by zero stands in for one.
    crash = ("import sys; from gradekit.graders.cli import app, main\n"
             "@app.command('boom')\ndef boom() -> None:\n    1 / 0\n"
             "sys.argv = ['gradekit', 'boom']; main()")
    done = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[0] == f"gradekit {version('gradekit')} crashed: ZeroDivisionError: division by zero"
    shown = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "GRADEKIT_TRACEBACK": "1"})
    assert "Traceback" in shown.stderr and shown.stderr.startswith(f"gradekit {version('gradekit')} crashed")
