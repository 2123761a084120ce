"""What one (endpoint, model) accepts, learnt from its 400s once per process and applied below the Judge.

Reasoning models refuse parameters a 2024 chat model took (OpenAI's o-series and gpt-5:
``temperature`` other than 1, ``max_tokens``, ``logprobs``; DeepSeek's reasoner: ``logprobs``),
and DashScope's qwen3 thinking models refuse non-streaming calls. Such a 400 says nothing about
the row: the request is fixed (a parameter dropped or renamed, or the call streamed), the fix is
remembered for every later request of the process, and the row is asked again. A parameter the
user set explicitly is never dropped silently: the row fails with a message naming it.

A model of a family documented to refuse some of that surface (:func:`careful_model`: the
o-series, gpt-5, reasoners and thinking models, DeepSeek, Claude's compatibility layer) is met
carefully: the first request carrying a parameter or output mode the endpoint has not accepted
yet goes alone (:class:`Gate`), and the others wait for its answer, at most ``LEARN_WAIT_S`` from
the moment it is on the wire (:func:`on_wire`), so a concurrent run learns each fix from one 400,
not one per request in flight, however long the first call's own set-up takes. Any other model
starts unheld: a wave of rows goes out together, and should the endpoint refuse something after
all, the first 400 teaches the fix, the requests already in flight with it are asked again with
the fix (said once), and from then on the endpoint is met carefully. What was learnt (fixes,
refused modes, accepted parameters) is kept in the judge cache beside the replies
(:meth:`Dialect.record`, :meth:`Dialect.adopt`), so the next process starts with it: no gate and
no 400.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ._window import window_record

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
    api: str | None = None  # "responses": the model answered chat completions that it is served by the Responses API only
    version: int = 0
    learnt: list[str] = field(default_factory=list)
    # Parameter names (and ``mode:<ask mode>``) the endpoint answered 200 to: a request made only of
    # these has nothing to teach, so it skips the gate. Kept in the cache with the fixes.
    accepted: set[str] = field(default_factory=set)
    # ... and those a request settled otherwise this process (a 5xx, a parameter the user set, refused):
    # nothing more is learnt by holding the others for them. Not kept.
    waived: set[str] = field(default_factory=set)
    # Whether a request carrying something not yet accepted goes through the gate: from the start for
    # a model of a family known to refuse parameters (:func:`careful_model`), for any other once
    # the endpoint has refused something (a fix learnt here or kept in the cache).
    careful: bool = False
    gate: Gate = field(default_factory=lambda: Gate())
    # The context window (judge._window): learnt from a context-length refusal, the tokens the provider
    # counts per token of gradekit's count (>= 1 once a refusal or a reply showed the count short), and the
    # largest prompt it answered while the window is unknown. Kept in the cache with the fixes.
    window: int | None = None
    window_input_only: bool = False
    token_scale: float = 1.0
    accepted_tokens: int = 0
    # While the window is unknown, a prompt larger than any answered goes alone: one refusal teaches the window.
    window_gate: Gate = field(default_factory=lambda: Gate())
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def knows(self, request: Mapping[str, Any]) -> bool:
        """Whether ``request`` may go unheld: nothing in it is new, or the endpoint is not met carefully."""
        if not self.careful:
            return True
        known = self.accepted
        waived = self.waived
        for name in request:
            if name not in known and name not in _UNGATED and name not in waived:
                return False
        mode = _MODE_NAMES.get(ask_mode_of(request), "")
        return mode in known or mode in waived

    def settle(self, request: Mapping[str, Any], *, accepted: bool) -> bool:
        """Record that ``request`` was answered (``accepted``: with a 200); True when that is news to keep."""
        known = self.accepted
        if accepted and all(name in known or name in _UNGATED for name in request) \
                and _MODE_NAMES.get(ask_mode_of(request), "") in known:
            return False  # every answer after the first: nothing new, no set built
        names = {name for name in request if name not in _UNGATED}
        names.add(_MODE_NAMES.get(ask_mode_of(request), ""))
        with self._lock:
            if not accepted:
                self.waived |= names
                return False
            if names <= self.accepted:
                return False
            self.accepted |= names
            return True

    def record(self) -> dict[str, Any]:
        """What was learnt, as JSON-able data for the cache (:meth:`adopt` reads it back)."""
        with self._lock:
            record = {"drop": sorted(self.drop), "rename": dict(self.rename), "stream": self.stream,
                      "fold_system": self.fold_system, "refused_modes": sorted(self.refused_modes),
                      "accepted": sorted(self.accepted), **({"api": self.api} if self.api else {})}
            if self.window is not None or self.token_scale != 1.0 or self.accepted_tokens:
                record.update(window_record(self.window, self.window_input_only, self.token_scale, self.accepted_tokens))
            return record

    def load(self, cache: Any, endpoint: str) -> None:
        """Start from what an earlier process learnt about this endpoint and model (kept in ``cache``)."""
        reader = getattr(cache, "get_dialect", None)
        if reader is not None:
            self.adopt(reader(endpoint))

    def keep(self, cache: Any, endpoint: str) -> None:
        """Keep what this process learnt beside the replies in ``cache``, so the next one starts with it."""
        writer = getattr(cache, "set_dialect", None)
        if writer is not None:
            writer(endpoint, self.record())

    def adopt(self, record: Any) -> bool:
        """Take what another process learnt (a :meth:`record` from the cache); True when anything was new.

        Malformed data (an older or foreign entry) is ignored: at worst the process learns again.
        """
        if not isinstance(record, Mapping):
            return False
        names = lambda key: {n for n in record.get(key) or () if isinstance(n, str)}  # noqa: E731
        renames = record.get("rename") if isinstance(record.get("rename"), Mapping) else {}
        with self._lock:
            before = (set(self.drop), dict(self.rename), self.stream, self.fold_system, set(self.refused_modes),
                      set(self.accepted))
            self.drop |= names("drop")
            self.rename.update({k: v for k, v in renames.items() if isinstance(k, str) and RENAMES.get(k) == v})
            self.stream = self.stream or record.get("stream") is True
            self.fold_system = self.fold_system or record.get("fold_system") is True
            self.refused_modes |= names("refused_modes")
            self.accepted |= names("accepted")
            window_changed = self._adopt_window(record)
            if record.get("api") == "responses" and self.api is None:
                self.api = "responses"
                self.version += 1
            if self.drop or self.rename or self.stream or self.fold_system or self.refused_modes:
                self.careful = True  # an earlier process met a refusal here
            changed = window_changed or before != (self.drop, self.rename, self.stream, self.fold_system,
                                                   self.refused_modes, self.accepted)
            if changed:
                self.version += 1
            return changed

    def _adopt_window(self, record: Mapping[str, Any]) -> bool:
        """Take a cache record's window, scale and accepted size (the lock is held); True when anything was new."""
        before = (self.window, self.window_input_only, self.token_scale, self.accepted_tokens)
        window = record.get("context_window")
        if isinstance(window, int) and not isinstance(window, bool) and window > 0 and (self.window is None or window < self.window):
            self.window, self.window_input_only = window, record.get("window_input_only") is True
        scale = record.get("token_scale")
        if isinstance(scale, (int, float)) and not isinstance(scale, bool) and 1.0 <= scale <= 10.0:
            self.token_scale = max(self.token_scale, float(scale))
        accepted = record.get("accepted_tokens")
        if isinstance(accepted, int) and not isinstance(accepted, bool) and accepted > self.accepted_tokens:
            self.accepted_tokens = accepted
        return before != (self.window, self.window_input_only, self.token_scale, self.accepted_tokens)

    def learn_window(self, window: int | None, input_only: bool, scale: float | None) -> bool:
        """Record a context-length refusal's lesson (a smaller window, a larger scale); True when it is news.

        ``version`` moves with it, so a request rendered for the old window (one waiting at the
        window gate) is rendered again before it is sent.
        """
        with self._lock:
            before = (self.window, self.token_scale)
            if window is not None and window > 0 and (self.window is None or window < self.window):
                self.window, self.window_input_only = window, input_only
            if scale is not None and scale > self.token_scale:
                self.token_scale = min(scale, 10.0)
            if before == (self.window, self.token_scale):
                return False
            self.version += 1
            self.learnt.append(f"context window {self.window:,} tokens" if self.window is not None
                               else f"prompts count {self.token_scale:.2f}x gradekit's estimate")
            return True

    def answered_size(self, tokens: int) -> bool:
        """A prompt of ``tokens`` was answered: prompts up to that size need not wait at the window gate."""
        with self._lock:
            if tokens <= self.accepted_tokens:
                return False
            self.accepted_tokens = tokens
            return True

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
            self.careful = True
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

    def learn_api(self, api: str) -> bool:
        """The model is served through another API (``responses``); False when that was known already."""
        with self._lock:
            if self.api == api:
                return False
            self.api = api
            self.version += 1
            self.learnt.append(f"sent through the {api} API (the model is not served by chat completions)")
            return True

    def refused(self) -> None:
        """The endpoint answered a 400 about the request's form: from now on, what is new goes alone."""
        self.careful = True

    def refuse_mode(self, mode: str) -> None:
        """The endpoint refused an output format: every row of the process skips to the next mode."""
        with self._lock:
            self.careful = True
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


