"""OpenRLHF's remote reward model, ``POST /get_reward``: ``{query, prompts, labels}`` -> ``{rewards}``.

The batch is grouped by prompt and each group decided by the config's ``group:`` keys (:mod:`._groups`).
OpenRLHF has no failure field: a judge error is 502 (its client retries a non-2xx five times, then fails
the step), an item that can never be graded 422 naming the field (``labels`` when they are absent).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from .._sample import Message
from ._config import ServerConfig
from ._groups import compute_group, fill_member_failed, prompt_groups
from ._guards import Engine, failed, json_body, parse, reward_route, unprocessable
from ._models import END_TOKENS, RewardRequest, RewardResponse, label_references, reward_metrics, strip_end_tokens

PATH = "/get_reward"


class OpenRLHFRequest(BaseModel):
    """``query`` is prompt + response with the chat template applied; ``prompts`` and ``labels``
    are absent from older clients."""

    model_config = ConfigDict(extra="allow")

    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def split_query(query: str, prompt: str | None, end_tokens: Sequence[str] = END_TOKENS) -> str | None:
    """The response: the query minus its prompt prefix (or what follows the prompt's first
    occurrence, when the decode added a leading token), minus trailing ``end_tokens`` and the
    whitespace between them; None when the prompt is not in it."""
    if prompt:
        if query.startswith(prompt):
            query = query[len(prompt):]
        else:
            at = query.find(prompt)
            if at < 0:
                return None
            query = query[at + len(prompt):]
    return strip_end_tokens(query, end_tokens)


# Chat templates whose turns can be read back: ChatML (Qwen, many others) and Llama 3.
_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\s*|(?=<\|im_start\|>)|\Z)", re.DOTALL)
_LLAMA3 = re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|\Z)", re.DOTALL)


def untemplate(prompt: str) -> list[Message] | str:
    """A templated prompt as chat messages when its template is ChatML or Llama 3 (the empty
    assistant turn the template opens for generation dropped), else the text unchanged, so
    ``{{question}}`` is the user's question rather than the template's markup."""
    for pattern in (_CHATML, _LLAMA3):
        turns = [(role, content.strip()) for role, content in pattern.findall(prompt)]
        if turns:
            if turns[-1][0] == "assistant" and not turns[-1][1]:
                turns.pop()
            if turns and all(role in ("system", "user", "assistant", "tool", "developer") for role, _ in turns):
                return [Message(role=role, content=content) for role, content in turns]
    return prompt


def openrlhf_reply(responses: Sequence[RewardResponse]) -> dict[str, Any]:
    """``rewards`` as scored; ``scores`` the rewards clamped to [0, 1] for dynamic filtering (a
    wrong answer is 0 whether the grader says 0 or -1); ``extra_logs`` the metrics every item has."""
    rewards = [r.score for r in responses]
    metrics = [reward_metrics(r.extra_info) for r in responses]
    shared = [k for k in metrics[0] if all(k in m for m in metrics[1:])] if metrics else []
    return {"rewards": rewards, "scores": [min(1.0, max(0.0, r)) for r in rewards],
            "extra_logs": {k: [m[k] for m in metrics] for k in shared}}


def register(app: FastAPI, engine: Engine, cfg: ServerConfig) -> None:
    """``POST /get_reward`` on the reward server's app."""

    @reward_route(app, PATH)
    async def openrlhf(request: Request) -> tuple[str, Any]:
        batch = parse(OpenRLHFRequest, await json_body(request))
        n = len(batch.query)
        for field in ("prompts", "labels"):
            values = getattr(batch, field)
            if values is not None and len(values) != n:
                raise unprocessable([field], f"has {len(values)} items but query has {n}")
        requests = []
        for i, query in enumerate(batch.query):
            prompt = batch.prompts[i] if batch.prompts is not None else None
            answer = split_query(query, prompt, cfg.openrlhf.end_tokens)
            if answer is None:
                raise unprocessable(["query", i], f"does not contain prompts[{i}], so the response cannot be split off")
            references = label_references(batch.labels[i]) if batch.labels is not None else {}
            # The prompt arrives with the chat template applied: ChatML and Llama 3 are read back into messages.
            requests.append(RewardRequest(prompt=untemplate(prompt) if prompt else None, response=answer, extra_params=references,
                                          metadata={"templated_prompt": prompt} if prompt else None))
        responses: list[RewardResponse] = [None] * n  # type: ignore[list-item]
        groups = prompt_groups(batch.prompts if batch.prompts is not None else [None] * n)
        decided = await asyncio.gather(*(compute_group(engine.compute, [requests[i] for i in g], cfg.group) for g in groups))
        for g, rs in zip(groups, decided):
            for i, r in zip(g, rs):
                responses[i] = r
        responses = fill_member_failed(responses)
        failures = [(f"query[{i}]", r) for i, r in enumerate(responses) if r.status != "success"]
        if failures:
            # An invalid item of a request without labels (or prompts) is explained by that absent field.
            absent = "labels" if batch.labels is None else "prompts" if batch.prompts is None else None
            raise failed(failures, missing=absent)
        return "success", openrlhf_reply(responses)
