"""The provider's prompt cache: which prefix a request shares with the run, its cache key, and warming it.

A rubric is a long fixed block (the system message) followed by a short row. Providers cache such a
prefix only once a request carrying it has *completed*, and (OpenAI from GPT-5.6 on, Anthropic,
DashScope's explicit cache) bill the write above the input price. A wave of 64 rows sent at once
therefore pays 64 writes and reads nothing back. Warming sends one request per distinct prefix
first and lets the others with that prefix follow once it is answered: one write, the rest reads.

The rule: a prefix is warmed when it is at least the provider's minimum cacheable length (1,024
tokens for OpenAI, DashScope and most Claude models; 2,048 or 4,096 for the Claude models that say
so, :func:`gradekit.judge._native.claude_minimum_tokens`) and the judge sends more than one
request at a time. Below the minimum nothing is cached, so holding the wave would buy nothing; a
judge that sends one request at a time already reads what the request before it wrote. The others
wait at most ``wait_s`` (the judge's request timeout) for the first: a warming request stuck in
retries does not hold the run. A prefix stays warm while it is used (``WARM_FOR_S`` after its last
use, the providers' five-minute cache lifetime). A warming request that fails (no reply) releases the
others at once, and the prefix goes unheld for ``UNHELD_AFTER_FAILURE_S``.

``prompt_cache_key`` (OpenAI, Azure OpenAI): one key per (rubric version, judge), so every request
with this prefix is routed to the same cache instead of spread over machines that each miss.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from ._limiter import estimate_tokens

WARM_FOR_S = 300.0
UNHELD_AFTER_FAILURE_S = 30.0
OPENAI_MINIMUM_TOKENS = 1024
# Hosts documented to take prompt_cache_key (OpenAI's API reference; Azure tells GPT-5.6 users to set it).
_CACHE_KEY_HOSTS = ("api.openai.com", ".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")


def takes_prompt_cache_key(base_url: str) -> bool:
    """Whether the endpoint is one documented to take ``prompt_cache_key`` (sent elsewhere only when asked)."""
    host = (urlsplit(base_url).hostname or "").lower()
    return any(host == h or (h.startswith(".") and host.endswith(h)) for h in _CACHE_KEY_HOSTS)


def prompt_cache_key(fingerprint: str, model: str) -> str:
    """The ``prompt_cache_key`` of a rubric version (its fingerprint) and a judge model."""
    return "gradekit-" + hashlib.sha256(f"{fingerprint}|{model}".encode()).hexdigest()[:24]


# OpenAI from GPT-5.6 on: implicit caching breaks near the latest user message, so a fixed block followed by a
# changing row is cached only at an explicit ``prompt_cache_breakpoint`` (OpenAI's prompt-caching guide).
_BREAKPOINT_MODELS = re.compile(r"^(?:gpt-5\.(?:[6-9]|\d{2,})|gpt-(?:[6-9]|\d{2,}))(?:\b|[-.])", re.IGNORECASE)


def breakpoint_marker(base_url: str, model: str) -> tuple[str, dict[str, str]] | None:
    """The content-part field that marks the end of the shared prefix for this endpoint's explicit cache, with
    its value: DashScope's ``cache_control`` (Alibaba Model Studio's explicit cache), OpenAI's
    ``prompt_cache_breakpoint`` for GPT-5.6 and later; None where the provider caches without one."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host.endswith("aliyuncs.com") or "dashscope" in host:
        return "cache_control", {"type": "ephemeral"}
    if _BREAKPOINT_MODELS.search(model):
        return "prompt_cache_breakpoint", {"mode": "explicit"}
    return None


def mark_shared_prefix(messages: list[dict[str, Any]], field: str, value: Mapping[str, str]) -> list[dict[str, Any]]:
    """``messages`` with the last system message's text as one content part carrying ``field`` (the breakpoint)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") in ("system", "developer")), default=None)
    if last is None:
        return messages
    content = messages[last].get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else [dict(p) for p in content or ()]
    if not parts:
        return messages
    parts[-1] = {**parts[-1], field: dict(value)}
    marked = list(messages)
    marked[last] = {**messages[last], "content": parts}
    return marked


def shared_prefix(request: Mapping[str, Any]) -> tuple[str, int] | None:
    """(key, estimated tokens) of the part of ``request`` every row of its run shares: the output format
    and the system messages before the row. None when the request has no system message."""
    system = [m.get("content") for m in request.get("messages") or () if m.get("role") in ("system", "developer")]
    if not system:
        return None
    fixed = {k: request.get(k) for k in ("model", "response_format", "tools", "tool_choice") if request.get(k) is not None}
    tokens = sum(estimate_tokens(content or "") for content in system)
    digest = hashlib.sha256(repr((sorted(fixed.items(), key=str), system)).encode()).hexdigest()
    return digest, tokens


class Warmer:
    """One judge's prefixes: warm (with the time of last use), or being warmed by a request in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warm: dict[str, float] = {}
        self._warming: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = {}
        # Prefixes whose warming request failed: the requests go unheld for a while, so a broken endpoint or a
        # row the provider refuses does not make the wave wait on one failing request after another.
        self._unheld_until: dict[str, float] = {}
        self.warmed = 0  # prefixes warmed (a request sent ahead of its wave)
        self.held = 0  # requests that waited for a warming request

    @asynccontextmanager
    async def turn(self, key: str | None, wait_s: float) -> AsyncIterator[None]:
        """Send inside this: the first request of a cold prefix goes alone, the others wait for its answer."""
        if key is None:
            yield
            return
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[None] | None = None
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                now = time.monotonic()
                used = self._warm.get(key)
                if used is not None and now - used < WARM_FOR_S:
                    self._warm[key] = now
                    break
                if self._unheld_until.get(key, 0.0) > now:
                    break
                entry = self._warming.get(key)
                if entry is None:
                    mine = loop.create_future()
                    self._warming[key] = (loop, mine)
                    self.warmed += 1
                    break
            their_loop, theirs = entry
            left = deadline - time.monotonic()
            if their_loop is not loop or left <= 0:
                break  # warmed on another event loop, or waited long enough: go unheld
            self.held += 1
            try:
                await asyncio.wait_for(asyncio.shield(theirs), left)
            except asyncio.TimeoutError:
                break
        if mine is None:
            yield
            return
        answered = False
        try:
            yield
            answered = True
        finally:
            with self._lock:
                self._warming.pop(key, None)
                if answered:  # a reply came: the provider has cached the prefix
                    self._warm[key] = time.monotonic()
                else:
                    self._unheld_until[key] = time.monotonic() + UNHELD_AFTER_FAILURE_S
            if not mine.done():
                mine.set_result(None)  # the others look again: warm now, or one of them warms it
