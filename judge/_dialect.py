"""What one (endpoint, model) accepts, learnt from its 400s once per process and applied below the Judge.

Reasoning models refuse parameters a 2024 chat model took (OpenAI's o-series and gpt-5:
``temperature`` other than 1, ``max_tokens``, ``logprobs``; DeepSeek's reasoner: ``logprobs``),
and DashScope's qwen3 thinking models refuse non-streaming calls. Such a 400 says nothing about
the row: the request is fixed (a parameter dropped or renamed, or the call streamed), the fix is
remembered for every later request of the process, and the row is asked again. A parameter the
user set explicitly is never dropped silently: the row fails with a message naming it.

The first request of an endpoint goes alone (:class:`Gate`): the others wait for its answer (at
most ``LEARN_WAIT_S``), so a concurrent run learns each fix from one 400, not one per request in
flight.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The output-format parameters: a 400 naming one of them is for the json_schema -> tool ->
# json_object -> tags chain, never a parameter to drop.
FORMAT_PARAMS = frozenset({"response_format", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"})
_NEVER_DROPPED = frozenset({"model", "messages", "stream", "stream_options"}) | FORMAT_PARAMS
# A reasoning model's max_completion_tokens counts its thinking too; renaming a chat rubric's
# max_tokens (50 for llmbar_pairwise) into it would cut every reply off mid-thought.
RENAMES = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}
_TOGETHER = {"logprobs": ("logprobs", "top_logprobs"), "top_logprobs": ("logprobs", "top_logprobs")}
_REFUSED_WORDS = re.compile(r"unsupported|not supported|does not support|doesn't support|not allowed|is not available|"
                            r"unrecognized|unknown parameter|extra inputs are not permitted|only .* default", re.IGNORECASE)
# DashScope (qwen3 thinking, QwQ): "parameter.enable_thinking must be set to false for non-streaming
# calls"; "This model only support stream mode, please enable the stream parameter".
# OpenAI's o1-mini and o1-preview: "Unsupported value: 'messages[0].role' does not support 'system' with this model."
# (param messages[0].role, code unsupported_value).
_SYSTEM_REFUSED = re.compile(r"messages\[\d+\]\.role|system (?:message|role|prompt)s? (?:is|are) not supported", re.IGNORECASE)
_NEEDS_STREAM = re.compile(r"non-streaming|only supports? stream|stream mode|enable the stream parameter", re.IGNORECASE)


@dataclass(frozen=True)
class Fix:
    """What one 400 taught: drop ``drop``, rename ``rename``, stream the call, or fold the system message into the user's."""

    param: str | None = None
    drop: tuple[str, ...] = ()
    rename: tuple[str, str] | None = None
    stream: bool = False
    fold_system: bool = False

    def describe(self) -> str:
        if self.fold_system:
            return "the system message sent at the head of the first user message (the model takes no system message)"
        if self.stream:
            return "the call streamed (the provider refuses non-streaming calls to this model)"
        if self.rename:
            return f"{self.rename[0]} sent as {self.rename[1]}"
        return f"{', '.join(self.drop)} no longer sent"