_UNGATED = frozenset({"model", "messages"}) | FORMAT_PARAMS  # the output format is the ``mode:`` name
_MODE_NAMES = {mode: f"mode:{mode}" for mode in ("json_schema", "json_object", "tool", "text")}


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

# The gate of the request being sent from this task, if it is the one learning (see :func:`on_wire`).
_LEARNER: ContextVar[Gate | None] = ContextVar("gradekit_learner", default=None)


def on_wire() -> None:
    """The request of this task is about to be written to the socket: a learner's window starts now.

    Called by the transport (:func:`gradekit.judge._wire.post`) once the client and its one-time set-up are
    ready: on a starved machine that set-up can take longer than the window itself, and a window
    that ran out before the first request left would let every other request meet the same 400.
    """
    gate = _LEARNER.get()
    if gate is not None:
        gate.started()


def answered() -> None:
    """The request of this task has its answer (or its error): a learner's window no longer runs out.

    What is left is the answer's handling in this process; on a starved machine the window's timer
    would otherwise win the race against it, and every waiting request would meet the same 400.
    """
    gate = _LEARNER.get()
    if gate is not None:
        gate.answered()


# A window timer that fires this late found the process starved: it is extended, not ended (the
# learner's reply may be waiting in a socket this busy loop has not read yet).
_LATE_S = 0.1


