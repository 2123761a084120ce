"""Native transports: a judgement sent through the OpenAI Responses API or Anthropic's Messages API.

The judge builds one request shape, a chat completion's (:func:`gradekit.judge._client.build_request`
with the endpoint's learnt fixes), and reads one reply shape. For ``api: responses`` and
``api: anthropic`` this module translates the request on its way out and the reply on its way
back, so the cache key, the parser, the Verdict, the fleet, the limiter, hedging and the retry
policy are the chat path's own. Errors are the openai SDK's exceptions (the request goes through
the SDK client's ``post``, which maps every status to its exception class whatever the body's
shape), so they become the same error kinds; Anthropic's 529 ``overloaded_error`` is a 5xx
(``server_error``, retried) and its ``anthropic-ratelimit-*`` headers pace the limiter
(:mod:`gradekit.judge._pacing` reads both families).

What each API adds:

- Messages API: the system block carries ``cache_control`` (Anthropic caches only at such
  breakpoints: without one a rubric is billed in full on every row); structured output through
  ``output_config.format`` (json_schema mode), a forced tool call otherwise (tool mode); thinking
  blocks become the reply's reasoning, never its verdict; ``max_tokens`` is required (a judge that
  sets none gets ``DEFAULT_MAX_TOKENS``).
- Responses API: ``text.format`` for structured output, function tools, reasoning items kept as
  the reply's reasoning; ``store: false`` and never ``previous_response_id``: each row is its own
  conversation, and nothing of one row reaches another.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

import openai

from ._dialect import answered, on_wire
from ._sdk import sdk_http, whole_request_seconds
from ._wire import usage_detail

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096  # the Messages API requires max_tokens; a verdict with its rationale fits far below
NATIVE_ROUTES = frozenset({"responses", "anthropic"})

# Chat parameters each API spells otherwise or has no use for (translated or dropped here); every other key
# of the request, a provider's own parameter the user set included, reaches the body as given.
_CHAT_ONLY = frozenset({"messages", "response_format", "tools", "tool_choice", "max_tokens", "max_completion_tokens",
                        "stream", "stream_options", "n", "parallel_tool_calls"})
_ANTHROPIC_DROPPED = frozenset({"prompt_cache_key", "reasoning_effort", "seed", "logprobs", "top_logprobs",
                                "presence_penalty", "frequency_penalty", "stop"})
# Minimum cacheable prompt length per Claude model (Anthropic's prompt-caching guide): a shorter prefix is
# never cached, so a run below it is not warmed (judge._warm).
_CLAUDE_MINIMUM = (("claude-opus-4-6", 4096), ("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
                   ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
                   ("claude-haiku-3", 2048))


def claude_minimum_tokens(model: str) -> int:
    """The shortest prompt prefix Anthropic caches for ``model`` (1,024 for Sonnet 4.5, Opus 4.1 and older)."""
    name = model.lower()
    return next((tokens for prefix, tokens in _CLAUDE_MINIMUM if name.startswith(prefix)), 1024)


# ---- the Messages API ---------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content or () if isinstance(p, Mapping) and p.get("type") == "text")


def _anthropic_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """A chat content part as a Messages API content block (text, or an image from a data: or https: URL)."""
    if part.get("type") == "image_url":
        url = str((part.get("image_url") or {}).get("url") or "")
        if url.startswith("data:") and ";base64," in url:
            media, data = url[5:].split(";base64,", 1)
            return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    if part.get("type") == "text":
        return {"type": "text", "text": part.get("text") or ""}
    return dict(part)


def anthropic_body(request: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API body for a chat-completions request built by the judge."""
    body: dict[str, Any] = {k: v for k, v in request.items() if k not in _CHAT_ONLY and k not in _ANTHROPIC_DROPPED}
    body["max_tokens"] = int(request.get("max_completion_tokens") or request.get("max_tokens") or DEFAULT_MAX_TOKENS)
    system = [m for m in request.get("messages") or () if m.get("role") in ("system", "developer")]
    if system:
        # One breakpoint at the end of what every row shares: Anthropic caches the prefix up to it
        # (tools, then system), and a prompt below the model's minimum is simply not cached.
        body["system"] = [{"type": "text", "text": "\n\n".join(_text_of(m.get("content")) for m in system),
                           "cache_control": {"type": "ephemeral"}}]
    messages = []
    for message in request.get("messages") or ():
        if message.get("role") in ("system", "developer"):
            continue
        content = message.get("content")
        blocks = content if isinstance(content, str) else [_anthropic_part(p) for p in content or () if isinstance(p, Mapping)]
        messages.append({"role": message.get("role"), "content": blocks})
    body["messages"] = messages
    if isinstance(request.get("stop"), (str, list)):
        body["stop_sequences"] = [request["stop"]] if isinstance(request["stop"], str) else list(request["stop"])
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        body["output_config"] = {"format": {"type": "json_schema", "schema": (fmt.get("json_schema") or {}).get("schema") or {}}}
    tools, forced = _functions(request)
    if tools:
        body["tools"] = [{"name": name, "description": about, "input_schema": schema} for name, about, schema in tools]
    if forced is not None:
        body["tool_choice"] = {"type": "tool", "name": forced}
    return body


