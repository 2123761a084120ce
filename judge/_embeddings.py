"""What :meth:`judge.Judge.embed` returns, and the cache key of one text's embedding."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ._cache import cache_key
from ._verdict import ErrorKind


class RouteReply(BaseModel):
    """What a request to a non-chat route returned (embeddings, a reward model's score): ok, or why not."""

    status: Literal["ok", "error"]
    error_kind: ErrorKind | None = None
    error: str | None = None
    prompt_tokens: int = 0
    attempts: int = 0  # requests sent (0: the answer came from the cache)
    latency_s: float = 0.0
    cached: bool = False


class Embeddings(RouteReply):
    """What :meth:`Judge.embed` returns: one vector per text, in order, or why there are none."""

    vectors: list[list[float]] = []


def embedding_key(base_url: str, model: str, text: str) -> str:
    """The cache key of one text's embedding: ``route`` keeps it apart from every chat request's key."""
    return cache_key(base_url, {"route": "embeddings", "model": model, "input": text, "encoding_format": "float"})
