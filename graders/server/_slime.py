"""slime/miles' ``--rm-url``, ``POST /slime``: ``remote_rm``'s ``{prompt, response, label}``, one body per sample
(THUDM/slime 624b824 ``slime/rollout/rm_hub/__init__.py``; radixark/miles 31f1ca9
``miles/rollout/rm_hub/__init__.py``).

slime stores ``await resp.json()`` as the sample's reward, so the answer is a bare JSON number. A failed
reward is a non-2xx answer (``resp.raise_for_status()``): slime retries 10 times with backoff, then raises
and the step fails; miles raises at once. slime has no mask on this path, so a failure is never a 200.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from .._sample import Message
from ._config import ServerConfig
from ._guards import Engine, failed, json_body, parse, reward_route
from ._models import RewardRequest, label_references

PATH = "/slime"


class SlimeRequest(BaseModel):
    """``remote_rm``'s payload: ``sample.prompt`` (a string, or chat messages when the dataset keeps
    them), ``sample.response`` and ``sample.label`` (a string or None)."""

    model_config = ConfigDict(extra="allow")

    prompt: str | list[dict[str, Any]] = ""
    response: str
    label: Any = None


def slime_request(body: SlimeRequest) -> RewardRequest:
    """The label as references (a JSON-object label merges, any other is ``label`` and ``answer``)."""
    references = label_references(body.label) if body.label is not None else {}
    prompt: Any = body.prompt
    if isinstance(prompt, list):
        prompt = [Message.model_validate(m) for m in prompt]
    return RewardRequest(prompt=prompt or None, response=body.response, extra_params=references,
                         metadata={k: v for k, v in (body.model_extra or {}).items()} or None)


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /slime`` on the reward server's app."""

    @reward_route(app, PATH)
    async def slime(request: Request) -> tuple[str, Any]:
        parsed = parse(SlimeRequest, await json_body(request))
        response = await engine.compute(slime_request(parsed))
        if response.status != "success":
            raise failed([("", response)], missing="label" if parsed.label is None else None)
        return "success", Response(json.dumps(response.score), media_type="application/json")
