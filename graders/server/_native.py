"""Bailian seed 001's own contract, ``POST /compute_reward``: a RewardRequest in, the computer's RewardResponse out.

A failed reward is the contract's own failure: 200 with ``status: fail`` (the platform retries or drops it).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from ._config import ServerConfig
from ._guards import Engine, json_body, parse, reward_route
from ._models import RewardRequest

PATH = "/compute_reward"


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /compute_reward`` on the reward server's app."""

    @reward_route(app, PATH)
    async def compute_reward(request: Request) -> tuple[str, Any]:
        reward_request = parse(RewardRequest, await json_body(request))
        response = await engine.compute(reward_request)
        return response.status, response.model_dump(mode="json")