@dataclass
class Dialect:
    """The fixes learnt for one (endpoint, model); ``version`` changes with each, so a request
    built before a fix is rebuilt (and its cache key with it) before it is sent."""

    drop: set[str] = field(default_factory=set)
    rename: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    fold_system: bool = False  # o1-mini, o1-preview: "'messages[0].role' does not support 'system' with this model"
    refused_modes: set[str] = field(default_factory=set)  # ask modes the endpoint answered 400 (json_schema, tool, ...)
    version: int = 0
    learnt: list[str] = field(default_factory=list)
    gate: Gate = field(default_factory=lambda: Gate())
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request`` with the learnt fixes applied (in place; returned for chaining)."""
        for name in self.drop:
            request.pop(name, None)
        for old, new in self.rename.items():
            if old in request:
                request[new] = request.pop(old)
        if self.stream and not request.get("stream"):
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        if self.fold_system and any(m.get("role") == "system" for m in request.get("messages") or ()):
            request["messages"] = fold_system(request["messages"])
        return request

    def learn(self, fix: Fix) -> bool:
        """Record ``fix``; False when it was known already (another request learnt it first)."""
        with self._lock:
            if fix.fold_system:
                if self.fold_system:
                    return False
                self.fold_system = True
            elif fix.stream:
                if self.stream:
                    return False
                self.stream = True
            elif fix.rename is not None:
                if self.rename.get(fix.rename[0]) == fix.rename[1]:
                    return False
                self.rename[fix.rename[0]] = fix.rename[1]
            else:
                if set(fix.drop) <= self.drop:
                    return False
                self.drop.update(fix.drop)
            self.version += 1
            self.learnt.append(fix.describe())
            return True


    def refuse_mode(self, mode: str) -> None:
        """The endpoint refused an output format: every row of the process skips to the next mode."""
        with self._lock:
            if mode not in self.refused_modes:
                self.refused_modes.add(mode)
                self.version += 1
                self.learnt.append(f"output mode {mode} not supported")


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` without system messages, their text put at the head of the first user message.

    The known fix for a model that refuses the system role: the instructions still come first and
    nothing is lost, only the role changes.
    """
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system" and isinstance(m.get("content"), str))
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    for message in rest:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                message["content"] = [{"type": "text", "text": system}, *content]
            else:
                message["content"] = f"{system}\n\n{content or ''}" if system else content
            return rest
    return [{"role": "user", "content": system}, *rest] if system else rest


def ask_mode_of(request: Mapping[str, Any]) -> str:
    """The ask mode a chat request was built for, read from its output-format parameters."""
    kind = (request.get("response_format") or {}).get("type")
    if kind in ("json_schema", "json_object"):
        return kind
    return "tool" if request.get("tools") else "text"


# How long the requests behind the first one wait for its answer, from the moment it is on the wire.
# A 400 for a refused parameter comes back before any generation (milliseconds); an answer that takes
# longer is a model at work, so the others need not wait for it. This bounds the cost of learning to
# once per process. The first request's own set-up (its client, its limiter slot, a starved core) is
# not counted: the window starting before the request was sent ran out on a machine pinned to one busy
# core, and every row in flight met the same 400.
LEARN_WAIT_S = 2.0
# The most the others wait for the first request to reach the wire at all (a safety net: it leaves
# the gate whatever happens to it, and wakes them).
SETUP_WAIT_S = 120.0


class Gate:
    """Holds the requests behind an endpoint's first one until it is answered (at most LEARN_WAIT_S
    once it is on the wire, :meth:`on_wire`).

    Loop-agnostic on purpose: a Judge may be called from a new event loop per call (Ark's
    harness, sync wrappers), so waiters are woken through their own loop.
    """

    def __init__(self, wait_s: float = LEARN_WAIT_S, setup_s: float = SETUP_WAIT_S) -> None:
        self.open = False
        self.wait_s = wait_s
        self.setup_s = setup_s
        self._lock = threading.Lock()
        self._learning_since: float | None = None  # a request is out to learn, since then
        self._sent_at: float | None = None  # ... and on the wire since then
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def enter(self) -> bool:
        """Wait for the gate; True when the caller is the one request let out to learn."""
        while not self.open:
            with self._lock:
                if self.open:
                    return False
                now = time.monotonic()
                if self._learning_since is None:
                    self._learning_since, self._sent_at = now, None
                    return True
                if self._sent_at is None:
                    left = self._learning_since + self.setup_s - now
                else:
                    left = self._sent_at + self.wait_s - now
                if left <= 0:
                    return False  # the first request is generating: it was not refused
                event = asyncio.Event()
                self._waiters.append((asyncio.get_running_loop(), event))
            try:
                await asyncio.wait_for(event.wait(), timeout=left)
            except asyncio.TimeoutError:
                return False
        return False

    def on_wire(self) -> None:
        """The learning request is being sent: its answer is due within ``wait_s`` from now."""
        with self._lock:
            if self._learning_since is None or self._sent_at is not None:
                return
            self._sent_at = time.monotonic()
            waiters, self._waiters = self._waiters, []
        _wake(waiters)  # they wait again, for the window from now

    def leave(self, *, settled: bool) -> None:
        """The learning request is done: open the gate (``settled``) or let the next one try."""
        with self._lock:
            self._learning_since = self._sent_at = None
            self.open = self.open or settled
            waiters, self._waiters = self._waiters, []
        _wake(waiters)


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]) -> None:
    for loop, event in waiters:
        if not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # closed between the check and the call
                pass


