"""What :meth:`judge.Judge.embed` returns, and the cache key of one text's embedding."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ._cache import cache_key
from ._verdict import ErrorKind


class Embeddings(BaseModel):
    """What :meth:`Judge.embed` returns: one vector per text, in order, or why there are none."""

    status: Literal["ok", "error"]
    vectors: list[list[float]] = []
    error_kind: ErrorKind | None = None
    error: str | None = None
    prompt_tokens: int = 0
    attempts: int = 0  # requests sent (0: every text came from the cache)
    latency_s: float = 0.0
    cached: bool = False


def embedding_key(base_url: str, model: str, text: str) -> str:
    """The cache key of one text's embedding: ``route`` keeps it apart from every chat request's key."""
    return cache_key(base_url, {"route": "embeddings", "model": model, "input": text, "encoding_format": "float"})
