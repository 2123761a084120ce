"""Microsoft Foundry (Azure OpenAI) evals and reinforcement fine-tuning: a grader config as Foundry grader JSON.

Foundry's graders are OpenAI's grader schema (``string_check``, ``text_similarity``, ``python``,
``score_model``, ``label_model``, ``multi``; learn.microsoft.com/azure/foundry/concepts/evaluation-
evaluators/azure-openai-graders), so a grader with a native form is exported as
:func:`export_openai_grader` exports it, with the same range rules (``rescale``). A grader with no
native form (a gradekit rubric, an autorater matched against an expression, code_tests, ...)
becomes Foundry's ``endpoint`` grader, which POSTs ``{"sample", "item", "trace_id"}`` to a URL and
reads ``{"score": float}`` back: pointed at ``gradekit serve``'s ``POST /grade``, it grades with
this very grader. Source of the endpoint grader's schema and its request/response:
github.com/microsoft-foundry/fine-tuning, Demos/Agentic_RFT_ToolCall_EndpointGrader/README.md
(private preview; ``type``, ``name``?, ``url``, ``headers``?, ``rate_limit``? requests per second,
``pass_threshold``?). An Evals-API eval definition (``testing_criteria``) is exported as the eval
Foundry's evals API takes, each criterion checked with the openai SDK's types.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from .._config import _read
from .._evals import EvalDefinition, criterion_node, is_eval_definition, sdk_problems
from ._nodes import ExportError
from ._openai_export import LabelModelGrader, MultiGrader, PythonSourceGrader, ScoreModelGrader, StringCheckGrader, TextSimilarityGrader
from ._openai_export import TARGET as OPENAI_TARGET
from ._openai_export import export_openai_grader

TARGET = "a Microsoft Foundry grader"
GRADE_ROUTE = "/grade"  # gradekit serve's route for Foundry's endpoint grader
ConfigSource = str | Path | Mapping[str, Any]


class EndpointGrader(BaseModel):
    """Foundry's ``endpoint`` grader (RFT, private preview), as its README documents it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["endpoint"] = "endpoint"
    name: str | None = None
    url: str
    headers: dict[str, str] | None = None  # forwarded to the endpoint as given
    rate_limit: Annotated[int, Field(gt=0)] | None = None  # requests per second Foundry sends at most
    pass_threshold: float | None = None

    @field_validator("url")
    @classmethod
    def _absolute(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise ValueError(f"the endpoint grader needs an absolute http(s) URL, got {v!r}")
        return v


FoundryGrader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonSourceGrader | ScoreModelGrader | LabelModelGrader | MultiGrader
                          | EndpointGrader, Field(discriminator="type")]
_CHECK: TypeAdapter[Any] = TypeAdapter(FoundryGrader)


def endpoint_url(url: str) -> str:
    """The URL as given, or with gradekit serve's ``/grade`` when it names only the server."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path=GRADE_ROUTE))
    return url


def check_foundry_grader(grader: Mapping[str, Any]) -> list[str]:
    """What Foundry's documented grader schema says is wrong with ``grader`` (empty: nothing)."""
    try:
        _CHECK.validate_python(dict(grader))
    except ValidationError as e:
        return [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:10]]
    return []


def export_foundry_grader(config: ConfigSource, *, endpoint: str | None = None, headers: Mapping[str, str] | None = None,
                          rate_limit: int | None = None, pass_threshold: float | None = None, force_endpoint: bool = False,
                          rescale: bool = False, model: str | None = None, on_invalid: float | None = None) -> dict[str, Any]:
    """A grader config (or an Evals-API eval) as the grader JSON Foundry's evals and RFT accept.

    Args:
        config: a grader config file or mapping, or an eval definition (``testing_criteria``).
        endpoint: gradekit serve's URL (``https://host`` gets ``/grade``); with it, a grader that has
            no native form becomes an ``endpoint`` grader calling it. Without it, such a grader is refused.
        headers, rate_limit, pass_threshold: the endpoint grader's own fields (headers go to your server
            as written: put a placeholder, not a secret, in files you share).
        force_endpoint: an endpoint grader even when a native form exists (the same numbers as ``gradekit grade``).
        rescale, model, on_invalid: as :func:`export_openai_grader`.

    Raises:
        ExportError: no native form and no ``endpoint``; an eval whose criteria the SDK's types refuse.
    """
    data, where, _ = _read(config)
    if is_eval_definition(data):
        return _eval(data, where)
    reasons: list[str] = []
    if not force_endpoint:
        try:
            native = export_openai_grader(config, rescale=rescale, model=model, on_invalid=on_invalid)
        except ExportError as e:
            reasons = e.reasons
        else:
            if native.get("type") == "text_similarity" and isinstance(data.get("pass_threshold"), (int, float)):
                # Foundry's graders page lists pass_threshold as text_similarity's (OpenAI's RFT grader type has none)
                native["pass_threshold"] = float(data["pass_threshold"])
            problems = check_foundry_grader(native)
            if problems:  # the OpenAI shapes are Foundry's: a failure here is gradekit's bug, said plainly
                raise ExportError(TARGET, [f"the exported grader does not match Foundry's schema: {p}" for p in problems])
            return native
    if endpoint is None:
        hint = ("pass an endpoint URL (`endpoint` https://your-host) to export an endpoint grader that calls "
                f"`gradekit serve` (route POST {GRADE_ROUTE}) with this grader")
        raise ExportError(TARGET, [*(r.replace(OPENAI_TARGET, TARGET) for r in reasons), hint])
    name = str(data.get("name") or data.get("type") or "gradekit")
    try:
        grader = EndpointGrader(name=name, url=endpoint_url(endpoint), headers=dict(headers) if headers else None, rate_limit=rate_limit,
                                pass_threshold=pass_threshold)
    except ValidationError as e:
        raise ExportError(TARGET, [f"{'.'.join(map(str, err['loc'])) or 'endpoint'}: {err['msg']}" for err in e.errors()]) from None
    return grader.model_dump(mode="json", exclude_none=True)


def _eval(data: dict[str, Any], where: str) -> dict[str, Any]:
    problems = sdk_problems(data)
    if problems:
        raise ExportError(TARGET, [f"{where}: openai SDK: {p}" for p in problems])
    definition = EvalDefinition.model_validate(data)
    out: dict[str, Any] = {"name": definition.name} if definition.name else {}
    if data.get("object") != "eval" and definition.data_source_config is not None:
        out["data_source_config"] = definition.data_source_config
    out["testing_criteria"] = [criterion_node(c) for c in definition.testing_criteria]
    return out
