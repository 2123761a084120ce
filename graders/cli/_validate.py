"""`gradekit validate`: grade one example and one response, and show how the reward came about.

The local equivalent of Vertex's ValidateReinforcementTuningReward and OpenAI's graders/run:
run it before a tuning job to catch parse errors, unhandled cases and broken snippets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .._flags import in_flags, said_as_flags
from ._common import fail, json_option, print_json, run_judging, warnings_to_stderr
from ._judge_options import JudgeOptions, judge_options

if TYPE_CHECKING:  # pydantic models load when the command runs
    from .._sample import Grade, Message, Sample


class _InputError(ValueError):
    pass


def read_example(path: Path) -> Sample:
    """A Vertex-style row (contents, systemInstruction, references) or a gradekit sample (JSON or JSONL)."""
    from .._sample import sample_from_row

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise _InputError(f"{path}: {e.strerror or e}") from e
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        text = next((line for line in text.splitlines() if line.strip()), "")
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise _InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(row, dict):
        raise _InputError(f"{path}: the example must be a JSON object, got {type(row).__name__}")
    try:
        return sample_from_row(row)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise _InputError(f"{path}: not a Vertex row or a gradekit sample: {e}") from e


def read_response(path: Path) -> list[Message] | str:
    """A Vertex Content, an OpenAI message (or completion, or list of messages), or plain text."""
    from .._sample import Message, vertex_content_messages

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise _InputError(f"{path}: {e.strerror or e}") from e
    if path.suffix.lower() in (".txt", ".md"):
        return text
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        if path.suffix.lower() == ".json":
            raise _InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); use a .txt file for plain text") from e
        return text
    try:
        if isinstance(data, dict) and "candidates" in data:  # a whole GenerateContentResponse
            data = (data["candidates"] or [{}])[0].get("content") or {}
        if isinstance(data, dict) and "choices" in data:  # a whole chat.completion
            data = (data["choices"] or [{}])[0].get("message") or {}
        if isinstance(data, dict) and "parts" in data:
            return vertex_content_messages(data)
        if isinstance(data, dict) and "role" in data:
            return [Message.model_validate(data)]
        if isinstance(data, list) and all(isinstance(m, dict) and "role" in m for m in data):
            return [Message.model_validate(m) for m in data]
    except (ValueError, AttributeError, TypeError) as e:
        raise _InputError(f"{path}: not a Vertex Content or an OpenAI message: {e}") from e
    if isinstance(data, str):
        return data
    return text  # a bare number or other JSON: the model's text as written


def flatten_parts(grade: Grade, prefix: str = "") -> dict[str, Grade]:
    """Every part of a composite, nested ones as ``outer/inner``."""
    flat: dict[str, Grade] = {}
    for name, part in grade.parts.items():
        key = f"{prefix}{name}"
        flat[key] = part
        flat.update(flatten_parts(part, f"{key}/"))
    return flat


def report(grade: Grade) -> dict[str, Any]:
    parts = flatten_parts(grade)
    errors = [f"{name}: {in_flags(part.error)}" for name, part in parts.items() if part.error and not part.parts]
    if grade.error and not errors:
        errors.append(in_flags(grade.error))
    logs = [line for part in parts.values() if not part.parts for line in part.debug] + grade.debug
    return {
        "reward": grade.score,
        "status": grade.status,
        "error_kind": grade.error_kind,  # why it failed, by name (timeout, verifier_error, invalid_gold, ...)
        "parts": {name: {"reward": part.score, "error": said_as_flags(part.error)} for name, part in parts.items()},
        "errors": errors,
        "logs": logs,
    }


async def _grade(config: Path, sample: Sample, judge_factory: Any) -> tuple[Grade, dict[str, Any]]:
    from .._config import load_grader  # the judge client (openai) loads when the command runs
    from .._sample import aclose_grader

    grader = load_grader(config, judge=judge_factory)
    try:
        return await grader(sample), grader.sandboxes
    finally:
        await aclose_grader(grader)


def sandbox_report(sandboxes: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Where each code-running part runs, and a warning for each that runs unisolated."""
    shown = {name: isolation.describe() for name, isolation in sandboxes.items()}
    warnings = [f"{name} runs with sandbox: none: its code is NOT isolated (network, files, processes); use it only for trusted code"
                for name, isolation in sandboxes.items() if isolation.kind == "none"]
    warnings += [f"{name} runs without bubblewrap: {isolation.reason}; not enforced: {', '.join(isolation.not_enforced)}"
                 for name, isolation in sandboxes.items() if isolation.kind in ("namespaces", "rlimits")]
    return shown, warnings


