"""Vertex AI's ``reinforcementTuningSpec`` as gradekit graders, and back to JSON unchanged.

The models mirror the REST schema field for field (camelCase, unknown fields rejected with
their path), so ``dump_vertex_spec(load(...))`` gives back the JSON that was read. A spec loads
as a grader: string match and JSON match run locally, the autorater runs on a gradekit Judge,
code execution runs in the sandboxed python grader, and Cloud Run is called over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gradekit.judge import Judge

from ._composite import MAX_PARTS, weighted_grader
from ._llm import autorater_grader
from ._python import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, python_grader
from ._sample import Grade, Grader, Sample, to_vertex_content, to_vertex_example
from ._string_match import ParseConfig, json_match_grader, string_match_grader


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class VertexParseConfig(_Model):
    parseType: Literal["IDENTITY", "REGEX_EXTRACT", "PARSE_TYPE_UNSPECIFIED"] = "IDENTITY"
    regexExtractExpression: str | None = None

    def to_parse(self) -> ParseConfig:
        if self.parseType == "REGEX_EXTRACT":
            return ParseConfig(type="REGEX_EXTRACT", regex=self.regexExtractExpression)
        return ParseConfig()


class StringMatchExpression(_Model):
    matchOperation: Literal["EXACT_MATCH", "PARTIAL_MATCH", "REGEX_CONTAINS"]
    expression: str


class JsonMatchExpression(_Model):
    keyName: str
    valueStringMatchExpression: StringMatchExpression


class StringMatchRewardScorer(_Model):
    stringMatchExpression: StringMatchExpression | None = None
    jsonMatchExpression: JsonMatchExpression | None = None
    # proto3: an unset number is 0; a spec that omits a reward means 0, as on Vertex.
    correctAnswerReward: float = 0.0
    wrongAnswerReward: float = 0.0

    @model_validator(mode="after")
    def _one(self) -> StringMatchRewardScorer:
        if (self.stringMatchExpression is None) == (self.jsonMatchExpression is None):
            raise ValueError("give exactly one of stringMatchExpression and jsonMatchExpression")
        return self


class ExactMatchScorer(_Model):
    expression: str
    correctAnswerReward: float = 0.0
    wrongAnswerReward: float = 0.0


class AutoraterConfig(_Model):
    # Passed through unchanged; the autorater model is gradekit's Judge (see load_vertex_spec).
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    autoraterModel: str | None = None
    samplingCount: int | None = None
    flipEnabled: bool | None = None


class AutoraterScorer(_Model):
    autoraterPrompt: str
    autoraterConfig: AutoraterConfig | None = None
    autoraterResponseParseConfig: VertexParseConfig | None = None
    parsedResponseConversionScorer: dict[str, Any] | None = None
    exactMatchScorer: ExactMatchScorer | None = None

    @model_validator(mode="after")
    def _one(self) -> AutoraterScorer:
        if self.parsedResponseConversionScorer is not None and self.exactMatchScorer is not None:
            raise ValueError("give at most one of parsedResponseConversionScorer and exactMatchScorer")
        if self.exactMatchScorer is not None and "{{" in self.exactMatchScorer.expression.replace("{{references.", "").replace("{{ references.", ""):
            raise ValueError("exactMatchScorer.expression may only use {{references.key}} placeholders")
        return self


class CodeExecutionRewardScorer(_Model):
    pythonCodeSnippet: str


class CloudRunRewardScorer(_Model):
    cloudRunUri: str


class SingleRewardConfig(_Model):
    rewardName: str | None = None
    parseResponseConfig: VertexParseConfig | None = None
    stringMatchRewardScorer: StringMatchRewardScorer | None = None
    autoraterScorer: AutoraterScorer | None = None
    codeExecutionRewardScorer: CodeExecutionRewardScorer | None = None
    cloudRunRewardScorer: CloudRunRewardScorer | None = None

    @model_validator(mode="after")
    def _one(self) -> SingleRewardConfig:
        set_ = [k for k in _SCORERS if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"give exactly one scorer ({', '.join(_SCORERS)}); got {', '.join(set_) or 'none'}")
        return self

    @property
    def scorer(self) -> str:
        return next(k for k in _SCORERS if getattr(self, k) is not None)


_SCORERS = ("stringMatchRewardScorer", "autoraterScorer", "codeExecutionRewardScorer", "cloudRunRewardScorer")


class WeightedRewardConfig(_Model):
    rewardConfig: SingleRewardConfig
    weight: float = 0.0


class CompositeRewardConfig(_Model):
    weightedRewardConfigs: list[WeightedRewardConfig] = Field(min_length=1, max_length=MAX_PARTS)


class VertexSpec(_Model):
    """``reinforcementTuningSpec``: one reward, or a weighted composite of up to 16."""

    singleRewardConfig: SingleRewardConfig | None = None
    compositeRewardConfig: CompositeRewardConfig | None = None

    @model_validator(mode="after")
    def _one(self) -> VertexSpec:
        if (self.singleRewardConfig is None) == (self.compositeRewardConfig is None):
            raise ValueError("give exactly one of singleRewardConfig and compositeRewardConfig")
        return self


def is_vertex_spec(data: Any) -> bool:
    return isinstance(data, Mapping) and bool({"reinforcementTuningSpec", "singleRewardConfig", "compositeRewardConfig"} & set(data))


def parse_vertex_spec(data: Mapping[str, Any] | str | Path, *, source: str | None = None, path_prefix: str = "") -> VertexSpec:
    """Read a spec from a dict or a JSON file; ``{"reinforcementTuningSpec": {...}}`` is unwrapped.

    Errors name ``source`` (the file) and the field's path, after ``path_prefix`` when the spec
    sits inside a larger config.
    """
    where = source
    if isinstance(data, (str, Path)):
        path = Path(data)
        where = str(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read a Vertex spec: {e}") from e
    if not isinstance(data, Mapping):
        raise ValueError(f"{where or 'Vertex spec'}: must be a JSON object")
    if "reinforcementTuningSpec" in data:
        data = data["reinforcementTuningSpec"]
    try:
        return VertexSpec.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join([path_prefix] * bool(path_prefix) + list(map(str, err['loc']))) or '(top)'}: {err['msg']}"
                             for err in e.errors())
        raise ValueError(f"{where or 'Vertex spec'}: {problems}") from None


def dump_vertex_spec(spec: VertexSpec, *, wrap: bool = False) -> dict[str, Any]:
    """The spec as Vertex JSON: only the fields that were set, so a loaded spec dumps unchanged."""
    body = spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return {"reinforcementTuningSpec": body} if wrap else body


# ---- building graders ---------------------------------------------------------------------


def cloud_run_grader(uri: str, *, timeout: float = 300.0, headers: Mapping[str, str] | None = None, name: str = "cloud_run") -> Grader:
    """Vertex's cloudRunRewardScorer: POST the example and response, read ``reward`` back.

    A non-200 answer, a timeout or a reply without a numeric ``reward`` is an ``error``
    (could not grade), never a score.
    """
    sent_headers = {"Content-Type": "application/json", **(headers or {})}

    def post(body: bytes) -> tuple[int, bytes]:
        request = urllib.request.Request(uri, data=body, headers=sent_headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the user's own service
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    async def grade(sample: Sample) -> Grade:
        # The REST reference spells the job id in snake_case, the guide in camelCase: send both.
        payload = {"example": to_vertex_example(sample), "response": to_vertex_content(sample.response),
                   "metadata": {"step": 0, "tuning_job_id": 0, "tuningJobId": 0}}
        try:
            status, body = await asyncio.to_thread(post, json.dumps(payload, ensure_ascii=False).encode("utf-8"))
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            return Grade.failed("error", f"grader {name!r}: {uri} did not answer: {getattr(e, 'reason', e)}", error_kind="server_error")
        text = body.decode("utf-8", "replace")
        if status != 200:
            return Grade.failed("error", f"grader {name!r}: {uri} answered HTTP {status}: {text[:300]}", error_kind="server_error")
        try:
            reply = json.loads(text)
            reward = float(reply["reward"])
        except (ValueError, KeyError, TypeError):
            return Grade.failed("error", f"grader {name!r}: {uri} answered without a numeric reward: {text[:300]}", error_kind="bad_reply")
        debug = [f"{name}: {uri} -> {reward:g}"]
        aux = reply.get("user_requested_aux_info") or reply.get("userRequestedAuxInfo")
        if aux:
            debug.append(f"{name}: {aux}")
        return Grade.scored(reward, debug=debug)

    grade.__name__ = name
    return grade


JudgeSource = Judge | Callable[[], Judge] | None


def _judge(judge: JudgeSource, what: str) -> Judge:
    if judge is None:
        raise ValueError(f"{what} is an autorater: pass a judge (gradekit validate builds one from `model`/`base_url`)")
    return judge() if callable(judge) else judge  # a factory, or the judge itself (a Judge, a Jury or a Cascade)


def single_reward_grader(config: SingleRewardConfig, *, judge: JudgeSource = None, name: str | None = None,
                         python_timeout: float = DEFAULT_TIMEOUT, python_memory_mb: int | None = DEFAULT_MEMORY_MB) -> Grader:
    label = name or config.rewardName or config.scorer.removesuffix("RewardScorer").removesuffix("Scorer")
    parse = config.parseResponseConfig.to_parse() if config.parseResponseConfig else ParseConfig()
    if config.stringMatchRewardScorer is not None:
        s = config.stringMatchRewardScorer
        rewards = {"correct": s.correctAnswerReward, "wrong": s.wrongAnswerReward}
        if s.stringMatchExpression is not None:
            e = s.stringMatchExpression
            return string_match_grader(e.expression, e.matchOperation, parse=parse, name=label, **rewards)
        assert s.jsonMatchExpression is not None
        j = s.jsonMatchExpression
        v = j.valueStringMatchExpression
        return json_match_grader(j.keyName, v.expression, v.matchOperation, parse=parse, name=label, **rewards)
    if config.autoraterScorer is not None:
        a = config.autoraterScorer
        reply_parse = a.autoraterResponseParseConfig.to_parse() if a.autoraterResponseParseConfig else ParseConfig()
        exact = a.exactMatchScorer
        return autorater_grader(
            _judge(judge, f"reward {label!r}"), a.autoraterPrompt, parse=reply_parse, response_parse=parse, name=label,
            expression=exact.expression if exact else None,
            correct=exact.correctAnswerReward if exact else 1.0, wrong=exact.wrongAnswerReward if exact else -1.0,
        )
    if config.codeExecutionRewardScorer is not None:
        return python_grader(config.codeExecutionRewardScorer.pythonCodeSnippet, flavour="vertex", name=label,
                             timeout=python_timeout, memory_mb=python_memory_mb)
    assert config.cloudRunRewardScorer is not None
    return cloud_run_grader(config.cloudRunRewardScorer.cloudRunUri, name=label)


def vertex_grader(spec: VertexSpec | Mapping[str, Any] | str | Path, *, judge: JudgeSource = None, **python_limits: Any) -> Grader:
    """Build a grader from a ``reinforcementTuningSpec`` (a VertexSpec, a dict or a JSON file).

    Args:
        judge: a Judge (or a function making one) for autorater rewards.
        python_limits: ``python_timeout`` / ``python_memory_mb`` for code execution rewards.
    """
    model = spec if isinstance(spec, VertexSpec) else parse_vertex_spec(spec)
    if model.singleRewardConfig is not None:
        return single_reward_grader(model.singleRewardConfig, judge=judge, **python_limits)
    assert model.compositeRewardConfig is not None
    made_judge: list[Judge] = []

    def shared() -> Judge:  # one judge for every autorater part
        if not made_judge:
            made_judge.append(_judge(judge, "an autorater part"))
        return made_judge[0]

    parts = []
    for i, weighted in enumerate(model.compositeRewardConfig.weightedRewardConfigs, start=1):
        config = weighted.rewardConfig
        part_name = config.rewardName or f"reward_{i}"
        parts.append((part_name, single_reward_grader(config, judge=shared if judge is not None else None, name=part_name, **python_limits),
                      weighted.weight))
    return weighted_grader(parts, name="composite")