class Gate:
    """Holds the requests behind a learning one until it is answered (at most LEARN_WAIT_S on the wire).

    Loop-agnostic on purpose: a Judge may be called from a new event loop per call (Ark's
    harness, sync wrappers), so waiters are woken through their own loop: one event per waiting
    loop, set once, not one timer and one wake-up per waiting request.
    """

    def __init__(self, wait_s: float = LEARN_WAIT_S) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._learning = False
        self._round = 0  # one per learning request
        self._wire_at: float | None = None  # when this round's learner was on the wire
        self._expired = -1  # the round whose window ran out (its waiters go unheld)
        self._answered = -1  # the round whose learner has its answer (its window no longer runs out)
        self._events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}

    async def enter(self, known: Callable[[], bool]) -> bool:
        """Wait until ``known()`` or the gate is free; True when the caller is the one request let out to learn.

        The learner's ContextVar is set here, so :func:`on_wire` in the same task starts its window.
        """
        while not known():
            with self._lock:
                if not self._learning:
                    self._learning = True
                    self._round += 1
                    self._wire_at = None
                    _LEARNER.set(self)
                    return True
                if self._expired == self._round:
                    return False  # the learner is generating: it was not refused
                loop = asyncio.get_running_loop()
                event = self._events.get(loop)
                if event is None:
                    event = self._events[loop] = asyncio.Event()
                waited = self._round
            await event.wait()
            if self._expired == waited:
                return False
        return False

    def started(self) -> None:
        """The learner is on the wire: its window starts (once per round)."""
        with self._lock:
            if not self._learning or self._wire_at is not None:
                return
            self._wire_at = time.monotonic()
            round_ = self._round
        loop = asyncio.get_running_loop()
        loop.call_later(self.wait_s, self._expire, round_, loop.time() + self.wait_s)

    def answered(self) -> None:
        with self._lock:
            if self._learning:
                self._answered = self._round

    def _expire(self, round_: int, due: float) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._round != round_ or not self._learning or self._answered == round_:
                return
            if loop.time() - due > _LATE_S:  # starved: give the reply time to be read
                loop.call_later(self.wait_s / 2, self._expire, round_, loop.time() + self.wait_s / 2)
                return
            self._expired = round_
        self._wake()

    def leave(self) -> None:
        """The learning request is done (answered or not): the waiters look again."""
        _LEARNER.set(None)
        with self._lock:
            self._learning = False
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            events, self._events = self._events, {}
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, event in events.items():
            if loop is here:
                event.set()
            elif not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(event.set)
                except RuntimeError:  # closed between the check and the call
                    pass


