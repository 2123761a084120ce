"""Vertex AI's Cloud Run reward, ``POST /``: ``{example, response, metadata}`` -> ``{reward}``, clipped to [-1, 1].

Vertex has no failure field: a judge error is 502 (retried), a sample that can never be graded 422.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from .._sample import sample_from_vertex
from ._config import ServerConfig
from ._guards import Engine, failed, json_body, parse_as, reward_route
from ._models import RewardRequest, RewardResponse, ShapeError

PATH = "/"


class VertexExample(BaseModel):
    """A ReinforcementTuningExample (camelCase ProtoJSON); only its shape is checked here."""

    model_config = ConfigDict(extra="allow")

    contents: list[dict[str, Any]] = Field(default_factory=list)
    systemInstruction: dict[str, Any] | None = None
    references: dict[str, Any] = Field(default_factory=dict)


class VertexContent(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str | None = None
    parts: list[dict[str, Any]]


class VertexRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    example: VertexExample
    response: VertexContent
    metadata: dict[str, Any] = Field(default_factory=dict)


def vertex_reply(response: RewardResponse) -> dict[str, Any]:
    """``{reward, user_requested_aux_info}``; the reward clipped to [-1, 1] as Vertex does."""
    reply: dict[str, Any] = {"reward": min(1.0, max(-1.0, response.score))}
    if response.extra_info:
        reply["user_requested_aux_info"] = json.dumps(response.extra_info, ensure_ascii=False, default=str)
    return reply


def vertex_request(body: dict[str, Any], parsed: VertexRequest) -> RewardRequest:
    """The reward request of a Vertex body (read as sent: ``parsed`` only checked its shape); an example that
    is no sample is a :class:`ShapeError` at ``example``."""
    try:
        sample = sample_from_vertex(body["example"], body["response"])
    except ValueError as e:
        raise ShapeError(["example"], str(e)) from None
    return RewardRequest(messages=sample.messages, response=sample.response_text, response_messages=sample.response or None,
                         extra_params=sample.references, metadata={**sample.metadata, **parsed.metadata})


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /`` on the reward server's app."""

    @reward_route(app, PATH)
    async def vertex(request: Request) -> tuple[str, Any]:
        body = await json_body(request)
        reward_request = parse_as(VertexRequest, body, lambda parsed: vertex_request(body, parsed))
        response = await engine.compute(reward_request)
        if response.status != "success":
            raise failed([("", response)])
        return "success", vertex_reply(response)
