"""NeMo Gym's resource server, ``POST /verify``: ``BaseVerifyRequest`` -> ``BaseVerifyResponse`` (NVIDIA-NeMo/Gym
07d6b0d ``nemo_gym/base_resources_server.py``): ``{responses_create_params, response, ...}`` (the dataset
row's fields beside them) -> the request echoed plus ``reward``.

A judge failure is Gym's own ``judge_failsafe`` row (``nemo_gym/judge.py``): 200, ``reward: 0.0`` beside
``_ng_failure_class: "judge_failed"`` and ``_ng_failure_judge_error``, which rollout collection routes to
``<output>_failures.jsonl`` (excluded from metrics, retried on resume); plus ``mask_sample: true`` at the
top (Gym's ``MASK_SAMPLE_KEY``) and in ``instance_config`` (where NeMo-RL 7ea279a
``nemo_rl/experience/rollouts.py`` ``_extract_mask_sample_flags`` reads it), so NeMo-RL drops it from the
loss. A timeout is ``transient``; a sample that can never be graded is ``skipped`` with
``_ng_failure_terminal: true`` (never retried); an exception in the reward computer is ``reward_failed``.

Every failure on ``/verify`` is such a 200 row, a hung or slow judge and a full server included: Gym's
simple agent calls ``raise_for_status`` on the verify reply (NVIDIA-NeMo/Gym 07d6b0d
``responses_api_agents/simple_agent/app.py``), its ``/run`` then fails, and rollout collection
re-raises it (``nemo_gym/rollout_collection.py`` ``_post_subroutine``): one 504 would stop the
whole collection. So the route grades under its own deadline, :func:`verify_deadline_s`, which
ends before ``server.request_timeout_s`` always; a row not graded by then is ``transient``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from .._sample import Message
from ._config import ServerConfig
from ._guards import Engine, json_body, parse_as, reward_route
from ._models import RewardRequest, RewardResponse, ShapeError

PATH = "/verify"
NG_FAILURE_CLASS_KEY = "_ng_failure_class"  # nemo_gym.rollout_collection.NG_FAILURE_CLASS_KEY
NG_TERMINAL_KEY = "_ng_failure_terminal"
MASK_SAMPLE_KEY = "mask_sample"  # nemo_gym.token_id_capture.delivery.MASK_SAMPLE_KEY; NeMo-RL reads instance_config.mask_sample
VERIFY_MARGIN_S = 5.0  # what a /verify row keeps between its own deadline and server.request_timeout_s (at most)

logger = logging.getLogger("gradekit.server")


def verify_deadline_s(request_timeout_s: float) -> float:
    """How long ``/verify`` grades one row: ``server.request_timeout_s`` less a margin (5 s, or a tenth
    of a shorter timeout), so the failure row is written and sent before the server's 504 could be."""
    return request_timeout_s - min(VERIFY_MARGIN_S, request_timeout_s / 10)


class VerifyRequest(BaseModel):
    """Gym's ``BaseVerifyRequest``: the Responses-API create params, the policy's Response, and the
    dataset row's own fields (``question``, ``expected_answer``, ...) beside them."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any]
    response: dict[str, Any]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict)
                       and part.get("type") in ("input_text", "output_text", "text"))
    return ""


def verify_messages(params: dict[str, Any]) -> list[Message]:
    """``responses_create_params``: ``instructions`` (the system prompt) and ``input`` (a string, or
    message items with string or part-list content) as chat messages."""
    messages: list[Message] = []
    if params.get("instructions"):
        messages.append(Message(role="system", content=str(params["instructions"])))
    items = params.get("input")
    if isinstance(items, str):
        return [*messages, Message(role="user", content=items)]
    if items is not None and not isinstance(items, list):  # the Responses API's input: a string or a list of items
        raise ShapeError(["responses_create_params", "input"],
                         f"input must be a string or a list of input items, not {type(items).__name__}")
    for item in items or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue  # function calls/outputs of earlier turns: the judge reads the conversation's text
        role = item.get("role", "user")
        messages.append(Message(role="system" if role == "developer" else role, content=_text(item.get("content"))))
    return messages


def verify_response_messages(response: dict[str, Any]) -> list[Message]:
    """The Response's ``output``: assistant messages (``output_text`` parts), function calls as tool
    calls and their ``function_call_output`` items as tool results (a multi-turn rollout's trajectory);
    reasoning items are left out (a verdict never reads the policy's thinking)."""
    out: list[Message] = []
    output = response.get("output")
    if output is not None and not isinstance(output, list):
        raise ShapeError(["response", "output"], f"output must be a list of output items, not {type(output).__name__}")
    for item in output or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            out.append(Message(role="assistant", content=_text(item.get("content"))))
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id") or "call", "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or ""}}
            out.append(Message(role="assistant", content="", tool_calls=[call]))
        elif kind == "function_call_output":  # a multi-turn rollout's tool result: the trajectory a rubric reads
            output = item.get("output")
            out.append(Message(role="tool", tool_call_id=item.get("call_id"), content=output if isinstance(output, str) else _text(output)))
    return out