@judge_options
def validate(
    definition: Path = typer.Argument(None, help="An OpenAI eval definition (evals.create's JSON, or what evals.retrieve() returned): checked with the openai SDK's types and built, no grading."),
    grader: Path = typer.Option(None, "--grader", help="Grader config (YAML/JSON), or a Vertex reinforcementTuningSpec JSON."),
    example: Path = typer.Option(None, "--example", help="A Vertex-style row (contents, systemInstruction, references) or a gradekit sample, as JSON."),
    response: Path = typer.Option(None, "--response", help="The model's response: a Vertex Content, an OpenAI message, or plain text (.txt)."),
    json_output: bool = json_option("result"),
    *,
    opts: JudgeOptions,
) -> None:
    """Grade one EXAMPLE + RESPONSE with a grader and print the reward, each part's reward and error, and the debug lines.

    Exit status: 0 when the reward was computed, 1 when the grade is invalid or an error
    (the output says why), 2 when the files cannot be read, the grader config is wrong or
    a grader asks for sandbox: strict where bubblewrap cannot run. Code-running graders
    show where they run (sandbox:), and sandbox: none is flagged with a WARNING line.
    """
    from .._config import GraderConfigError

    if definition is not None:
        if grader is not None or example is not None or response is not None:
            raise fail("give an eval definition (DEFINITION), or --grader with --example and --response, not both")
        _validate_definition(definition, json_output)
    if grader is None or example is None or response is None:
        raise fail("give --grader, --example and --response (or an eval definition as DEFINITION)")
    try:
        sample = read_example(example).with_response(read_response(response))
    except _InputError as e:
        raise fail(str(e)) from e

    warnings_to_stderr()
    opts.check()
    model = opts.one_model("validate")
    cache = opts.open_cache(by_default=False)  # one example: cached only when --cache asks for it
    limiter, budget = opts.limiter(model), opts.budget()

    judge_factory = opts.file_judge(model, limiter=limiter, cache=cache, budget=budget)  # the file's judge: beneath the options

    grade, sandboxes = run_judging(lambda: _grade(grader, sample, judge_factory), cache, opts.traffic(),
                                   errors=(GraderConfigError,), interrupted=None)
    result = report(grade)
    if sandboxes:
        result["sandbox"], result["warnings"] = sandbox_report(sandboxes)
    if json_output:
        print_json(result)
    else:
        _print(result)
    raise typer.Exit(0 if grade.ok else 1)


def _validate_definition(path: Path, json_output: bool) -> None:
    """Exit 0 when the openai SDK's types accept the eval and gradekit builds every criterion, else 2."""
    import asyncio

    from gradekit.judge._spec import JudgeSpec

    from .._config import GraderConfigError, load_grader
    from .._evals import EvalGrader, sdk_problems
    from .._sample import aclose_grader

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise fail(f"{path}: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise fail(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or "testing_criteria" not in data:
        raise fail(f"{path}: not an eval definition (no testing_criteria); a grader config takes --grader, --example and --response")
    problems = [f"openai SDK: {p}" for p in sdk_problems(data)]
    names: list[str] = []
    sandbox: dict[str, str] = {}
    warnings: list[str] = []
    try:
        built = load_grader(path, judge=lambda: JudgeSpec.of(api_key="unused").build())  # built, never asked: nothing is judged
        if isinstance(built.grader, EvalGrader):
            names = built.grader.names
        # Where each python criterion's code will run: the same report `validate --grader` gives.
        sandbox, warnings = sandbox_report(_by_criterion(getattr(built, "sandboxes", {}) or {}, names))
        asyncio.run(aclose_grader(built))
    except GraderConfigError as e:
        problems.append(f"gradekit: {e}")
    if json_output:
        print_json({"definition": str(path), "valid": not problems, "problems": problems, "testing_criteria": names,
                    "sandbox": sandbox, "warnings": warnings})
    else:
        for problem in problems:
            typer.echo(f"error: {problem}", err=True)
        if not problems:
            typer.echo(f"{path}: a valid eval; testing criteria: {', '.join(names)}")
            if sandbox:
                typer.echo("sandbox:")
                width = max(len(name) for name in sandbox)
                for name, where in sandbox.items():
                    typer.echo(f"  {name.ljust(width)}  {where}")
            for warning in warnings:
                typer.echo(f"WARNING: {warning}", err=True)
    raise typer.Exit(2 if problems else 0)


def _by_criterion(sandboxes: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``testing_criteria.2`` named as the criterion is (its name), where the definition gives one."""
    out = {}
    for where, isolation in sandboxes.items():
        index = where.rpartition(".")[2]
        out[names[int(index)] if where.startswith("testing_criteria.") and index.isdigit() and int(index) < len(names) else where] = isolation
    return out


def _print(result: dict[str, Any]) -> None:
    for warning in result.get("warnings", []):
        typer.echo(f"WARNING: {warning}")
    reward = result["reward"]
    typer.echo(f"reward: {reward:g}" if reward is not None else f"reward: none ({result['status']})")
    if reward is None and result.get("error_kind"):
        typer.echo(f"error_kind: {result['error_kind']}")
    if result["parts"]:
        typer.echo("parts:")
        width = max(len(name) for name in result["parts"])
        for name, part in result["parts"].items():
            shown = f"{part['reward']:g}" if part["reward"] is not None else "none"
            typer.echo(f"  {name:<{width}}  {shown}" + (f"  error: {part['error']}" if part["error"] else ""))
    if result["errors"]:
        typer.echo("errors:")
        for error in result["errors"]:
            typer.echo(f"  {error}")
    if result.get("sandbox"):
        typer.echo("sandbox:")
        width = max(len(name) for name in result["sandbox"])
        for name, where in result["sandbox"].items():
            typer.echo(f"  {name:<{width}}  {where}")
    if result["logs"]:
        typer.echo("logs:")
        for line in result["logs"]:
            typer.echo(f"  {line}")