_DIALECTS: dict[tuple[str, str], Dialect] = {}
_REGISTRY_LOCK = threading.Lock()


# Model families whose providers document refusing part of what a 2024 chat model took: OpenAI's
# o-series and gpt-5 (temperature, max_tokens, logprobs; o1-mini the system role), DeepSeek
# (json_schema, tools, logprobs on the reasoner), qwen3/QwQ/QVQ on DashScope (non-streaming calls,
# JSON modes while thinking), Volcengine's doubao-seed, Kimi and GLM thinking models, xAI's
# reasoning grok (penalties, stop), Mistral's magistral, Claude through Anthropic's OpenAI
# compatibility (n), and any name that says it thinks or reasons (an R1 distil, a "-thinking"
# variant). Matched anywhere after a separator, so a provider prefix ("openai/o3", "azure/gpt-5")
# or a deployment named after its model is caught too.
_CAREFUL = re.compile(r"(?:^|[/:_.\s-])(?:o\d+(?:$|[-_.:])|gpt-5|deepseek|qwen3|qwq|qvq|doubao-seed|kimi-k2|glm-z1|glm-4\.[5-9]"
                      r"|grok-3-mini|grok-4|magistral|claude|r1(?:$|[-_.:]))|think|reason", re.IGNORECASE)


def careful_model(model: str) -> bool:
    """Whether ``model`` is of a family known to refuse parameters, so its first new request goes alone.

    Any other model starts unheld: holding a wave for one round trip in every new process is a
    cost paid always, a refusal from an unlisted model a cost paid once (one 400 per request of
    the first wave, each asked again with the fix).
    """
    return _CAREFUL.search(model) is not None


def dialect_of(base_url: str, model: str) -> Dialect:
    """The process-wide Dialect of an endpoint and model (every Judge on it shares one)."""
    key = (base_url.rstrip("/"), model)
    with _REGISTRY_LOCK:
        found = _DIALECTS.get(key)
        if found is None:
            found = _DIALECTS[key] = Dialect(careful=careful_model(model))
        return found


def forget_dialects() -> None:
    """Forget every learnt dialect (tests; a process that changes what an endpoint serves)."""
    with _REGISTRY_LOCK:
        _DIALECTS.clear()


def error_fields(body: Any, message: str) -> tuple[str | None, str | None, str]:
    """(code, param, message) of an error body as the SDK hands it (the ``error`` object, or not; Gemini's
    JSON array of one such object)."""
    if isinstance(body, list) and body and isinstance(body[0], Mapping):
        body = body[0]
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
                                         "output_config", "text.format",
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
