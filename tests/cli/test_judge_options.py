"""The judge options are declared once (graders/cli/_judge_options.py): every command that talks to a judge takes all of them."""

from __future__ import annotations

import click
import pytest
import typer

from gradekit.graders.cli import app
from gradekit.graders.cli._judge_options import OPTION_NAMES, parse_judge_params

JUDGE_COMMANDS = ["grade", "meta-eval", "probe", "validate"]


def _options(command: str) -> dict:
    """The command's options by parameter name."""
    group = typer.main.get_command(app)
    found = group.get_command(click.Context(group), command)  # type: ignore[attr-defined]
    return {p.name: p for p in found.params if p.param_type_name == "option"}


@pytest.mark.parametrize("command", JUDGE_COMMANDS)
def test_every_judge_command_takes_every_judge_option_with_one_help(command: str) -> None:
    mine = _options(command)
    reference = _options("grade")
    for name in OPTION_NAMES:
        assert name in mine, f"{command} lacks the judge option {name}"
        assert (mine[name].opts, mine[name].help, mine[name].envvar) == (reference[name].opts, reference[name].help, reference[name].envvar)


@pytest.mark.parametrize(("pairs", "expected"), [
    (["reasoning_effort=low"], {"reasoning_effort": "low"}),
    (["enable_thinking=false", "seed=7", "top_p=0.5"], {"enable_thinking": False, "seed": 7, "top_p": 0.5}),
    (['thinking={"type": "disabled"}'], {"thinking": {"type": "disabled"}}),
    (["stop=a=b"], {"stop": "a=b"}),
])
def test_judge_param_values_are_json_when_they_parse(pairs, expected) -> None:
    assert parse_judge_params(pairs) == expected


@pytest.mark.parametrize("pair", ["novalue", "=x", "model=gpt-4o"])
def test_a_judge_param_that_cannot_be_sent_is_refused(pair: str) -> None:
    with pytest.raises(ValueError):
        parse_judge_params([pair])