def _functions(request: Mapping[str, Any]) -> tuple[list[tuple[str, str, Any]], str | None]:
    """A chat request's function tools as (name, description, parameters), and the one ``tool_choice`` forces."""
    tools = [(t["function"]["name"], t["function"].get("description") or "", t["function"].get("parameters") or {"type": "object"})
             for t in request.get("tools") or () if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)]
    choice = request.get("tool_choice")
    forced = choice["function"]["name"] if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping) else None
    return tools, forced


_STOP = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
         "tool_use": "tool_calls", "refusal": "content_filter", "model_context_window_exceeded": "length"}


def anthropic_completion(message: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API reply as the chat completion it stands for: text blocks are the content, a tool_use
    block the tool call, thinking blocks the reasoning (never the verdict); the usage as OpenAI counts it
    (prompt tokens include the cache's reads and writes, which ``prompt_tokens_details`` splits out)."""
    text, thinking, calls = [], [], []
    for block in message.get("content") or ():
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            text.append(block.get("text") or "")
        elif kind == "thinking":
            thinking.append(block.get("thinking") or "")
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if thinking:
        reply["reasoning_content"] = "\n".join(thinking)
    if calls:
        reply["tool_calls"] = calls
    spent = message.get("usage") if isinstance(message.get("usage"), Mapping) else {}
    read = int(spent.get("cache_read_input_tokens") or 0)
    written = int(spent.get("cache_creation_input_tokens") or 0)
    prompt = int(spent.get("input_tokens") or 0) + read + written
    completion = int(spent.get("output_tokens") or 0)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written}}
    finish = _STOP.get(str(message.get("stop_reason") or ""), "stop")
    body: dict[str, Any] = {"id": message.get("id"), "object": "chat.completion", "model": message.get("model"),
                            "choices": [{"index": 0, "message": reply, "finish_reason": finish}], "usage": usage}
    tier = spent.get("service_tier")
    if isinstance(tier, str):
        body["service_tier"] = tier
    return body


# ---- the Responses API --------------------------------------------------------------------------


def _responses_part(part: Mapping[str, Any], role: str) -> dict[str, Any]:
    if part.get("type") == "text":  # a breakpoint marker (prompt_cache_breakpoint) stays on its part
        return {**part, "type": "output_text" if role == "assistant" else "input_text", "text": part.get("text") or ""}
    if part.get("type") == "image_url":
        image = part.get("image_url") or {}
        return {"type": "input_image", "image_url": image.get("url"), "detail": image.get("detail") or "auto"}
    return dict(part)


