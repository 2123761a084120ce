"""The fake provider's Anthropic Messages API (``POST /v1/messages``) and OpenAI Responses API (``POST /v1/responses``).

Both are answered by the fake's one dispatch (script, responder, auto reply, latency, faults): a
native body is first read as the chat body it asks the same of (:func:`chat_view`), so scripts and
responders written for chat serve every route, and the reply is then written in the route's own
shape. What each checks and answers follows the providers' API references:

- Messages API (https://docs.anthropic.com/en/api/messages): ``max_tokens`` and ``messages``
  required; unknown top-level fields (``response_format``, ``prompt_cache_key``, ...) are a 400
  ``invalid_request_error`` "Extra inputs are not permitted"; structured output through
  ``output_config.format`` (json_schema), a forced ``tool_choice: {type: tool}`` answered with a
  ``tool_use`` block; ``thinking: {type: enabled}`` adds a thinking block (a draft verdict unlike the
  answer) before the text; usage ``input_tokens`` / ``cache_creation_input_tokens`` /
  ``cache_read_input_tokens`` / ``output_tokens``; errors ``{"type": "error", "error": {...}}``.
- Responses API (https://platform.openai.com/docs/api-reference/responses): ``input`` required,
  ``messages`` is a 400; ``text.format`` json_schema / json_object; function tools; a reasoning
  model (``reasoning.effort``) returns a reasoning item with a summary before the message;
  ``usage.input_tokens_details.cached_tokens`` / ``cache_write_tokens``; ``service_tier`` echoed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

MESSAGES_FIELDS = frozenset({"model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature",
                             "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config", "service_tier",
                             "container", "mcp_servers", "context_management"})
RESPONSES_REFUSED = frozenset({"messages", "response_format", "max_tokens", "max_completion_tokens", "n"})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text") or "") for b in content or () if isinstance(b, Mapping) and b.get("type") in ("text", "input_text", "output_text"))


def check_messages(body: Mapping[str, Any]) -> str | None:
    """The 400 message the Messages API gives this body, or None."""
    extra = sorted(set(body) - MESSAGES_FIELDS)
    if extra:
        return f"{extra[0]}: Extra inputs are not permitted"
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return "messages: Field required"
    if any(isinstance(m, Mapping) and m.get("role") == "system" for m in body["messages"]):
        return "messages: Unexpected role \"system\". The Messages API accepts a top-level `system` parameter, not \"system\" as an input message role."
    return None


def check_responses(body: Mapping[str, Any]) -> str | None:
    """The 400 message the Responses API gives this body, or None."""
    refused = sorted(set(body) & RESPONSES_REFUSED)
    if refused:
        return f"Unsupported parameter: '{refused[0]}'. In the Responses API, this parameter has moved or is not supported."
    if body.get("input") is None:
        return "Missing required parameter: 'input'."
    if body.get("previous_response_id"):
        return "Previous response cannot be used: responses are not stored (store: false)."
    return None


def chat_view(body: Mapping[str, Any], route: str) -> dict[str, Any]:
    """The chat-completions body asking what a native body asks (for the script, responders and auto reply)."""
    view: dict[str, Any] = {k: v for k, v in body.items() if k not in ("system", "input", "output_config", "text", "tools", "tool_choice")}
    messages: list[dict[str, Any]] = []
    if route == "messages":
        if body.get("system"):
            messages.append({"role": "system", "content": _text(body["system"])})
        messages += [{"role": m.get("role"), "content": _text(m.get("content"))} for m in body.get("messages") or () if isinstance(m, Mapping)]
        fmt = (body.get("output_config") or {}).get("format") or {}
        if fmt.get("type") == "json_schema":
            view["response_format"] = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": fmt.get("schema") or {}}}
        tools = [t for t in body.get("tools") or () if isinstance(t, Mapping)]
        if tools:
            view["tools"] = [{"type": "function", "function": {"name": t.get("name"), "parameters": t.get("input_schema")}} for t in tools]
        choice = body.get("tool_choice") or {}
        if choice.get("type") == "tool":
            view["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice.get("type") == "any":
            view["tool_choice"] = "required"
    else:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        messages += [{"role": m.get("role"), "content": _text(m.get("content"))} for m in items if isinstance(m, Mapping)]
        fmt = (body.get("text") or {}).get("format") or {}
        if fmt.get("type") == "json_schema":
            view["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema") or {}}}
        elif fmt.get("type") == "json_object":
            view["response_format"] = {"type": "json_object"}
        tools = [t for t in body.get("tools") or () if isinstance(t, Mapping) and t.get("type") == "function"]
        if tools:
            view["tools"] = [{"type": "function", "function": {"name": t.get("name"), "parameters": t.get("parameters")}} for t in tools]
        choice = body.get("tool_choice")
        if isinstance(choice, Mapping) and choice.get("type") == "function":
            view["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice == "required":
            view["tool_choice"] = "required"
    view["messages"] = messages
    return view


def messages_payload(reply: Any, body: Mapping[str, Any], *, number: int, thinking: str | None,
                     prompt: int, cached: int, written: int) -> dict[str, Any]:
    """A Messages API reply for a scripted or automatic ``reply`` (content, tool_call, refusal, finish_reason)."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": "fake-signature"})
    if reply.content is not None:
        content.append({"type": "text", "text": reply.content})
    stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}.get(reply.finish_reason, "end_turn")
    if reply.tool_call is not None:
        try:
            arguments = json.loads(reply.tool_call.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        content.append({"type": "tool_use", "id": f"toolu_fake{number}", "name": reply.tool_call.get("name"), "input": arguments})
        stop = "tool_use"
    if reply.refusal is not None:
        stop = "refusal"
    output = max(1, (len(reply.content or "") + len((reply.tool_call or {}).get("arguments") or "") + len(thinking or "")) // 4)
    usage = reply.usage or {"input_tokens": prompt - cached - written, "cache_creation_input_tokens": written,
                            "cache_read_input_tokens": cached, "output_tokens": output,
                            "service_tier": "standard"}
    return {"id": f"msg_fake{number}", "type": "message", "role": "assistant", "model": body.get("model"),
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}


def responses_payload(reply: Any, body: Mapping[str, Any], *, number: int, prompt: int, cached: int, written: int,
                      tier: str) -> dict[str, Any]:
    """A Responses API reply (a reasoning item first for a reasoning request, then the message or function call)."""
    output: list[dict[str, Any]] = []
    reasoning_tokens = 0
    if isinstance(body.get("reasoning"), Mapping) and (body["reasoning"].get("effort") or "none") != "none":
        summary = reply.reasoning if reply.reasoning is not None else "Weighing the answer against the reference."
        output.append({"type": "reasoning", "id": f"rs_fake{number}", "summary": [{"type": "summary_text", "text": summary}]})
        reasoning_tokens = 64
    if reply.tool_call is not None:
        output.append({"type": "function_call", "id": f"fc_fake{number}", "call_id": f"call_{number}",
                       "name": reply.tool_call.get("name"), "arguments": reply.tool_call.get("arguments") or "{}", "status": "completed"})
    else:
        parts: list[dict[str, Any]] = []
        if reply.refusal is not None:
            parts.append({"type": "refusal", "refusal": reply.refusal})
        if reply.content is not None:
            parts.append({"type": "output_text", "text": reply.content, "annotations": []})
        output.append({"type": "message", "id": f"msg_fake{number}", "role": "assistant", "status": "completed", "content": parts})
    answer = max(1, (len(reply.content or "") + len((reply.tool_call or {}).get("arguments") or "")) // 4)
    status, incomplete = "completed", None
    if reply.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    usage = reply.usage or {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
                            "output_tokens": answer + reasoning_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                            "total_tokens": prompt + answer + reasoning_tokens}
    return {"id": f"resp_fake{number}", "object": "response", "created_at": int(time.time()), "status": status,
            "incomplete_details": incomplete, "model": body.get("model"), "output": output, "usage": usage,
            "service_tier": tier, "store": bool(body.get("store", True)), "previous_response_id": None}
