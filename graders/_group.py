"""The group grader: all n trajectories of one sample, graded concurrently, Ark-shaped result.

Generalised from the Ark search-agent grader (seed 000). Before any judge call each trajectory
goes through the seed's checks, each one configurable:

1. a reward the rollout preset in ``trajectory.extra["reward"]`` is used as is;
2. a trailing tool call (the rollout ran out of turns): an unknown tool name or arguments that
   are not valid JSON for the tool's schema -> -1, otherwise -> 0;
3. empty final content -> -1;
4. a required tool never called -> -1.

The rest go to the grader (usually an LLM grader). Judge calls of all trajectories, and of all
groups graded at once, pass the judge's one shared limiter.

The group's status follows Ark: SUCCESS; DISCARD when the sample itself is unusable; and when a
trajectory could not be graded, the configured policy: FAILURE, RETRY, DISCARD, or a fixed score.
No judge error becomes a reward unless a fixed score is the policy.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gradekit.judge import Usage

from ._members import GroupPolicy, MemberPolicy, decide, gather_members, group_decision_metrics
from ._sample import Grade, Grader, Sample, Trajectory, usage_of


class GroupStatus(str, Enum):
    """Ark's PluginStatus values: what the trainer should do with the sample."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"  # the engine retries 3 times, then the job fails
    DISCARD = "DISCARD"  # the sample (all n generations) is dropped
    RETRY = "RETRY"  # the engine retries 3 times, then drops the sample


Policy = Literal["FAILURE", "RETRY", "DISCARD"] | float


class TrajectoryChecks(BaseModel):
    """Seed 000's trajectory checks. A reward of None switches that check off."""

    model_config = ConfigDict(extra="forbid")

    preset_reward_key: str | None = "reward"  # trajectory.extra[key] is used as the reward
    tools: list[dict[str, Any]] | None = None  # tool definitions; default: the sample's tools
    invalid_tool_call: float | None = -1.0  # trailing call: unknown name, arguments not JSON or not the schema
    trailing_tool_call: float | None = 0.0  # trailing call that is valid: out of turns
    empty_answer: float | None = -1.0
    require_tool_call: bool = False  # seed 000: answering without searching scores -1
    required_tools: list[str] = Field(default_factory=list)  # these tools must each be called
    missing_tool_call: float = -1.0


class SampleChecks(BaseModel):
    """When a sample is unusable (the group is DISCARDed before any judge call)."""

    model_config = ConfigDict(extra="forbid")

    required_references: list[str] = Field(default_factory=list)  # e.g. ["answer"], seed 000
    last_message_user: bool = True  # the prompt must end with the user's turn


class GroupResult(BaseModel):
    """What the group grader returns; ``rewards`` are in trajectory order and empty unless SUCCESS."""

    rewards: list[float] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    status: GroupStatus = GroupStatus.SUCCESS
    error: str = ""
    grades: list[Grade] = Field(default_factory=list)  # per trajectory, for debugging
    # Members that failed while the group succeeded (on_member_error: renormalize): their reward
    # is the finished members' mean, a placeholder each door marks with its trainer's mask.
    failed_members: list[int] = Field(default_factory=list)
    # What the group's judges billed: its grades' sum unless given (a pairwise group's comparisons belong to no one
    # member); None when no judge was asked.
    usage: Usage | None = None

    @model_validator(mode="after")
    def _summed(self) -> GroupResult:
        if self.usage is None:
            self.usage = usage_of(self.grades)["usage"]
        return self


GroupGrader = Callable[[Sample, Sequence[Trajectory]], Awaitable[GroupResult]]


