"""Microsoft Foundry's endpoint grader, ``POST /grade``: ``{sample, item, trace_id}`` -> ``{score}``.

Foundry has no failure field: a judge error is 502 (Foundry retries a failed call at most 3 times, then
discards the rollout), a sample that can never be graded 422.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .._sample import EmptyIfNull, Message
from ._config import ServerConfig
from ._guards import Engine, failed, json_body, parse_as, reward_route
from ._models import RewardRequest, RewardResponse, ShapeError, reward_metrics

PATH = "/grade"


class FoundryGradeRequest(BaseModel):
    """Foundry's endpoint grader request: ``sample`` (the model's output: ``output_text``,
    ``output_json``, ``choices``), ``item`` (the whole dataset example, its ``messages`` too) and
    ``trace_id`` (``trace_`` + a UUID, the same for one rollout)."""

    model_config = ConfigDict(extra="allow")

    sample: dict[str, Any]
    item: EmptyIfNull = Field(default_factory=dict)
    trace_id: str | None = None


def _messages_at(value: Any, loc: list[str | int]) -> list[Message]:
    try:
        return TypeAdapter(list[Message]).validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        raise ShapeError([*loc, *err["loc"]], err["msg"]) from None


def foundry_request(body: FoundryGradeRequest) -> RewardRequest:
    """The sample's text is the response (``output_text``, else the last choice's message, else
    ``output_json`` as JSON); the item's ``messages`` are the prompt and its other keys the
    references (``{{item.x}}``); the whole ``sample`` stays in metadata for ``{{sample.output_json.x}}``."""
    sample = body.sample
    text = sample.get("output_text")
    response_messages = None
    if not isinstance(text, str):
        choices = sample.get("choices")
        message = choices[-1].get("message") if isinstance(choices, list) and choices and isinstance(choices[-1], Mapping) else None
        if isinstance(message, Mapping):
            response_messages = _messages_at([{"role": "assistant", **message}], ["sample", "choices", len(choices) - 1, "message"])
            text = response_messages[0].text
        elif sample.get("output_json") is not None:
            text = json.dumps(sample["output_json"], ensure_ascii=False)
        else:
            text = ""
    item = dict(body.item)
    messages = item.pop("messages", None)
    return RewardRequest(response=text, response_messages=response_messages, extra_params=item,
                         messages=_messages_at(messages, ["item", "messages"]) if isinstance(messages, list) else None,
                         metadata={"sample": sample, **({"trace_id": body.trace_id} if body.trace_id else {})})


def foundry_reply(response: RewardResponse) -> dict[str, Any]:
    """``{"score"}``; a checklist grader's criteria also as ``metrics`` (``part.criteria.<id>``, and how many were
    read: ``criteria_read`` of ``criteria_total``), which the exported Bedrock Lambda reports in its ``metrics_list``."""
    reply: dict[str, Any] = {"score": response.score}
    criteria = {k: v for k, v in reward_metrics(response.extra_info).items()
                if k.startswith("part.criteria.") or k in ("criteria_read", "criteria_total")}
    if criteria:
        reply["metrics"] = criteria
    return reply


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /grade`` on the reward server's app."""

    @reward_route(app, PATH)
    async def foundry(request: Request) -> tuple[str, Any]:
        # A message of item.messages or sample.choices that is no chat message is a 422 naming it.
        reward_request = parse_as(FoundryGradeRequest, await json_body(request), foundry_request)
        response = await engine.compute(reward_request)
        if response.status != "success":
            raise failed([("", response)], missing_loc=["sample"])
        return "success", foundry_reply(response)