_DIALECTS: dict[tuple[str, str], Dialect] = {}
_REGISTRY_LOCK = threading.Lock()


def dialect_of(base_url: str, model: str) -> Dialect:
    """The process-wide Dialect of an endpoint and model (every Judge on it shares one)."""
    key = (base_url.rstrip("/"), model)
    with _REGISTRY_LOCK:
        found = _DIALECTS.get(key)
        if found is None:
            found = _DIALECTS[key] = Dialect()
        return found


def forget_dialects() -> None:
    """Forget every learnt dialect (tests; a process that changes what an endpoint serves)."""
    with _REGISTRY_LOCK:
        _DIALECTS.clear()


def error_fields(body: Any, message: str) -> tuple[str | None, str | None, str]:
    """(code, param, message) of an error body as the SDK hands it (the ``error`` object, or not)."""
    if isinstance(body, Mapping):
        inner = body.get("error") if isinstance(body.get("error"), Mapping) else body
        code, param = inner.get("code"), inner.get("param")
        said = inner.get("message")
        return (str(code) if code is not None else None, str(param) if param else None,
                said if isinstance(said, str) and said else message)
    return None, None, message


def names_output_format(code: str | None, param: str | None, message: str) -> bool:
    """Whether a 400 is about the output format (so another ask mode may succeed)."""
    if param in FORMAT_PARAMS:
        return True
    text = message.lower()
    return any(word in text for word in ("response_format", "json_schema", "json_object", "json mode", "structured output",
                                         "tool_choice", "tools", "tool call", "function call", "functions"))


def parameter_fix(code: str | None, param: str | None, message: str, request: Mapping[str, Any]) -> Fix | None:
    """The fix a 400 asks for, or None when the 400 is not about a parameter of this request."""
    if _SYSTEM_REFUSED.search(f"{param or ''} {message}") and re.search(r"\bsystem\b", message) \
            and any(m.get("role") == "system" for m in request.get("messages") or () if isinstance(m, Mapping)):
        return Fix(param="messages", fold_system=True)
    if _NEEDS_STREAM.search(message) and not request.get("stream"):
        return Fix(stream=True)
    sent = [name for name in request if name not in _NEVER_DROPPED]
    name = param if param in sent else None
    if name is None:
        if code not in ("unsupported_parameter", "unsupported_value") and not _REFUSED_WORDS.search(message):
            return None
        quoted = [n for n in sent if re.search(rf"['\"`]{re.escape(n)}['\"`]", message)]
        named = quoted or [n for n in sent if re.search(rf"\b{re.escape(n)}\b", message)]
        if len(named) != 1:
            return None
        name = named[0]
    elif code not in ("unsupported_parameter", "unsupported_value") and not _REFUSED_WORDS.search(message):
        return None  # a bad value of a parameter the model takes (temperature 5): the user's to fix
    return Fix(param=name, drop=_TOGETHER.get(name, (name,)))


def user_fix(fix: Fix) -> Fix | None:
    """``fix`` as it applies to a parameter the user set: a rename keeps the user's cap, a drop is refused (None)."""
    if fix.param in RENAMES:
        return Fix(param=fix.param, rename=(fix.param, RENAMES[fix.param]))
    return None
