"""DashScope's reward processor (2b), ``POST /api/v1``: func_type ``reward`` (one agent output) or ``group_reward``
(a group, decided by the config's ``group:`` keys when a member fails, :mod:`._groups`).

A failed reward is 200 ``status: failed`` with the error, and a failed group carries no rewards at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from .._sample import Message
from ..platforms._common import reference_dict
from ._config import ServerConfig
from ._groups import compute_group
from ._guards import Engine, json_body, parse, reward_route, unprocessable
from ._models import RewardRequest, RewardResponse, reward_metrics

PATH = "/api/v1"


class AgentOutput(BaseModel):
    """One rollout: the full conversation (its last assistant message is the answer) and extras."""

    model_config = ConfigDict(extra="allow")

    messages: list[Message] | None = None
    rollout_extra: dict[str, Any] | None = None
    rollout_metrics: dict[str, float] | None = None
    reward_score: float | None = None


class DashScopeRewardInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    func_type: Literal["reward"] = "reward"
    ground_truth: Any = None
    request_metadata: dict[str, Any] | None = None
    agent_output: AgentOutput


class DashScopeGroupRewardInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    func_type: Literal["group_reward"] = "group_reward"
    ground_truth: Any = None
    request_metadata: dict[str, Any] | None = None
    agent_outputs: list[AgentOutput]


def dashscope_request(output: AgentOutput, ground_truth: Any, request_metadata: Mapping[str, Any] | None) -> RewardRequest:
    """The last assistant message is the response, the messages before it the prompt; messages
    after it (none in a finished rollout) are not graded. ``rollout_extra`` and ``ground_truth``
    become references (the ground truth wins a clash); ``reward_score`` and metrics, metadata."""
    messages = list(output.messages or [])
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    prompt, answer = (messages, None) if last is None else (messages[:last], messages[last])
    references: dict[str, Any] = dict(output.rollout_extra or {})
    references.update(reference_dict(ground_truth, "ground_truth"))  # a dict merges; a value is also `answer`
    metadata: dict[str, Any] = {"reward_score": output.reward_score, "rollout_metrics": dict(output.rollout_metrics or {})}
    if request_metadata:
        metadata["request_metadata"] = dict(request_metadata)
    return RewardRequest(messages=prompt, response=answer.text if answer is not None else "",
                         response_messages=[answer] if answer is not None else None, extra_params=references, metadata=metadata)


def dashscope_reward(response: RewardResponse) -> dict[str, Any]:
    """RewardOutput: success -> the score and metrics; fail -> ``failed`` with the error.

    DashScope's ``Reward.reward_score`` is a required number, so a failed output carries 0.0 there;
    the platform reads ``status`` first (a failed output is retried or dropped, never trained on).
    """
    if response.status == "success":
        metrics = reward_metrics(response.extra_info)
        return {"reward": {"reward_score": response.score, "reward_metrics": metrics or None}, "status": "success", "error": None}
    return {"reward": {"reward_score": 0.0, "reward_metrics": None}, "status": "failed", "error": response.detail or "reward failed"}


def dashscope_group_reward(responses: Sequence[RewardResponse]) -> dict[str, Any]:
    """GroupRewardOutput: one reward per agent output, in order, or ``failed`` with no rewards at all
    (a partial list would be misaligned with agent_outputs, and zeros would be made-up rewards)."""
    failed = [(i, r) for i, r in enumerate(responses) if r.status != "success"]
    if failed:
        error = "; ".join(f"agent_outputs[{i}]: {r.detail or 'reward failed'}" for i, r in failed)
        return {"reward": {"rewards": []}, "status": "failed", "error": error}
    rewards = [dashscope_reward(r)["reward"] for r in responses]
    return {"reward": {"rewards": rewards}, "status": "success", "error": None}


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /api/v1`` on the reward server's app."""

    @reward_route(app, PATH)
    async def dashscope(request: Request) -> tuple[str, Any]:
        body = await json_body(request)
        kind = body.get("func_type") if isinstance(body, dict) else None
        if kind is None and isinstance(body, dict) and "agent_outputs" in body:
            kind = "group_reward"
        if kind in (None, "reward"):
            single = parse(DashScopeRewardInput, body)
            response = await engine.compute(dashscope_request(single.agent_output, single.ground_truth, single.request_metadata))
            out = dashscope_reward(response)
        elif kind == "group_reward":
            group = parse(DashScopeGroupRewardInput, body)
            requests = [dashscope_request(o, group.ground_truth, group.request_metadata) for o in group.agent_outputs]
            responses = await compute_group(engine.compute, requests, cfg.group)
            out = dashscope_group_reward(responses)
        else:
            raise unprocessable(["func_type"], f"func_type {kind!r} is not served here; gradekit serves 'reward' and 'group_reward'",
                                "literal_error")
        return out["status"], out