def _tool_schemas(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    if tools is None:
        return None
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function", tool)
        if "name" in function:
            schemas[function["name"]] = function.get("parameters") or {"type": "object"}
    return schemas


def _bad_call(name: str, arguments: str, schemas: dict[str, dict[str, Any]] | None) -> str | None:
    """Why a tool call is malformed, or None. Without a tool list only the JSON is checked."""
    try:
        params = json.loads(arguments or "")
    except json.JSONDecodeError as e:
        return f"arguments of {name!r} are not JSON ({e.msg})"
    if schemas is None:
        return None
    if name not in schemas:
        return f"unknown tool {name!r} (known: {', '.join(schemas) or 'none'})"
    try:
        jsonschema.validate(instance=params, schema=schemas[name])
    except jsonschema.ValidationError as e:
        return f"arguments of {name!r} do not fit its schema: {e.message}"
    except jsonschema.SchemaError as e:
        return f"the schema of tool {name!r} is itself invalid: {e.message}"
    return None


def check_trajectory(trajectory: Trajectory, checks: TrajectoryChecks, schemas: dict[str, dict[str, Any]] | None) -> Grade | None:
    """The reward a check decides before any judge call, or None to let the grader judge."""
    extra = trajectory.extra or {}
    key = checks.preset_reward_key
    if key is not None and key in extra:
        value = extra[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return Grade.failed("invalid", f"trajectory.extra[{key!r}] is {value!r}, not a number", error_kind="input")
        return Grade.scored(value, debug=[f"preset: the rollout set reward {value:g}"], metrics={"preset": 1.0})
    final = trajectory.messages[-1] if trajectory.messages else None
    if final is not None and final.tool_calls and (checks.invalid_tool_call is not None or checks.trailing_tool_call is not None):
        for call in final.tool_calls:
            reason = _bad_call(call.function.name, call.function.arguments, schemas)
            if reason is not None and checks.invalid_tool_call is not None:
                return Grade.scored(checks.invalid_tool_call, debug=[f"check: trailing tool call: {reason}"], metrics={"format": 1.0})
        if checks.trailing_tool_call is not None:
            return Grade.scored(checks.trailing_tool_call, debug=["check: ends in a valid tool call (out of turns)"], metrics={"format": 1.0})
    if checks.empty_answer is not None and (final is None or not final.text.strip()):
        return Grade.scored(checks.empty_answer, debug=["check: empty final answer"], metrics={"format": 1.0})
    called = {c.function.name for m in trajectory.messages for c in (m.tool_calls or [])}
    if checks.require_tool_call and not called:
        return Grade.scored(checks.missing_tool_call, debug=["check: answered without calling any tool"], metrics={"format": 1.0})
    missing = [t for t in checks.required_tools if t not in called]
    if missing:
        return Grade.scored(checks.missing_tool_call, debug=[f"check: never called {', '.join(missing)}"], metrics={"format": 1.0})
    return None


def sample_problem(sample: Sample, checks: SampleChecks) -> str | None:
    missing = [k for k in checks.required_references if k not in sample.references]
    if missing:
        return f"sample is not valid: references lack {', '.join(map(repr, missing))}"
    if checks.last_message_user and (not sample.messages or sample.messages[-1].role != "user"):
        return "sample is not valid: the prompt does not end with a user message"
    return None


def group_metrics(rewards: Sequence[float], grades: Sequence[Grade], pass_threshold: float) -> dict[str, float]:
    """Ark-style metrics (the console aggregates each into max / min / mean per step)."""
    metrics: dict[str, float] = {
        "n": float(len(grades)),
        "judge_errors": float(sum(g.status == "error" for g in grades)),
        "invalid": float(sum(g.status == "invalid" for g in grades)),
        "parse_failures": float(sum(g.error_kind in ("parse_failure", "truncated") for g in grades)),
        "preset": float(sum(g.metrics.get("preset", 0.0) for g in grades)),
        "format_checks": float(sum(g.metrics.get("format", 0.0) for g in grades)),
        "judge_calls": float(sum(g.usage.requests for g in grades if g.usage is not None)),
    }
    if rewards:
        mean = sum(rewards) / len(rewards)
        metrics.update(
            reward_mean=mean,
            reward_std=math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)),
            reward_min=min(rewards),
            reward_max=max(rewards),
            pass_rate=sum(r >= pass_threshold for r in rewards) / len(rewards),
            all_equal=float(max(rewards) == min(rewards)),
        )
    if any(g.parts for g in grades):  # a checklist grader: each criterion's mean over the group (criteria.<id>)
        from ._checklist import group_criteria_metrics

        metrics.update(group_criteria_metrics(grades))
    return metrics


class _PolicyValue(BaseModel):
    policy: Policy

    @field_validator("policy")
    @classmethod
    def _range(cls, v: Policy) -> Policy:
        if isinstance(v, float) and not -1.0 <= v <= 1.0:
            raise ValueError(f"a fixed-score policy must lie in [-1, 1], got {v}")
        return v


def _fixed(policy: Policy) -> float:
    assert isinstance(policy, float)
    return policy


