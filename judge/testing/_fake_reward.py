"""The fake provider as a served reward model: vLLM's ``POST /classify`` and ``POST /pooling``, SGLang's
``POST /v1/classify`` and ``POST /v1/embeddings``, with the request and reply shapes of their source.

=================  ===============================================================================
``/classify``      vLLM ``vllm/entrypoints/pooling/classify/protocol.py``: a ``ClassificationChatRequest``
                   (``messages``, which the server renders with the model's chat template) or a
                   ``ClassificationCompletionRequest`` (``input``); ``use_activation`` (default true:
                   sigmoid for one label, softmax for several; false: the raw logits). Reply
                   ``{id: "classify-...", object: "list", created, model, data: [{index, label, probs,
                   num_classes}], usage}``.
``/pooling``       vLLM ``vllm/entrypoints/pooling/pooling/protocol.py``: the same inputs, ``task`` and
                   ``use_activation``; reply ``{id: "pool-...", object: "list", created, model, data:
                   [{index, object: "pooling", data: [floats]}], usage}`` (``task: token_classify``: one
                   row per token).
``/v1/classify``   SGLang ``serving_classify.py``: ``input`` (text or token ids; no messages); reply as
                   vLLM's, ``probs`` the softmax of the head (a one-label head reads ``[1.0]``).
``/v1/embeddings`` SGLang ``serving_embedding.py`` serving a reward model: ``input`` text; reply
                   ``{data: [{embedding: <the head's outputs>, index, object}], model, object, usage}``.
=================  ===============================================================================

The score comes from the provider's ``reward_model`` function, given the text the model would read
(the conversation as ``role: content`` lines, the fake's stand-in for a chat template, or the
``input`` as sent) and returning the head's outputs (one float, or a list for several labels).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

REWARD_PATHS = ("/classify", "/pooling", "/v1/classify", "/v1/embeddings")
RewardFn = Callable[[str], "float | list[float]"]


def reward_text(route: str, body: dict[str, Any]) -> str:
    """The text the model reads, or raises ValueError with the 400 the server would give."""
    messages, given = body.get("messages"), body.get("input")
    if route in ("/v1/classify", "/v1/embeddings"):
        if messages is not None:
            raise ValueError(f"{route} takes input (text or token ids); it has no messages field")
    elif messages is not None:
        if given is not None:
            raise ValueError("give messages or input, not both")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ValueError("messages must be a non-empty list of chat messages with a role")
        return "\n".join(f"{m['role']}: {_content(m.get('content'))}" for m in messages)
    if isinstance(given, str) and given.strip():
        return given
    if isinstance(given, list) and given and all(isinstance(x, int) and not isinstance(x, bool) for x in given):
        return " ".join(f"t{x}" for x in given)
    raise ValueError("Input cannot be empty")


def _content(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    exps = [math.exp(x - top) for x in xs]
    return [e / sum(exps) for e in exps]


def reward_payload(route: str, body: dict[str, Any], logits: float | list[float], *, model: str, text: str) -> dict[str, Any]:
    """The route's reply for a head whose outputs are ``logits``."""
    head = [float(logits)] if isinstance(logits, (int, float)) else [float(x) for x in logits]
    tokens = max(1, len(text) // 4)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None}
    name = body.get("model") or model
    created = int(time.time())
    if route == "/v1/embeddings":
        return {"data": [{"embedding": head, "index": 0, "object": "embedding"}], "model": name, "object": "list",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if route == "/pooling":
        activation = body.get("use_activation")
        values = head if activation is False else ([_sigmoid(head[0])] if len(head) == 1 else _softmax(head))
        rows: Any = [values] * tokens if body.get("task") == "token_classify" else values
        return {"id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": created, "model": name,
                "data": [{"index": 0, "object": "pooling", "data": rows}], "usage": usage}
    if route == "/v1/classify":
        probs = _softmax(head)  # SGLang: always a softmax, whatever the head
    elif body.get("use_activation") is False:
        probs = head
    else:
        probs = [_sigmoid(head[0])] if len(head) == 1 else _softmax(head)
    label = f"LABEL_{max(range(len(head)), key=head.__getitem__)}"
    return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": created, "model": name,
            "data": [{"index": 0, "label": label, "probs": probs, "num_classes": len(probs)}], "usage": usage}
