"""`gradekit export`: a grader config as a platform's own grader (Vertex evaluate/spec, OpenAI and Foundry
JSON, a Bedrock reward Lambda).

The export runs the platform's grader on the platform, without gradekit; the command refuses
(exit 2) and lists each part that has no form there rather than export something that scores
differently.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer

from ._common import fail, print_or_write


class Target(str, Enum):
    vertex_evaluate = "vertex-evaluate"
    vertex_spec = "vertex-spec"
    openai = "openai"
    foundry = "foundry"
    bedrock_lambda = "bedrock-lambda"


def _headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, colon, text = value.partition(":")
        if not colon or not name.strip():
            raise fail(f"--endpoint-header {value!r}: give it as 'Name: value'")
        headers[name.strip()] = text.strip()
    return headers


def export(
    grader: Path = typer.Argument(..., help="Grader config (YAML/JSON), or a Vertex reinforcementTuningSpec JSON.", show_default=False),
    to: Target = typer.Option(..., "--to", help="vertex-evaluate: a standalone evaluate(example, response) .py file; vertex-spec: "
                              "reinforcementTuningSpec JSON; openai: OpenAI RFT grader JSON; foundry: Microsoft Foundry "
                              "evals/RFT grader JSON (an endpoint grader calling gradekit serve where no native form exists); "
                              "bedrock-lambda: a self-contained lambda_function.py for Bedrock/SageMaker RFT."),
    out: Path = typer.Option(None, "-o", "--output", help="Write here instead of standard output."),
    rescale: bool = typer.Option(False, "--rescale", help="openai, foundry, bedrock-lambda: map gradekit's [-1, 1] onto 0..1 as "
                                 "(score + 1) / 2."),
    on_invalid: float = typer.Option(None, "--on-invalid", help="vertex-evaluate, openai, foundry, bedrock-lambda: the score for an "
                                     "example the grader cannot grade (default: raise, so the platform leaves it unscored)."),
    model: str = typer.Option(None, "--model", envvar="GRADEKIT_MODEL", help="openai, foundry: the score_model model [default: the "
                              "config's judge.model]."),
    endpoint_url: str = typer.Option(None, "--endpoint-url", help="foundry, bedrock-lambda: gradekit serve's URL (https://host "
                                     "gets /grade). foundry: a grader with no native form becomes an endpoint grader calling it; "
                                     "bedrock-lambda: the Lambda forwards every sample there (for graders with an LLM judge)."),
    endpoint_header: list[str] = typer.Option([], "--endpoint-header", help="foundry, bedrock-lambda: a header sent with each "
                                              "request to --endpoint-url, 'Name: value' (repeatable), e.g. 'Authorization: Bearer ${KEY}'."),
    rate_limit: int = typer.Option(None, "--rate-limit", min=1, help="foundry: the endpoint grader's rate_limit, requests per second."),
    pass_threshold: float = typer.Option(None, "--pass-threshold", help="foundry: the endpoint grader's pass_threshold."),
    endpoint: bool = typer.Option(False, "--endpoint", help="foundry: an endpoint grader even where a native form exists "
                                  "(needs --endpoint-url)."),
) -> None:
    """Export GRADER to a platform's own grader format.

    Exit status: 0 when written, 2 when the config is wrong or the grader cannot be expressed
    on the target (the message lists why, part by part).
    """
    from .._config import GraderConfigError
    from ..platforms import (
        ExportError,
        export_bedrock_lambda,
        export_foundry_grader,
        export_openai_grader,
        export_vertex_evaluate,
        export_vertex_spec,
    )

    if endpoint and not endpoint_url:
        raise fail("--endpoint needs --endpoint-url (gradekit serve's URL)")
    try:
        if to is Target.vertex_evaluate:
            text = export_vertex_evaluate(grader, on_invalid=on_invalid)
        elif to is Target.bedrock_lambda:
            text = export_bedrock_lambda(grader, on_invalid=on_invalid, rescale=rescale, endpoint=endpoint_url,
                                         headers=_headers(endpoint_header))
        elif to is Target.foundry:
            text = json.dumps(export_foundry_grader(grader, endpoint=endpoint_url, headers=_headers(endpoint_header), rate_limit=rate_limit,
                                                    pass_threshold=pass_threshold, force_endpoint=endpoint, rescale=rescale, model=model,
                                                    on_invalid=on_invalid), ensure_ascii=False, indent=2) + "\n"
        elif to is Target.vertex_spec:
            text = json.dumps(export_vertex_spec(grader), ensure_ascii=False, indent=2) + "\n"
        else:
            text = json.dumps(export_openai_grader(grader, rescale=rescale, model=model, on_invalid=on_invalid),
                              ensure_ascii=False, indent=2) + "\n"
    except (ExportError, GraderConfigError) as e:
        raise fail(str(e)) from e
    except ValueError as e:  # on_invalid out of range and the like
        raise fail(str(e)) from e
    print_or_write(text, out, f" ({to.value})")