def group_grader(
    grader: Grader,
    *,
    checks: TrajectoryChecks | None = None,
    sample_checks: SampleChecks | None = None,
    on_judge_error: Policy = "RETRY",
    on_invalid: Policy = "DISCARD",
    pass_threshold: float = 0.5,
    on_member_error: MemberPolicy = "renormalize",
    min_members: int = 2,
    group_deadline_s: float | None = None,
    member_retries: int = 1,
) -> GroupGrader:
    """Build ``async (sample, trajectories) -> GroupResult``.

    Args:
        grader: grades one trajectory's final answer (``sample`` with the trajectory as response).
        checks: the trajectory checks (seed 000's defaults, except ``require_tool_call``).
        sample_checks: when the sample is unusable (-> DISCARD before any judge call).
        on_judge_error: a trajectory's grade is ``error`` (judge unreachable, refused, unparseable):
            "FAILURE", "RETRY", "DISCARD", or a fixed score in [-1, 1]. RETRY by default: the
            engine retries the sample, then drops it, instead of failing the job.
        on_invalid: a trajectory's grade is ``invalid`` (e.g. the sample lacks a rubric variable).
        pass_threshold: a reward at or above it counts toward ``pass_rate``.
        on_member_error, min_members, group_deadline_s, member_retries: a group with a failed or
            straggling member (graders._members): ``renormalize`` (default) decides the group on
            the members that finished when at least ``min_members`` did; ``drop_group`` fails it;
            ``retry`` re-grades the failed members first. Members still waiting when
            ``group_deadline_s`` passes are failed as ``timeout``.
    """
    traj_checks = checks or TrajectoryChecks()
    usable = sample_checks or SampleChecks()
    error_policy = _PolicyValue(policy=on_judge_error).policy
    invalid_policy = _PolicyValue(policy=on_invalid).policy
    members = GroupPolicy(on_member_error=on_member_error, min_members=min_members, group_deadline_s=group_deadline_s,
                          member_retries=member_retries)

    # A grader whose scores are decided within the group (a reward model's minmax/zscore) grades each
    # member raw (``member``) and maps the finished ones together (``map_group``) once they are in.
    map_group = getattr(grader, "map_group", None)
    grade_member = getattr(grader, "member", grader) if map_group is not None else grader

    async def one(sample: Sample, trajectory: Trajectory, schemas: dict[str, dict[str, Any]] | None) -> Grade:
        decided = check_trajectory(trajectory, traj_checks, schemas)
        if decided is not None:
            return decided
        return await grade_member(sample.with_response(trajectory.messages))

    async def grade_group(sample: Sample, trajectories: Sequence[Trajectory]) -> GroupResult:
        problem = sample_problem(sample, usable)
        if problem is not None:
            return GroupResult(status=GroupStatus.DISCARD, error=problem)
        schemas = _tool_schemas(traj_checks.tools if traj_checks.tools is not None else sample.tools)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = members.group_deadline_s

        def call(t: Trajectory) -> Callable[[], Awaitable[Grade]]:
            return lambda: one(sample, t, schemas)

        grades = await gather_members([call(t) for t in trajectories], deadline, started=started)
        if members.on_member_error == "retry" and not isinstance(error_policy, float):
            for attempt in range(members.member_retries):
                again = [i for i, g in enumerate(grades) if g.status == "error"]
                if not again or (deadline is not None and loop.time() - started >= deadline):
                    break
                retried = await gather_members([call(trajectories[i]) for i in again], deadline, started=started)
                for i, g in zip(again, retried):
                    g.debug.append(f"policy: member {i} re-graded (on_member_error: retry, attempt {attempt + 2})")
                    grades[i] = g
        if map_group is not None:
            grades = map_group(grades)
        timeouts = sum(g.error_kind == "timeout" for g in grades)
        # An invalid trajectory (the sample cannot be graded this way) is decided before a
        # transient error: retrying a sample that can never be graded helps no one.
        for status, policy in (("invalid", invalid_policy), ("error", error_policy)):
            failed = [i for i, g in enumerate(grades) if g.status == status]
            if not failed:
                continue
            if isinstance(policy, float):
                for i in failed:
                    grades[i].debug.append(f"policy: trajectory {i} is {status} -> fixed score {policy:g}")
                continue
            reasons = "; ".join(f"trajectory {i}: {grades[i].error}" for i in failed)
            if status == "error":  # on_member_error decides: the finished members may carry the group
                values = [None if g.status == "error" else (g.score if g.score is not None else _fixed(invalid_policy)) for g in grades]
                decided, failed_members, why = decide(values, members)
                extra = group_decision_metrics(len(grades), failed, timeouts)
                if decided is not None:
                    for i in failed_members:
                        grades[i].debug.append(f"policy: member {i} failed; renormalize: placeholder {decided[i]:g} (the finished members' mean)")
                    finished = [r for i, r in enumerate(decided) if i not in failed_members]
                    return GroupResult(rewards=decided, metrics={**group_metrics(finished, grades, pass_threshold), **extra},
                                       grades=grades, error=reasons, failed_members=failed_members)
                return GroupResult(status=GroupStatus(policy), error=f"{why}: {reasons}",
                                   metrics={**group_metrics([], grades, pass_threshold), **extra}, grades=grades)
            return GroupResult(status=GroupStatus(policy), error=reasons,
                               metrics=group_metrics([], grades, pass_threshold), grades=grades)
        rewards = [g.score if g.score is not None else _fixed(error_policy if g.status == "error" else invalid_policy) for g in grades]
        return GroupResult(rewards=rewards, metrics={**group_metrics(rewards, grades, pass_threshold),
                                                     **group_decision_metrics(len(grades), [], timeouts)}, grades=grades)

    return grade_group