def verify_request(body: VerifyRequest) -> RewardRequest:
    """The row's other fields become references (``expected_answer`` is also ``answer``)."""
    row = dict(body.model_extra or {})
    references = {k: v for k, v in row.items() if not k.startswith("_ng_") and k != "instance_config"}
    if "expected_answer" in references and "answer" not in references:
        references["answer"] = references["expected_answer"]
    answer = verify_response_messages(body.response)
    text = "\n".join(m.text for m in answer if m.text and m.role == "assistant")
    return RewardRequest(messages=verify_messages(body.responses_create_params), response=text,
                         response_messages=answer or None, extra_params=references,
                         metadata={"response_id": body.response.get("id")} if body.response.get("id") else None)


def verify_reply(raw: dict[str, Any], response: RewardResponse) -> dict[str, Any]:
    """``BaseVerifyResponse``: the request as sent plus ``reward``; a failure is Gym's failsafe row."""
    out = dict(raw)
    if response.status == "success":
        out["reward"] = response.score
        for key, value in response.extra_info.get("metrics", {}).items() if isinstance(response.extra_info.get("metrics"), dict) else ():
            out.setdefault(f"gradekit_{key}", value)
        if response.extra_info.get("member_failed"):
            out[MASK_SAMPLE_KEY] = True
        return out
    kind = response.extra_info.get("error_kind")
    invalid = response.extra_info.get("grade_status") == "invalid"
    failure = ("skipped" if invalid else "transient" if kind == "timeout" else "reward_failed" if kind == "reward_exception"
               else "judge_failed")
    out.update({"reward": 0.0, NG_FAILURE_CLASS_KEY: failure, "_ng_failure_judge_error": response.detail or "reward failed",
                MASK_SAMPLE_KEY: True})
    config = raw.get("instance_config")
    if config is None or isinstance(config, dict):  # anything else is the row's own, echoed as sent: the top-level mark stands
        out["instance_config"] = {**(config or {}), MASK_SAMPLE_KEY: True}
    if invalid:
        out[NG_TERMINAL_KEY] = True
    return out


def verify_busy_reply(body: bytes) -> Response | None:
    """A full server's answer on ``/verify``: the request's own failure row (``transient``, retried on
    resume) rather than 503, which Gym's collection would re-raise; a body that is no JSON object keeps the 503."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    busy = RewardResponse(status="fail", detail="the reward server is busy (thread_pool.max_workers + queue_size in flight)",
                          extra_info={"grade_status": "error", "error_kind": "timeout"})
    return JSONResponse(verify_reply(raw, busy))


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /verify`` on the reward server's app."""

    @reward_route(app, PATH)
    async def verify(request: Request) -> tuple[str, Any]:
        raw = await json_body(request)
        reward_request = parse_as(VerifyRequest, raw, verify_request)  # a field of the wrong type: a 422 naming it
        limit = request.app.state.config.server.request_timeout_s
        deadline = verify_deadline_s(limit)
        try:
            response = await asyncio.wait_for(engine.compute(reward_request), deadline)
        except asyncio.TimeoutError:
            response = RewardResponse(status="fail", extra_info={"grade_status": "error", "error_kind": "timeout"},
                                      detail=f"not graded within {deadline:g} s (server.request_timeout_s {limit:g} s less "
                                             "the margin that lets this row reach Gym before a 504 could)")
        except Exception as e:  # a bug in a reward class: still a row, since a 500 would stop Gym's collection
            logger.exception("POST /verify: the reward computer raised")
            response = RewardResponse(status="fail", detail=f"{type(e).__name__}: {e}",
                                      extra_info={"grade_status": "error", "error_kind": "reward_exception"})
        return response.status, verify_reply(raw, response)