def responses_body(request: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API body for a chat-completions request built by the judge."""
    body: dict[str, Any] = {k: v for k, v in request.items() if k not in _CHAT_ONLY and k != "reasoning_effort"}
    items = []
    for message in request.get("messages") or ():
        role = str(message.get("role") or "user")
        content = message.get("content")
        parts = content if isinstance(content, str) else [_responses_part(p, role) for p in content or () if isinstance(p, Mapping)]
        items.append({"role": role, "content": parts})
    body["input"] = items
    body["store"] = False  # each row its own conversation, kept nowhere (and no previous_response_id, ever)
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    if limit:
        body["max_output_tokens"] = int(limit)
    if request.get("reasoning_effort") is not None:
        body["reasoning"] = {**(request.get("reasoning") or {}), "effort": request["reasoning_effort"]}
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = fmt.get("json_schema") or {}
        body["text"] = {"format": {"type": "json_schema", "name": schema.get("name") or "verdict",
                                   "schema": schema.get("schema") or {}, "strict": bool(schema.get("strict", True))}}
    elif fmt.get("type") == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    tools, forced = _functions(request)
    if tools:
        body["tools"] = [{"type": "function", "name": name, "description": about, "parameters": schema} for name, about, schema in tools]
    if forced is not None:
        body["tool_choice"] = {"type": "function", "name": forced}
    return body


def responses_completion(response: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses API reply as the chat completion it stands for: output_text parts are the content, a
    function_call item the tool call, reasoning items (their summaries) the reasoning, a refusal part the refusal."""
    text, reasoning, calls, refusal = [], [], [], None
    for item in response.get("output") or ():
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "message":
            for part in item.get("content") or ():
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") == "output_text":
                    text.append(part.get("text") or "")
                elif part.get("type") == "refusal":
                    refusal = part.get("refusal") or ""
        elif kind == "reasoning":
            reasoning += [s.get("text") or "" for s in item.get("summary") or () if isinstance(s, Mapping)]
            reasoning += [c.get("text") or "" for c in item.get("content") or () if isinstance(c, Mapping)]
        elif kind == "function_call":
            calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                          "function": {"name": item.get("name") or "", "arguments": item.get("arguments") or "{}"}})
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None, "refusal": refusal}
    if any(reasoning):
        reply["reasoning_content"] = "\n".join(r for r in reasoning if r)
    if calls:
        reply["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop"
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        finish = "content_filter" if reason == "content_filter" else "length"
    spent = response.get("usage") if isinstance(response.get("usage"), Mapping) else {}
    details = spent.get("input_tokens_details") if isinstance(spent.get("input_tokens_details"), Mapping) else {}
    prompt, completion = int(spent.get("input_tokens") or 0), int(spent.get("output_tokens") or 0)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0),
                                       "cache_write_tokens": int(details.get("cache_write_tokens") or 0)},
             "completion_tokens_details": {"reasoning_tokens": usage_detail(spent, "output_tokens_details", "reasoning_tokens")}}
    body: dict[str, Any] = {"id": response.get("id"), "object": "chat.completion", "model": response.get("model"),
                            "choices": [{"index": 0, "message": reply, "finish_reason": finish}], "usage": usage}
    if isinstance(response.get("service_tier"), str):
        body["service_tier"] = response["service_tier"]
    return body


# ---- the send -------------------------------------------------------------------------------------


class _Reply:
    """What the fleet reads of a native reply: its status and headers (the body is already a completion)."""

    __slots__ = ("headers", "status_code")

    def __init__(self, status_code: int, headers: Any) -> None:
        self.status_code, self.headers = status_code, headers


async def post_native(client: Any, request: Mapping[str, Any], route: str) -> tuple[Any, Any]:
    """One judgement through the Responses API (``POST /responses``) or the Messages API (``POST /messages``),
    with the SDK client's base URL, timeout and error classes; the reply comes back as a chat completion.

    The client's timeout bounds the whole request, as :func:`gradekit.judge._wire.post` does for chat.
    """
    seconds = whole_request_seconds(client)
    if seconds is None:
        return await _post_native(client, request, route)
    try:
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(seconds):
                return await _post_native(client, request, route)
        return await asyncio.wait_for(_post_native(client, request, route), seconds)
    except asyncio.TimeoutError:
        url = f"{str(getattr(client, 'base_url', '')).rstrip('/')}/{'messages' if route == 'anthropic' else 'responses'}"
        raise openai.APITimeoutError(request=sdk_http().Request("POST", url)) from None


async def _post_native(client: Any, request: Mapping[str, Any], route: str) -> tuple[Any, Any]:
    if route == "anthropic":
        path, body = "/messages", anthropic_body(request)
        # Anthropic's authentication and version headers instead of OpenAI's bearer token.
        options: dict[str, Any] = {"headers": {"x-api-key": str(getattr(client, "api_key", "") or ""),
                                               "anthropic-version": ANTHROPIC_VERSION, "Authorization": openai.Omit()}}
    else:
        path, body, options = "/responses", responses_body(request), {}
    on_wire()
    try:
        raw = await client.post(path, body=body, cast_to=sdk_http().Response, options=options)
    except openai.BadRequestError:
        answered()
        raise
    answered()
    data = json.loads(raw.content)
    if not isinstance(data, dict):
        return _Reply(raw.status_code, raw.headers), data
    completion = anthropic_completion(data) if route == "anthropic" else responses_completion(data)
    return _Reply(raw.status_code, raw.headers), completion
