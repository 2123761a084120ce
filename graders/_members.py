"""A group with a failed or straggling member: ``on_member_error``, ``min_members``, ``group_deadline_s``.

GRPO-style trainers compare the n trajectories of a prompt with their group's mean reward. A
member that could not be graded (a judge error that outlived its retries, a verifier timeout,
a member still waiting when the group's deadline passes) has no reward. Three policies:

``renormalize`` (default)
    decide the group on the members that finished, when at least ``min_members`` did. A failed
    member carries the **mean of the finished members** as a placeholder, and each door marks it
    with its trainer's own mask (``mask_sample``, ``None``, ``_ng_failure_class``, ...). Why the
    mean: the trainer computes the baseline over all n rows, masked ones included (NeMo-RL keeps
    masked rows in the advantages; NeMo Gym PR #3351). With the placeholder at the finished
    members' mean, that baseline *is* the finished members' mean, so the advantage of every
    finished member is what it would be in a group of just them (the baseline stays unbiased),
    and the placeholder's own advantage is exactly 0, so even a trainer without a mask learns
    nothing from it. With fewer than ``min_members`` finished the group fails as a whole.
``drop_group``
    any failed member fails the group as a whole (the status ``on_judge_error`` names).
``retry``
    re-grade the failed members (``member_retries`` times, inside the deadline); if one is still
    failed the group fails as a whole: the trainer gets the full group or none of it.

``on_judge_error`` (per member, older) meets these as follows: a fixed score there is the
user's explicit reward for a failed member, which then counts as finished; a status there
(``RETRY``, ``FAILURE``, ``DISCARD``) leaves the member failed, ``on_member_error`` decides the
group, and a group that fails as a whole takes that status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ._sample import Grade

MemberPolicy = Literal["drop_group", "renormalize", "retry"]
CANCEL_GRACE_S = 1.0  # a cancelled member gets this long to unwind; the group never waits on it longer


class GroupPolicy(BaseModel):
    """The group keys of ``type: group`` (and relative) grader nodes."""

    model_config = ConfigDict(extra="forbid")

    on_member_error: MemberPolicy = "renormalize"
    min_members: int = Field(2, ge=1)
    group_deadline_s: float | None = Field(None, gt=0)
    member_retries: int = Field(1, ge=0, le=5)


def timeout_grade(deadline_s: float) -> Grade:
    return Grade.failed("error", f"not graded within group_deadline_s ({deadline_s:g} s)", error_kind="timeout")


R = TypeVar("R")


DEADLINE_CUT = "group_deadline_s"  # the message of the CancelledError of a member cut at the group's deadline


def cut_at_deadline(exc: BaseException) -> bool:
    """Whether ``exc`` is the cancellation of a member cut at its group's deadline (:func:`gather_members`)."""
    return isinstance(exc, asyncio.CancelledError) and DEADLINE_CUT in exc.args


async def gather_members(calls: Sequence[Callable[[], Awaitable[R]]], deadline_s: float | None,
                         *, started: float | None = None, on_timeout: Callable[[float], R] = timeout_grade) -> list[R]:
    """Run every member at once; when the deadline passes, the members still waiting are cancelled
    and failed as ``on_timeout(deadline_s)`` (a ``timeout`` Grade; the server's group routes give
    their response). ``started`` (loop time) lets retries share one deadline."""
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(call()) for call in calls]
    if not tasks:
        return []
    remaining = None if deadline_s is None else max(0.0, deadline_s - (loop.time() - (started if started is not None else loop.time())))
    try:
        _done, pending = await asyncio.wait(tasks, timeout=remaining)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    for t in pending:
        t.cancel(DEADLINE_CUT)  # said in the CancelledError, so a meter counts it as the timeout it is, not a raise
    if pending:
        await asyncio.wait(pending, timeout=CANCEL_GRACE_S)  # bounded: a member that ignores cancellation is left behind
    results: list[R] = []
    for t in tasks:
        if t in pending:
            results.append(on_timeout(deadline_s or 0.0))
            continue
        exc = t.exception()
        if exc is not None:  # a grader that raised (a bug, not a judge error): nothing of the group is kept running
            for other in tasks:
                other.cancel()
            raise exc
        results.append(t.result())
    return results


def is_failed(grade: Grade) -> bool:
    return grade.status == "error"


def placeholder(rewards: Sequence[float | None]) -> float:
    finished = [r for r in rewards if r is not None]
    return sum(finished) / len(finished) if finished else 0.0


def decide(rewards: Sequence[float | None], policy: GroupPolicy) -> tuple[list[float] | None, list[int], str]:
    """``rewards[i]`` is None for a failed member. Returns (the rewards to send, the failed members'
    indices, why the group failed); rewards is None when the group fails as a whole."""
    failed = [i for i, r in enumerate(rewards) if r is None]
    if not failed:
        return [float(r) for r in rewards if r is not None], [], ""
    n, finished = len(rewards), len(rewards) - len(failed)
    if policy.on_member_error in ("drop_group", "retry"):
        return None, failed, f"{len(failed)} of {n} members failed (on_member_error: {policy.on_member_error})"
    needed = min(policy.min_members, n)
    if finished < needed:
        return None, failed, f"only {finished} of {n} members finished, fewer than min_members ({policy.min_members})"
    mean = placeholder(rewards)
    return [mean if r is None else float(r) for r in rewards], failed, ""


def group_decision_metrics(n: int, failed: Sequence[int], timeouts: int) -> dict[str, float]:
    return {"members_failed": float(len(failed)), "members_finished": float(n - len(failed)), "member_timeouts": float(timeouts)}
