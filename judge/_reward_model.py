"""Served reward models: the routes a scalar reward model answers on, and how its score is read.

A reward model (Skywork-Reward, a Bradley-Terry head on an LLM) is served by vLLM as a pooling
model and by SGLang as an embedding model; neither has a ``/v1/rewards``. The request and reply
shapes are the servers' own:

=================  ===============================================================================
``/classify``      vLLM (``vllm/entrypoints/pooling/classify/protocol.py``): ``ClassificationChatRequest``
                   ``{model, messages, use_activation}`` (the server applies the model's chat
                   template) -> ``ClassificationResponse`` ``{data: [{index, label, probs,
                   num_classes}], usage}``. verl's reward loop posts ``use_activation: false`` and
                   reads ``data[-1].probs[-1]`` (volcengine/verl 0.9.1
                   ``verl/experimental/reward_loop/reward_loop.py``): the raw logit.
``/pooling``       vLLM (``vllm/entrypoints/pooling/pooling/protocol.py``): ``PoolingChatRequest``
                   ``{model, messages, task?, use_activation}`` -> ``PoolingResponse`` ``{data: [{index,
                   object: "pooling", data: list[float] | list[list[float]]}], usage}``; the score is the
                   last value (of the last token's row for a token-level head).
``/v1/embeddings`` SGLang (``python/sglang/srt/entrypoints/openai/serving_embedding.py``): ``{model,
                   input}`` (text: SGLang applies no chat template here) -> ``{data: [{embedding,
                   index}]}``; verl reads ``data[-1].embedding[-1]``, the reward head's output.
``/v1/classify``   SGLang (``serving_classify.py``): ``{model, input}`` -> ``{data: [{index, label,
                   probs, num_classes}]}`` where ``probs`` is the *softmax* of the head: a one-label
                   reward head always reads 1.0 there, so that reply is refused, never a score.
=================  ===============================================================================

The routes hang off the server's root (vLLM's ``/classify`` is not under ``/v1``): the judge's
``base_url`` (``http://host:8000/v1``) minus its ``/v1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from ._embeddings import RouteReply

RewardRoute = Literal["/classify", "/pooling", "/v1/classify", "/v1/embeddings"]
REWARD_ROUTES: tuple[str, ...] = ("/classify", "/pooling", "/v1/classify", "/v1/embeddings")
CHAT_ROUTES = frozenset({"/classify", "/pooling"})  # vLLM: the conversation as messages; SGLang's take text


class RewardScore(RouteReply):
    """What :meth:`gradekit.judge.Judge.reward_score` returns: the reward model's raw score, or why there is none."""

    value: float | None = None


def server_root(base_url: str) -> str:
    """The server's root from an OpenAI-style base URL: ``http://h:8000/v1`` -> ``http://h:8000``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class NoScore(NamedTuple):
    """Why a reward route's reply holds no score: ``malformed`` (retried as a transient server fault) or not."""

    message: str
    malformed: bool = True


def read_reward(route: str, body: Any) -> float | NoScore:
    """The score in a reward route's reply, or why it holds none.

    A reply without the route's fields is malformed (the caller retries it as transient); the one
    reply that is well formed and still no score, SGLang's ``/v1/classify`` of a one-label head
    (a softmax over one class is always 1.0), says so and is not retried.
    """
    data = body.get("data") if isinstance(body, Mapping) else None
    item = data[-1] if isinstance(data, list) and data and isinstance(data[-1], Mapping) else None
    if item is None:
        return NoScore(f"the {route} reply has no data")
    if route in ("/classify", "/v1/classify"):
        values = item.get("probs")
        if route == "/v1/classify" and isinstance(values, list) and len(values) == 1:
            return NoScore("SGLang's /v1/classify softmaxes the head's output, so a one-label reward head always reads 1.0: "
                           "serve the reward model's score from /v1/embeddings (route: /v1/embeddings)", malformed=False)
    elif route == "/pooling":
        values = item.get("data")
        if isinstance(values, list) and values and isinstance(values[-1], list):
            values = values[-1]  # a token-level head: the last token's row
    else:
        values = item.get("embedding")
    if not isinstance(values, list) or not values or not _number(values[-1]):
        return NoScore(f"the {route} reply's last item holds no finite score")
    return float(values[-1])
