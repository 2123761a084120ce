"""Volcengine Ark: any gradekit grader as an ``@group_grader`` plugin function.

Ark calls ``grader(context, sample, trajectories)`` with its pydantic objects (or dicts, in a
local test) and reads a ``GroupGraderResult(rewards, metrics, status, error)``. The grading itself
is :func:`graders.group_grader` (seed 000's checks, trajectories graded concurrently, Ark status
policies); this module only converts Ark's objects in and the result out.

``ark_sdk`` is not on PyPI; when it is importable its types are used (so the decorator sees the
annotations it expects), otherwise pydantic models with the same fields stand in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._config import load_group_grader
from .._group import GroupGrader, GroupResult, Policy, SampleChecks, TrajectoryChecks, group_grader
from .._sample import Grader, Sample, Trajectory, sample_from_row
from ._common import as_row, grader_name, resolve_grader


class _PluginStatus(str, Enum):
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    DISCARD = "DISCARD"
    RETRY = "RETRY"


class _ArkMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Any = None
    tool_calls: list[Any] | None = None
    reasoning_content: str | None = ""


class _ChatCompletionSample(BaseModel):
    """Ark's dataset line: the answer or label lives in ``extra``."""

    model_config = ConfigDict(extra="allow")

    messages: list[_ArkMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    thinking: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None


class _ArkTrajectory(BaseModel):
    model_config = ConfigDict(extra="allow")

    messages: list[_ArkMessage] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None


class _GroupGraderResult(BaseModel):
    rewards: list[float] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    status: _PluginStatus = _PluginStatus.SUCCESS
    error: str = ""


class _SingleGraderResult(BaseModel):
    """``@single_grader``'s result per the Ark doc's table: one reward plus metrics, status, error.
    The SDK's class name for it is not in the public docs; this stands in unless the SDK has it."""

    reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    status: _PluginStatus = _PluginStatus.SUCCESS
    error: str = ""


try:  # the real SDK, when installed (pip install <ark_sdk tarball>)
    from ark_sdk.types.pipeline_plugin import GroupGraderResult  # type: ignore[import-not-found]
    from ark_sdk.types.pipeline_plugin.pipeline_plugin import PluginContext, PluginStatus  # type: ignore[import-not-found]
    from ark_sdk.types.pipeline_plugin.rollout import ChatCompletionSample  # type: ignore[import-not-found]
    from ark_sdk.types.pipeline_plugin.rollout import Trajectory as ArkTrajectory  # type: ignore[import-not-found]

    HAVE_ARK_SDK = True
    try:
        from ark_sdk.types.pipeline_plugin import SingleGraderResult  # type: ignore[import-not-found]
    except ImportError:
        SingleGraderResult = _SingleGraderResult  # type: ignore[misc,assignment]
except ImportError:
    SingleGraderResult = _SingleGraderResult  # type: ignore[misc,assignment]
    GroupGraderResult = _GroupGraderResult  # type: ignore[misc,assignment]
    PluginStatus = _PluginStatus  # type: ignore[misc,assignment]
    PluginContext = dict  # type: ignore[misc,assignment]  # the doc shows the context as a dict
    ChatCompletionSample = _ChatCompletionSample  # type: ignore[misc,assignment]
    ArkTrajectory = _ArkTrajectory  # type: ignore[misc,assignment]
    HAVE_ARK_SDK = False

ArkGroupGrader = Callable[[Any, Any, Sequence[Any]], Awaitable[Any]]


def ark_sample(sample: Any) -> Sample:
    """Ark's ChatCompletionSample (or its dict) as a gradekit Sample: ``extra`` -> references."""
    row = as_row(sample, "sample")
    row.setdefault("extra", None)
    return sample_from_row(row)


def ark_trajectory(trajectory: Any) -> Trajectory:
    """Ark's Trajectory (or its dict); list content stays a list and is read as its text parts."""
    return Trajectory.model_validate(as_row(trajectory, "trajectory"))


def ark_result(result: GroupResult) -> Any:
    """gradekit's GroupResult as Ark's GroupGraderResult (the per-trajectory grades are dropped)."""
    return GroupGraderResult(rewards=list(result.rewards), metrics=dict(result.metrics),
                             status=PluginStatus[result.status.value], error=result.error)


def ark_group_grader(
    grader: Grader | str | Path | Mapping[str, Any] | None = None,
    *,
    group: GroupGrader | None = None,
    checks: TrajectoryChecks | None = None,
    sample_checks: SampleChecks | None = None,
    on_judge_error: Policy = "RETRY",
    on_invalid: Policy = "DISCARD",
    pass_threshold: float = 0.5,
    name: str | None = None,
) -> ArkGroupGrader:
    """An Ark group grader plugin function over a gradekit grader.

    Decorate the result with Ark's ``@group_grader(...)`` or wrap it in your own decorated
    function. Status mapping (the contract's table): every trajectory graded -> SUCCESS; the
    sample is unusable (``sample_checks``, or a grader says ``invalid``, e.g. no ``extra.answer``)
    -> DISCARD with ``rewards=[]``; a judge error after its retries -> ``on_judge_error`` (RETRY by
    default: Ark retries the sample 3 times, then drops it; FAILURE fails the job; or a fixed
    score); a sample or trajectory that is not even valid input -> DISCARD; an unexpected
    exception -> FAILURE with the exception text (what Ark does with an unhandled one).

    Args:
        grader: grades one trajectory's final answer; a Grader, or a config file/mapping. A
            ``type: group`` config loads as the whole group grader with its own policies.
        group: an already built group grader (``load_group_grader``) instead of ``grader``.
        checks, sample_checks, on_judge_error, on_invalid, pass_threshold: as in
            :func:`graders.group_grader`.
        name: the function's ``__name__`` (Ark's default plugin name).
    """
    if (grader is None) == (group is None):
        raise ValueError("ark_group_grader needs exactly one of grader= or group=")
    if group is None:
        if _is_group_config(grader):
            group = load_group_grader(grader)  # type: ignore[arg-type]
        else:
            inner = resolve_grader(grader)  # type: ignore[arg-type]
            group = group_grader(inner, checks=checks, sample_checks=sample_checks, on_judge_error=on_judge_error,
                                 on_invalid=on_invalid, pass_threshold=pass_threshold)
            name = name or grader_name(inner, "gradekit_group_grader")
    run = group

    async def grade(context: PluginContext, sample: ChatCompletionSample, trajectories: list[ArkTrajectory]) -> GroupGraderResult:
        try:
            converted = ark_sample(sample)
            rollouts = [ark_trajectory(t) for t in trajectories]
        except (ValidationError, TypeError, ValueError) as e:
            return GroupGraderResult(rewards=[], metrics={}, status=PluginStatus.DISCARD, error=f"sample is not valid input: {e}")
        try:
            result = await run(converted, rollouts)
        except Exception as e:  # noqa: BLE001 - Ark's own handling of an unhandled exception is FAILURE; say why
            return GroupGraderResult(rewards=[], metrics={}, status=PluginStatus.FAILURE, error=f"{type(e).__name__}: {e}")
        return ark_result(result)

    grade.__name__ = grade.__qualname__ = name or "gradekit_group_grader"
    # Real objects, not PEP 563 strings: a decorator reading the signature sees the SDK's types.
    grade.__annotations__ = {"context": PluginContext, "sample": ChatCompletionSample, "trajectories": list[ArkTrajectory],
                             "return": GroupGraderResult}
    grade.group = run  # type: ignore[attr-defined]  # the gradekit group grader inside, for tests and reuse
    return grade


ArkSingleGrader = Callable[[Any, Any, Any], Awaitable[Any]]


def ark_single_grader(
    grader: Grader | str | Path | Mapping[str, Any] | None = None,
    *,
    group: GroupGrader | None = None,
    checks: TrajectoryChecks | None = None,
    sample_checks: SampleChecks | None = None,
    on_judge_error: Policy = "RETRY",
    on_invalid: Policy = "DISCARD",
    name: str | None = None,
) -> ArkSingleGrader:
    """An Ark ``@single_grader`` plugin function: one trajectory in, one reward out.

    Ark splits the n generations of a sample into n calls of ``grader(context, sample,
    trajectory)``. The grading is the group grader's over a group of one, so the checks, the
    preset reward in ``trajectory.extra`` and the status policies are the same as
    :func:`ark_group_grader`'s; a non-SUCCESS status carries reward 0.0 as a placeholder (Ark
    reads the status first). Arguments as in :func:`ark_group_grader`.
    """
    plugin = ark_group_grader(grader, group=group, checks=checks, sample_checks=sample_checks, on_judge_error=on_judge_error,
                              on_invalid=on_invalid, name=name)

    async def grade(context: PluginContext, sample: ChatCompletionSample, trajectory: ArkTrajectory) -> SingleGraderResult:
        result = await plugin(context, sample, [trajectory])
        reward = result.rewards[0] if result.rewards else 0.0
        return SingleGraderResult(reward=reward, metrics=dict(result.metrics), status=result.status, error=result.error)

    grade.__name__ = grade.__qualname__ = plugin.__name__.replace("group_grader", "single_grader")
    grade.__annotations__ = {"context": PluginContext, "sample": ChatCompletionSample, "trajectory": ArkTrajectory,
                             "return": SingleGraderResult}
    grade.group = plugin.group  # type: ignore[attr-defined]
    return grade


def _is_group_config(source: Any) -> bool:
    """A ``type: group`` config (file or mapping) is a whole group grader, policies included."""
    import yaml

    if isinstance(source, Mapping):
        return source.get("type") == "group"
    if not isinstance(source, (str, Path)):
        return False
    try:
        data = yaml.safe_load(Path(source).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False  # load_grader reports the problem with its own message
    return isinstance(data, Mapping) and data.get("type") == "group"
