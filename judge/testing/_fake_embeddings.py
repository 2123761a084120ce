"""The fake provider's ``POST /v1/embeddings``: deterministic vectors that behave like embeddings.

A text's vector is a hashed bag of its words: every lower-cased word adds +1 or -1 (its hash
decides) at a position its hash picks, and the sum is scaled to unit length, as OpenAI's
vectors are. Texts that share words therefore get a higher cosine than texts that do not, the
same text always gets the same vector, and no model is needed. Requests pass the provider's
recording, rate limit, script and responder like chat requests (see ``FakeProvider``).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from typing import Any

EMBEDDING_DIMENSIONS = 256
_WORD = re.compile(r"\w+")


def embedding_vector(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """The fake's unit-length vector for ``text`` (all zeros when it has no word)."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        position = int.from_bytes(digest[:4], "little") % dimensions
        vector[position] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


def embedding_inputs(body: dict[str, Any]) -> list[str] | str:
    """The request's texts, or the message of the 400 OpenAI gives for an input it rejects.

    ``input`` is a string, a list of strings, or token ids (a list of ints, or a list of such
    lists; their ids are hashed as words). An empty string or an empty list is refused.
    """
    given = body.get("input")
    if isinstance(given, str) or (isinstance(given, list) and given and all(isinstance(x, int) for x in given)):
        given = [given]
    if not isinstance(given, list) or not given:
        return "'$.input' is invalid: give a string or a non-empty list of strings."
    texts = []
    for item in given:
        if isinstance(item, list) and item and all(isinstance(x, int) and not isinstance(x, bool) for x in item):
            item = " ".join(f"t{x}" for x in item)
        if not isinstance(item, str) or not item:
            return "'$.input' is invalid: each input must be a non-empty string (or a non-empty list of token ids)."
        texts.append(item)
    return texts


def embeddings_payload(body: dict[str, Any], texts: list[str], *, model: str) -> dict[str, Any]:
    """The ``list`` object of embeddings for ``texts``: ``dimensions`` and ``encoding_format`` honoured."""
    dimensions = body.get("dimensions")
    size = dimensions if isinstance(dimensions, int) and dimensions > 0 else EMBEDDING_DIMENSIONS
    as_base64 = body.get("encoding_format") == "base64"  # the openai SDK's default; it decodes float32 little-endian
    data = []
    for index, text in enumerate(texts):
        vector: Any = embedding_vector(text, size)
        if as_base64:
            vector = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(max(1, len(text) // 4) for text in texts)
    return {"object": "list", "data": data, "model": body.get("model") or model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
