"""Counting a prompt's tokens to fit it into a judge's context window, without a network.

A trajectory is fitted into a window, so an estimate that counts short costs a refused request.
:func:`token_counter` gives the model's own tokenizer where one is known and usable offline
(tiktoken, whose encodings are downloaded on first use: used only when the encoding is already in
tiktoken's cache, never fetched here), and otherwise a conservative estimate that counts more
tokens than real tokenizers do (one per CJK character, one per three other characters). What a
provider later says it counted (a context-length refusal, a reply's usage) corrects either one
through ``scale`` (:mod:`gradekit.judge._window`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

# Runs of CJK characters: one match per run, not per character (a Chinese prompt is a few long runs).
_CJK_RUNS = re.compile(r"[\u3000-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]+")
_ENCODINGS_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"  # where tiktoken fetches them from
# Tokens a chat message costs beyond its text (role, separators): OpenAI's cookbook counts 3-4.
MESSAGE_OVERHEAD = 4


def estimate(text: str) -> int:
    """A conservative token count: one per CJK character, one per three other characters.

    Real tokenizers give about four English characters a token and fewer for code and JSON; three
    keeps an estimate from coming in short of what the provider counts, which would cost a refusal.
    """
    if text.isascii():
        return math.ceil(len(text) / 3)
    cjk = cjk_characters(text)
    return cjk + math.ceil((len(text) - cjk) / 3)


@functools.lru_cache(maxsize=256)
def cjk_characters(text: str) -> int:
    """How many characters of ``text`` are CJK (each a token on its own in every estimate); the same text (a rubric's
    system prompt, every row) is counted once."""
    return sum(map(len, _CJK_RUNS.findall(text)))


@dataclass(frozen=True)
class TokenCounter:
    """Counts tokens of text for one model: ``source`` says how (``tiktoken:<encoding>`` or ``estimate``)."""

    source: str
    _encode: Any = None  # tiktoken's Encoding.encode_ordinary, when the encoding is usable offline

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._encode is None:
            return estimate(text)
        return len(self._encode(text))


ESTIMATE = TokenCounter("estimate")


def _tiktoken_cached(encoding: str) -> bool:
    """Whether tiktoken would read ``encoding`` from its cache rather than download it (tiktoken.load's rule)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        folder = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        folder = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        folder = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not folder:
        return False  # caching switched off: every use downloads
    key = hashlib.sha1(_ENCODINGS_URL.format(encoding).encode()).hexdigest()
    return os.path.exists(os.path.join(folder, key))


@functools.lru_cache(maxsize=32)
def token_counter(model: str) -> TokenCounter:
    """The best offline counter for ``model``: its tiktoken encoding when installed and cached, else the estimate.

    Never downloads: a missing encoding, tiktoken not installed (``pip install 'gradekit[tiktoken]'``)
    or a model tiktoken does not know all fall back to :func:`estimate`.
    """
    try:
        import tiktoken
    except ImportError:
        return ESTIMATE
    name = model.rsplit("/", 1)[-1]  # a provider prefix ("openai/gpt-4o") is not part of the model's name
    try:
        encoding = tiktoken.encoding_name_for_model(name)
    except KeyError:
        return ESTIMATE
    if not _tiktoken_cached(encoding):
        return ESTIMATE
    try:
        encoder = tiktoken.get_encoding(encoding)
    except Exception:  # noqa: BLE001 - a damaged cache entry: the estimate, never a download or a crash
        return ESTIMATE
    return TokenCounter(f"tiktoken:{encoding}", encoder.encode_ordinary)
