"""The server's group routes (DashScope ``group_reward``, OpenRLHF's batch grouped by prompt) under
the group keys: ``on_member_error``, ``min_members``, ``group_deadline_s`` (graders._members).

A member's request is one ``compute_reward``. Members still waiting at the deadline are cancelled
and failed as ``timeout``; ``retry`` computes the failed ones again inside the deadline; then
``renormalize`` gives a failed member the finished members' mean as a placeholder (success,
``extra_info.member_failed = 1``) when at least ``min_members`` finished. A group that fails as a
whole keeps its failed responses, so each route answers its contract's failure as before.
An invalid member (it can never be graded) is not renormalized: its route refuses it by name.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence

from .._members import GroupPolicy, decide, gather_members
from ._models import RewardRequest, RewardResponse


def _timeout(deadline_s: float) -> RewardResponse:
    return RewardResponse(status="fail", detail=f"not graded within group_deadline_s ({deadline_s:g} s)",
                          extra_info={"grade_status": "error", "error_kind": "timeout"})


def _failed(response: RewardResponse) -> bool:
    return response.status != "success" and response.extra_info.get("grade_status") != "invalid"


async def _run(compute: Callable[[RewardRequest], Awaitable[RewardResponse]], requests: Sequence[RewardRequest],
               deadline_s: float | None, started: float) -> list[RewardResponse]:
    return await gather_members([functools.partial(compute, r) for r in requests], deadline_s, started=started, on_timeout=_timeout)


async def compute_group(compute: Callable[[RewardRequest], Awaitable[RewardResponse]], requests: Sequence[RewardRequest],
                        policy: GroupPolicy) -> list[RewardResponse]:
    """Every member's response, in order: placeholders where ``renormalize`` carried the group; the
    failed responses unchanged where the group failed as a whole."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    responses = await _run(compute, requests, policy.group_deadline_s, started)
    if policy.on_member_error == "retry":
        for _ in range(policy.member_retries):
            again = [i for i, r in enumerate(responses) if _failed(r)]
            if not again or (policy.group_deadline_s is not None and loop.time() - started >= policy.group_deadline_s):
                break
            for i, r in zip(again, await _run(compute, [requests[i] for i in again], policy.group_deadline_s, started)):
                responses[i] = r
    if any(r.status != "success" and not _failed(r) for r in responses):
        return responses  # an invalid member: the route refuses the group, naming it
    values = [None if _failed(r) else r.score for r in responses]
    decided, failed, _why = decide(values, policy)
    if decided is None or not failed:
        return responses
    out = []
    for i, r in enumerate(responses):
        info = {**r.extra_info, "member_failed": 1.0 if i in failed else 0.0}
        if i in failed:
            out.append(RewardResponse(score=decided[i], status="success", extra_info=info,
                                      detail=f"placeholder (on_member_error: renormalize, the finished members' mean): {r.detail}"))
        else:
            out.append(r.model_copy(update={"extra_info": info}))
    return out


def fill_member_failed(responses: list[RewardResponse]) -> list[RewardResponse]:
    """When any member of a batch is a placeholder, every item says whether it is one (one full log column)."""
    if not any("member_failed" in r.extra_info for r in responses):
        return responses
    return [r if "member_failed" in r.extra_info else r.model_copy(update={"extra_info": {**r.extra_info, "member_failed": 0.0}})
            for r in responses]


def prompt_groups(prompts: Sequence[str | None]) -> list[list[int]]:
    """Indices of a batch grouped by identical prompt (OpenRLHF sends a prompt's samples together)."""
    groups: dict[str | None, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt if prompt is not None else f"\x00{i}", []).append(i)
    return list(groups.values())
