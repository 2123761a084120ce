"""A loopback, OpenAI-compatible fake chat-completions provider for tests and benchmarks.

Parts, top to bottom:

1. ``Reply`` / ``RecordedRequest`` -- what a test scripts and what it can assert on afterwards.
2. ``auto_reply`` -- the deterministic, schema-valid answer used when nothing is scripted.
3. Wire helpers -- turning a ``Reply`` into an HTTP response (completion or its stream chunks,
   error, raw, dropped), in the provider's dialect (see ``_dialects``).
4. ``FakeProvider`` -- the server: recording, token-bucket rate limit, capability rejections,
   script/responder/auto dispatch, and its lifecycle on a uvicorn thread.

The Files and Batch API live in ``_fake_batch.py``; the provider routes ``/v1/files`` and
``/v1/batches`` there and answers each batch line with its own dispatch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import inspect
import ipaddress
import itertools
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal

import uvicorn
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ._fake_batch import BatchAPI, BatchFault
from ._fake_embeddings import embedding_inputs, embeddings_payload
from ._fake_reward import REWARD_PATHS, RewardFn, reward_payload, reward_text
from ._dialects import DIALECTS, Dialect, draft_reasoning, resolve
from ._fake_billing import CACHE_MODELS, Billing, CacheModel, chat_segments, messages_segments
from ._fake_native import chat_view, check_messages, check_responses, messages_payload, responses_payload
from ._wire import RecordedRequest, _DroppedResponse, _DroppedStream, error_response

# --------------------------------------------------------------------------------------------
# 1. What a test scripts, and what it gets recorded
# --------------------------------------------------------------------------------------------


class Reply(BaseModel):
    """One scripted answer to one chat-completions request.

    A ``Reply`` describes everything a real provider can do to a client -- a normal answer,
    a tool call, a refusal, a truncated generation, an HTTP error with retry headers, a slow
    answer, a corrupt body, or a connection that dies mid-response -- so graders can be tested
    against each of those paths without a network or an API key.

    Attributes:
        content: Assistant message content.
        tool_call: ``{"name": str, "arguments": str}``; becomes ``message.tool_calls[0]`` and
            finish_reason ``"tool_calls"`` unless ``finish_reason`` is set explicitly.
        finish_reason: ``"stop"``, ``"length"``, ``"content_filter"`` or ``"tool_calls"``.
        refusal: ``message.refusal`` (structured-output refusal); content stays as given (None).
        logprobs: Passed through as ``choices[0].logprobs = {"content": logprobs}``.
        status: Non-200 answers carry an OpenAI-style ``{"error": {...}}`` body.
        error_message: Message for that error body.
        headers: Extra response headers, e.g. ``{"Retry-After": "1"}``.
        delay: Extra seconds before answering (non-blocking; other requests proceed).
        raw_body: Send exactly this text as the body (``application/json``), e.g. broken JSON.
        drop: Break the connection without completing the HTTP response.
        endless: A streamed reply that never ends: ``"keep-alive"`` sends an SSE comment
            (``: keep-alive``) every ``endless_every`` seconds, ``"deltas"`` a reasoning delta as often,
            until the client goes away or the fake stops (a provider stuck thinking, or holding a stream open).
        endless_every: Seconds between the events of an ``endless`` stream.
        usage: Override the token usage object.
        model: The ``model`` the reply says served it (a dated snapshot behind the alias asked for);
            default: the provider's ``served_model``, else the model the request names.
        system_fingerprint: The reply's ``system_fingerprint``; default: the provider's (none unless set).
        reasoning: The model's thinking before its answer. Each dialect puts it on the wire its way
            (a message field, ``<think>`` tags in the content, stream deltas) or drops it (OpenAI's
            reasoning models, Gemini, Anthropic); the ``openai`` dialect never thinks. None on a
            thinking dialect invents a draft holding a verdict unlike the final answer (see
            :func:`gradekit.judge.testing._dialects.draft_reasoning`). With ``finish_reason="length"`` a
            thinking dialect sends only the draft: no close tag and no answer.
    """

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    tool_call: dict[str, Any] | None = None
    finish_reason: str = "stop"
    refusal: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    status: int = 200
    error_message: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    delay: float = 0.0
    raw_body: str | None = None
    drop: bool = False
    endless: Literal["keep-alive", "deltas"] | None = None
    endless_every: float = 1.0
    usage: dict[str, Any] | None = None
    model: str | None = None
    system_fingerprint: str | None = None
    reasoning: str | None = None


Responder = Callable[[dict[str, Any]], "Reply | None | Awaitable[Reply | None]"]

# --------------------------------------------------------------------------------------------
# 2. The default answer: deterministic and valid against whatever the client asked for
# --------------------------------------------------------------------------------------------

AUTO_TEXT = "auto reply"


def asked_reply(body: Mapping[str, Any], verdict: Mapping[str, Any], text: str) -> Reply:
    """``verdict`` in the form the request asks for: the forced tool's call, JSON content under a JSON response
    format, else ``text`` (what a judge writes in tags mode). For scripted judges of a known verdict."""
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        return Reply(tool_call={"name": choice["function"]["name"], "arguments": json.dumps(verdict, ensure_ascii=False)})
    if (body.get("response_format") or {}).get("type") in ("json_schema", "json_object"):
        return Reply(content=json.dumps(verdict, ensure_ascii=False))
    return Reply(content=text)


def auto_reply(body: dict[str, Any]) -> Reply:
    """Build the default answer for a chat-completions request body.

    A forced tool call (``tool_choice`` naming a function, or ``"required"``) gets that tool's
    parameters filled in; a ``json_schema`` response format gets its schema filled in (enum ->
    first value, string -> "auto reply", number/integer -> 0 clamped into its bounds,
    boolean -> true); ``json_object`` gets ``{"rationale": "auto reply"}`` plus the field the prompt's
    last line asks for with its first offered value (``"judgement", whose value is either "correct"
    ...`` -> ``"judgement": "correct"``); a prompt whose last line offers tags
    (``<judgement>correct</judgement> or ...``) gets ``auto reply`` and the first of them; one whose
    last line quotes the verdict line (``exactly "Final Decision: Yes" ...``, ``"Output (a)"``) gets
    ``auto reply`` and the first quoted line; anything else gets the plain content ``"auto reply"``.
    """
    tool = _forced_tool(body)
    if tool is not None:
        name = tool.get("name", "")
        args = _fill(tool.get("parameters") or {"type": "object"})
        return Reply(tool_call={"name": name, "arguments": json.dumps(args)}, finish_reason="tool_calls")
    rf = body.get("response_format") or {}
    if rf.get("type") == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema") or {"type": "object"}
        return Reply(content=json.dumps(_fill(schema)))
    asked = _instruction(body)
    if rf.get("type") == "json_object":
        # The JSON the prompt's last instruction asks for, with its first offered value: the default reply holds a
        # verdict in every ask mode, so a dialect that refuses json_schema can still be demonstrated offline.
        return Reply(content=json.dumps({"rationale": AUTO_TEXT, **_json_asked(asked)}, ensure_ascii=False))
    tagged = _tag_asked(asked)
    if tagged is not None:  # tags mode: reasoning, then the verdict tag with the first label offered
        tag, value = tagged
        return Reply(content=f"{AUTO_TEXT}\n<{tag}>{value}</{tag}>")
    quoted = _QUOTED.findall(asked)
    if quoted:  # a verdict line the prompt quotes ("Final Decision: Yes", "Output (a)", "My final verdict is: [[A=B]]")
        return Reply(content=f"{AUTO_TEXT}\n{quoted[0]}")
    return Reply(content=AUTO_TEXT)


_QUOTED = re.compile(r'["\u201c]([^"\u201d]+)["\u201d]')


def _json_asked(line: str) -> dict[str, str]:
    """``first "rationale", then "judgement", whose value is either "correct" or ...`` -> {"judgement": "correct"}."""
    tokens = [t for t in _QUOTED.findall(line) if t != "rationale"]
    return {tokens[0]: tokens[1]} if len(tokens) >= 2 and re.fullmatch(r"[A-Za-z_]\w*", tokens[0]) else {}


def _tag_asked(line: str) -> tuple[str, str] | None:
    """The verdict tag the line asks for (the last one, not the rationale's) and the first label it offers:
    ``<judgement>correct</judgement> or ...``, ``<grade></grade>: CORRECT, ...``, ``<judgement></judgement> 中只写“正确”...``."""
    names = [n for n in dict.fromkeys(re.findall(r"<([A-Za-z_][\w-]*)>", line)) if n != "rationale"]
    if not names:
        return None
    tag = names[-1]
    inline = re.search(rf"<{re.escape(tag)}>([^<]+)</{re.escape(tag)}>", line)  # "B > A > C" holds ">" too
    if inline:
        return tag, inline.group(1)
    rest = line[line.rfind(f"</{tag}>") + len(tag) + 3:]
    found = _QUOTED.search(rest) or re.search(r"([^\s:,.;\uff0c\u3002\uff1a\u3001]+)", rest)
    if found is None:  # the labels before the tag: "then only one of success, partial, ... in <judgement></judgement>."
        before = line[:line.find(f"<{tag}>")]
        found = re.search(r"\bone of\s+([^\s:,.;]+)", before) or re.search(r"\bonly\s+([^\s:,.;]+)", before)
    return (tag, found.group(1)) if found else None


def asked_form(body: dict[str, Any], label: str) -> str:
    """``label`` written as the request's last line asks for a verdict: in the verdict tag it names
    (``<judgement>label</judgement>``), as the quoted verdict line that holds it (``Final Decision: No`` for
    ``No``), else bare. What a scripted judge answers in text and tags modes (:func:`~._population.labelled_reply`)."""
    asked = _instruction(body)
    tagged = _tag_asked(asked)
    if tagged is not None:
        return f"<{tagged[0]}>{label}</{tagged[0]}>"
    word = re.compile(rf"(?<!\w){re.escape(label)}(?!\w)", re.IGNORECASE)
    phrases = _QUOTED.findall(asked)
    found = next((phrase for phrase in phrases if word.search(phrase)), None)
    if found is None:  # one example line for every verdict: "My final verdict is: [[A=B]]" -> [[label]] in its place
        found = next((re.sub(r"\[\[[^\]]*\]\]", lambda _: f"[[{label}]]", p) for p in phrases if "[[" in p), None)
    return found if found is not None else label


def last_user_content(body: Mapping[str, Any]) -> Any:
    """The content of a chat body's last user message (a string or content parts), None without one: where a
    judge request puts the row, and the shipped rubrics their reply instruction."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message.get("content")
    return None


def _instruction(body: dict[str, Any]) -> str:
    """The last line of the last user message: where the shipped rubrics say how to reply (never the row's data)."""
    content = last_user_content(body)
    if isinstance(content, list):
        content = "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    lines = [line for line in str(content or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The ``function`` object of the tool the request forces, if any."""
    tools = [t.get("function") or {} for t in body.get("tools") or []]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return next((t for t in tools if t.get("name") == name), {"name": name})
    if choice == "required" and tools:
        return tools[0]
    return None


def _fill(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A deterministic value valid against a (pydantic-style) JSON schema."""
    root = schema if root is None else root
    if "$ref" in schema:  # local refs only: "#/$defs/Name" or "#/definitions/Name"
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return _fill(target, root)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _fill(options[0], root)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {k: _fill(v, root) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        items = schema.get("items")
        if not items:
            return []
        count = min(max(schema.get("minItems", 1), 1), schema.get("maxItems", math.inf))
        return [_fill(items, root) for _ in range(int(count))]
    if kind in ("number", "integer"):
        return _clamp(schema, integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return AUTO_TEXT


def _clamp(schema: dict[str, Any], *, integer: bool) -> int | float:
    """0, moved into the schema's [minimum, maximum] range when 0 is outside it."""
    value: int | float = 0
    step = 1 if integer else 0.5
    if "minimum" in schema and value < schema["minimum"]:
        value = schema["minimum"]
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        value = schema["exclusiveMinimum"] + step
    if "maximum" in schema and value > schema["maximum"]:
        value = schema["maximum"]
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        value = schema["exclusiveMaximum"] - step
    return math.ceil(value) if integer else value


# --------------------------------------------------------------------------------------------
# 3. Wire format: Reply -> HTTP response
# --------------------------------------------------------------------------------------------

def _text_len(messages: Any) -> int:
    """Characters of text across all messages (string or content-part lists)."""
    total = 0
    for msg in messages if isinstance(messages, list) else []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return total


def prompt_tokens_of(body: dict[str, Any], dialect: Dialect) -> int:
    """The prompt's tokens as the fake counts them: its text's characters over the dialect's characters per token."""
    return max(1, int(_text_len(body.get("messages")) / dialect.chars_per_token))


_EFFORT_TOKENS = {"none": 0, "minimal": 0, "low": 64, "medium": 192, "high": 512, "xhigh": 1024}


@dataclasses.dataclass
class _Turn:
    """One answer as a dialect puts it on the wire (content, reasoning, tool call, finish reason, usage)."""

    content: str | None
    reasoning: str | None  # for a ``field`` dialect: the field's value; otherwise None
    tool_call: dict[str, Any] | None
    finish_reason: str
    usage: dict[str, Any]
    logprobs: list[dict[str, Any]] | None


def _turn(reply: Reply, body: dict[str, Any], dialect: Dialect, cached_tokens: int) -> _Turn:
    thinking = dialect.thinking_for(body)
    content, tool_call, finish_reason = reply.content, reply.tool_call, reply.finish_reason
    if tool_call is not None:
        tool_call = {"name": tool_call.get("name", ""), "arguments": tool_call.get("arguments", "{}")}
        if "finish_reason" not in reply.model_fields_set:
            finish_reason = "tool_calls"
    if dialect.fence_json and content and (body.get("response_format") or {}).get("type") in ("json_object", "json_schema"):
        content = f"```json\n{content}\n```"
    reasoning = None
    reasoning_tokens = 0
    if thinking:
        reasoning = reply.reasoning if reply.reasoning is not None else draft_reasoning(body, content or (tool_call or {}).get("arguments"))
        if dialect.thinking == "hidden" and reply.reasoning is None:
            reasoning_tokens = _EFFORT_TOKENS.get(str(body.get("reasoning_effort") or "medium"), 192)
        else:
            reasoning_tokens = max(1, len(reasoning) // 4)
    answer_tokens = max(1, len(content or reply.refusal or "") // 4 + len((tool_call or {}).get("arguments", "")) // 4)
    budget = body.get("max_completion_tokens")
    if thinking and isinstance(budget, int) and budget < reasoning_tokens + answer_tokens:
        finish_reason, reasoning_tokens = "length", min(reasoning_tokens, budget)  # the reasoning used up the budget
    if thinking and finish_reason == "length":
        # Cut off while thinking: only the unfinished draft, no answer.
        tool_call, answer_tokens = None, 0
        content = "" if dialect.thinking == "hidden" else None  # OpenAI sends "", vLLM's parser null
    if thinking and dialect.thinking == "tags":
        opened = "" if dialect.think_open_in_prompt else "<think>\n"
        closed = f"\n</think>\n\n{content or ''}" if finish_reason != "length" else ""
        content = f"{opened}{reasoning}{closed}"
    prompt_tokens = prompt_tokens_of(body, dialect)
    completion_tokens = answer_tokens + reasoning_tokens
    usage = reply.usage or {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if reply.usage is None and dialect.reasoning_usage:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        usage["prompt_tokens_details"] = {"cached_tokens": min(cached_tokens, prompt_tokens)}
    logprobs = None if "logprobs" in dialect.ignores else reply.logprobs
    return _Turn(content=content, reasoning=reasoning if dialect.thinking == "field" else None, tool_call=tool_call,
                 finish_reason=finish_reason, usage=usage, logprobs=logprobs)


def _served(reply: Reply, body: dict[str, Any], model: str, served_model: str | None,
            system_fingerprint: str | None) -> dict[str, Any]:
    """The reply's ``model`` and, when one is set, its ``system_fingerprint``: the reply's own, else the provider's."""
    served = {"model": reply.model or served_model or body.get("model") or model}
    fingerprint = reply.system_fingerprint or system_fingerprint
    if fingerprint:
        served["system_fingerprint"] = fingerprint
    return served


def completion_payload(reply: Reply, body: dict[str, Any], *, number: int, model: str,
                       dialect: Dialect | None = None, cached_tokens: int = 0, served_model: str | None = None,
                       system_fingerprint: str | None = None) -> dict[str, Any]:
    """The ``chat.completion`` object for a 200 ``reply`` (``number`` makes ids unique), in ``dialect``'s shape.

    ``served_model`` / ``system_fingerprint``: what the provider says served it, unless the reply says otherwise."""
    dialect = dialect or DIALECTS["openai"]
    turn = _turn(reply, body, dialect, cached_tokens)
    message: dict[str, Any] = {"role": "assistant", "content": turn.content, "refusal": reply.refusal}
    if turn.reasoning is not None:
        message[dialect.reasoning_field] = turn.reasoning
    if turn.tool_call is not None:
        message["tool_calls"] = [{"id": f"call_{number}", "type": "function", "function": turn.tool_call}]
    choice = {"index": 0, "message": message, "finish_reason": turn.finish_reason,
              "logprobs": {"content": turn.logprobs} if turn.logprobs is not None else None}
    return {"id": f"chatcmpl-fake-{number}", "object": "chat.completion", "created": int(time.time()),
            **_served(reply, body, model, served_model, system_fingerprint), "choices": [choice], "usage": turn.usage}


_PIECE = 24  # characters per streamed delta


def completion_chunks(reply: Reply, body: dict[str, Any], *, number: int, model: str, dialect: Dialect,
                      cached_tokens: int = 0, served_model: str | None = None,
                      system_fingerprint: str | None = None) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply: reasoning deltas, then content (or tool
    call) deltas, a finish chunk, and the usage chunk when ``stream_options.include_usage`` asks for it."""
    turn = _turn(reply, body, dialect, cached_tokens)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base = {"id": f"chatcmpl-fake-{number}", "object": "chat.completion.chunk", "created": int(time.time()),
            **_served(reply, body, model, served_model, system_fingerprint)}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        extra = {"usage": None} if include_usage else {}
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = turn.reasoning or ""
    chunks += [chunk({dialect.reasoning_field: text[i:i + _PIECE]}) for i in range(0, len(text), _PIECE)]
    text = turn.content or ""
    chunks += [chunk({"content": text[i:i + _PIECE]}) for i in range(0, len(text), _PIECE)]
    if turn.tool_call is not None:
        args = turn.tool_call["arguments"]
        chunks.append(chunk({"tool_calls": [{"index": 0, "id": f"call_{number}", "type": "function",
                                             "function": {"name": turn.tool_call["name"], "arguments": ""}}]}))
        chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + _PIECE]}}]})
                   for i in range(0, len(args), _PIECE)]
    if reply.refusal:
        chunks.append(chunk({"refusal": reply.refusal}))
    chunks.append(chunk({}, turn.finish_reason))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": turn.usage})
    return chunks


def rfc3339(seconds_from_now: float) -> str:
    """A wall-clock time as Anthropic's ``anthropic-ratelimit-*-reset`` headers write it."""
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=max(0.0, seconds_from_now))
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's rate-limit headers write it: ``120ms``, ``1.5s``, ``6m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


# --------------------------------------------------------------------------------------------
# 4. The server
# --------------------------------------------------------------------------------------------


class FakeProvider:
    """A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions API.

    It is the seam for testing code that calls an LLM judge -- ours and users' own -- the way
    ``httpx.MockTransport`` is for HTTP clients, but one level lower: the real ``openai`` SDK,
    its retries, timeouts and connection pool all run unmodified against it, so tests exercise
    the same error paths production hits (429 with ``Retry-After``, 5xx, unsupported
    ``response_format``, truncated bodies, dropped connections, slow answers).

    The Files and Batch API (``/v1/files``, ``/v1/batches``) run uploaded request files through
    the same dispatch as live requests; see :mod:`gradekit.judge.testing._fake_batch` and the batch
    controls (``hold_batches``, ``push_batch_fault``, ``batches_created``, ...). A batch
    finishes at its ``batch_polls_until_done``-th poll unless held (``hold_batches``) or
    scripted to fail, expire or be cancelled (``batch_faults``); ``shuffle_batch_output``
    returns result lines out of input order, as a real provider may.

    Each ``POST /v1/chat/completions`` is recorded, then rate limited (token buckets, if
    ``rate_limit_rps`` or ``rate_limit_tpm``; the request limit may change on a
    ``rate_limit_schedule`` of ``(seconds after start, rps)`` pairs, and every reply carries
    OpenAI's ``x-ratelimit-*`` headers unless ``rate_limit_headers=False``), then checked against the ``reject_*`` capability flags, and finally
    answered with the next scripted :class:`Reply`, else ``responder(body)``, else
    :func:`auto_reply`. Requests answered 429/400 by those checks do not consume the script.

    ``POST /v1/embeddings`` answers with deterministic hashed bag-of-words vectors (see
    :mod:`gradekit.judge.testing._fake_embeddings`) after the same recording, rate limit, script and
    responder: a scripted ``Reply`` with an error status, ``delay``, ``drop`` or ``raw_body``
    applies to the next request of either kind (its ``content`` is ignored for embeddings), and
    a responder sees embeddings bodies too (``input``, no ``messages``; one that raises on them,
    being written for chat, is passed over and the vectors are computed). ``reject_embeddings``
    makes the route a 404, as on a chat-only server; ``embedding_models`` limits the models it
    knows (any other is a 404 ``model_not_found``).

    ``reward_model`` (a function of the text a reward model reads, returning its head's outputs)
    makes it a served reward model too: vLLM's ``POST /classify`` and ``POST /pooling``, SGLang's
    ``POST /v1/classify`` and ``POST /v1/embeddings`` (which then answers the head's outputs as the
    embedding), shapes from their source (:mod:`gradekit.judge.testing._fake_reward`).

    ``dialect`` (a name in :data:`gradekit.judge.testing.DIALECTS`, or a :class:`Dialect`) makes it answer as
    that provider does: the parameters it refuses and their error bodies, where a thinking model's
    reasoning goes, its rate-limit headers and its 429. Every dialect streams (``stream: true``:
    server-sent ``chat.completion.chunk`` events ending ``data: [DONE]``); a scripted error status,
    ``delay``, ``raw_body`` or ``drop`` applies to a streamed request as to any other.

    Example:
        >>> with FakeProvider(script=[Reply(content='{"score": 1}')]) as fake:
        ...     client = AsyncOpenAI(base_url=fake.base_url, api_key="x")
    """

    def __init__(
        self,
        *,
        script: Iterable[Reply] = (),
        responder: Responder | None = None,
        latency: float | Callable[[dict[str, Any]], float] = 0.0,
        rate_limit_rps: float | None = None,
        rate_limit_burst: float | None = None,
        rate_limit_headers: bool = True,
        rate_limit_schedule: Iterable[tuple[float, float]] = (),
        rate_limit_tpm: float | None = None,
        reject_json_schema: bool = False,
        reject_tools: bool = False,
        reject_json_object: bool = False,
        reject_embeddings: bool = False,
        embedding_models: Iterable[str] | None = None,
        reward_model: RewardFn | None = None,
        batch_polls_until_done: int = 1,
        hold_batches: bool = False,
        batch_faults: Iterable[BatchFault] = (),
        shuffle_batch_output: bool = False,
        model: str = "fake-judge",
        served_model: str | None = None,
        system_fingerprint: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        dialect: str | Dialect = "openai",
        context_window: int | None = None,
        cache_model: str | CacheModel | None = None,
        prices: dict[str, Any] | None = None,
        flex_factor: float = 0.5,
        flex_full: bool = False,
        flex_refusals: int = 0,
        responses_only: Iterable[str] = (),
    ) -> None:
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"FakeProvider only binds loopback addresses, not {host!r}")
        self.dialect = resolve(dialect)
        # A model window: a longer prompt is refused in the dialect's wording (OpenAI's context_length_exceeded by default).
        self.context_window = context_window if context_window is not None else self.dialect.context_window
        # The provider's prompt cache and bill (judge.testing._fake_billing): with cache_model, chat usage is the
        # model's (cached and written tokens); the native routes always bill through it ("none" without one).
        model_of = CACHE_MODELS[cache_model] if isinstance(cache_model, str) else cache_model
        self.cache_model = model_of
        self.billing = Billing(model_of or CACHE_MODELS["none"], prices, flex_factor=flex_factor)
        self.flex_full = flex_full  # every flex request is refused for want of capacity (a 429) while True
        self.flex_refusals = flex_refusals  # ... or only the next this many
        self.flex_refused = 0  # flex requests answered "no capacity" so far
        self.responses_only = set(responses_only)  # models chat completions refuses (404): Responses API only
        self._last_prompt = ""  # the previous request's messages, for cached_tokens
        self.latency = latency
        self.rate_limit_rps = rate_limit_rps
        self.reject_json_schema = reject_json_schema
        self.reject_tools = reject_tools
        self.reject_json_object = reject_json_object
        self.reject_embeddings = reject_embeddings
        self.embedding_models = None if embedding_models is None else set(embedding_models)
        self.reward_model = reward_model
        self.model = model
        # What every reply says served it (a test may change them mid-run, as a provider does): the reply's ``model``
        # (default: the model the request names) and its ``system_fingerprint`` (default: none sent).
        self.served_model = served_model
        self.system_fingerprint = system_fingerprint
        self.host = host
        self.port = port
        self.base_url = ""
        self._lock = threading.Lock()
        self._script: deque[Reply] = deque(script)
        self._responder = responder
        self._requests: list[RecordedRequest] = []
        self._counter = itertools.count(1)
        self.rate_limit_burst = rate_limit_burst
        self.rate_limit_headers = rate_limit_headers
        self.rate_limit_schedule = sorted((float(t), float(r)) for t, r in rate_limit_schedule)
        self.rate_limit_tpm = rate_limit_tpm
        self._capacity = self._bucket_size(rate_limit_rps)
        self._tokens = self._capacity
        self._refilled = self._started = time.monotonic()
        self._tpm_tokens = (rate_limit_tpm or 0) / 60  # one second's worth of tokens per minute
        self.rate_limited = 0  # requests answered 429 by the rate limit
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._batch_api = BatchAPI(log=self._requests, log_lock=self._lock, answer=self._answer_batch_line,
                                   polls_until_done=batch_polls_until_done, held=hold_batches, faults=list(batch_faults),
                                   shuffle_output=shuffle_batch_output)

    # ---- test-facing controls --------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot (copies) of every request received so far, in arrival order."""
        with self._lock:
            return [dataclasses.replace(r) for r in self._requests]

    def chat_requests(self) -> list[RecordedRequest]:
        """Only the ``POST .../chat/completions`` requests, batch lines included (``batch_id`` set)."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def embedding_requests(self) -> list[RecordedRequest]:
        """Only the ``POST .../embeddings`` requests."""
        return [r for r in self.requests if r.path.endswith("/embeddings")]

    def push(self, *replies: Reply) -> None:
        """Append replies to the FIFO script."""
        with self._lock:
            self._script.extend(replies)

    def set_responder(self, fn: Responder | None) -> None:
        """Answer unscripted requests with ``fn(body)`` (returning None falls back to auto)."""
        with self._lock:
            self._responder = fn

    def reset(self) -> None:
        """Forget recorded requests, any remaining script and batch faults; zero the batch counters."""
        with self._lock:
            self._requests.clear()
            self._script.clear()
        self._batch_api.reset()

    # ---- Files and Batch API controls (see gradekit.judge.testing._fake_batch) ----------------------

    @property
    def files_uploaded(self) -> int:
        """``POST /v1/files`` uploads accepted."""
        return self._batch_api.files_uploaded

    @property
    def batches_created(self) -> int:
        """``POST /v1/batches`` batches created."""
        return self._batch_api.batches_created

    @property
    def batch_polls(self) -> int:
        """``GET /v1/batches/{id}`` polls answered."""
        return self._batch_api.batch_polls

    @property
    def file_downloads(self) -> int:
        """``GET /v1/files/{id}/content`` downloads answered."""
        return self._batch_api.file_downloads

    def batch_requests(self) -> list[RecordedRequest]:
        """Only the lines answered inside batches."""
        return [r for r in self.requests if r.batch_id is not None]

    def batch(self, batch_id: str) -> dict[str, Any]:
        """The batch object as a poll would show it now (without counting as a poll)."""
        return self._batch_api.batches[batch_id].payload()

    def hold_batches(self, hold: bool = True) -> None:
        """While held, every batch stays ``in_progress`` however often it is polled."""
        self._batch_api.held = hold

    def release_batches(self) -> None:
        """Let held batches finish at their next poll."""
        self._batch_api.held = False

    def push_batch_fault(self, *faults: BatchFault) -> None:
        """The next created batches end as these faults say (FIFO), instead of completing."""
        self._batch_api.faults.extend(faults)

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeProvider:
        """Serve on a daemon thread; returns once the port is bound and ``base_url`` is set."""
        if self._thread is not None:
            return self
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        # log_config=None: leave the host process's logging setup alone (records still propagate).
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", log_config=None,
                                access_log=False, lifespan="off", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._stopping = asyncio.Event()
        self._started = self._refilled = time.monotonic()  # the rate-limit schedule counts from here
        self._thread = threading.Thread(target=self._run, name="judge-fake-provider", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                self._thread = self._server = None
                raise RuntimeError(f"FakeProvider could not start on {self.host}:{self.port}")
            time.sleep(0.005)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"http://{host}:{port}/v1"
        return self

    def _run(self) -> None:
        assert self._server is not None
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._server.serve())
        finally:
            self._loop.close()

    def stop(self) -> None:
        """Wake pending delays, shut the server down and join its thread (idempotent)."""
        thread, server, loop = self._thread, self._server, self._loop
        if thread is None or server is None:
            return
        if loop is not None and self._stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:  # loop closed between the check and the call
                pass
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)
        self._thread = self._server = self._loop = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- request handling ------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = RecordedRequest(time=time.monotonic(), path=request.url.path,
                                 body=body if isinstance(body, dict) else None, headers=dict(request.headers), raw=raw)
        with self._lock:
            self._requests.append(record)
        gone = asyncio.Event()  # set when the client closes the connection before the answer
        watcher = asyncio.ensure_future(_watch_disconnect(request, gone))
        try:
            response = (await self._batch_api.handle(request.method, record.path, raw, request.headers.get("content-type", ""))
                        or await self._dispatch(request.method, record, gone))
        finally:
            watcher.cancel()
        with self._lock:
            record.cancelled = gone.is_set()
            record.status = 0 if isinstance(response, (_DroppedResponse, _DroppedStream)) or gone.is_set() else response.status_code
        return response

    async def _dispatch(self, method: str, record: RecordedRequest, gone: asyncio.Event | None = None) -> Response:
        if method == "GET" and record.path in ("/v1/fake/billing", "/fake/billing"):  # what this fake billed so far
            return JSONResponse({"billed_usd": self.billing.billed_usd, "by_tier": self.billing.billed_by_tier(),
                                 "cache_writes": self.billing.cache_writes, "requests_billed": len(self.billing.charges),
                                 "cache_model": self.billing.model.name})
        if method == "GET" and record.path in ("/v1/models", "/models"):
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model",
                                                             "created": 0, "owned_by": "gradekit.judge.testing"}]})
        if method == "POST" and self.reward_model is not None and record.path in REWARD_PATHS:
            return await self._reward(record, gone)
        embeddings = method == "POST" and record.path in ("/v1/embeddings", "/embeddings") and not self.reject_embeddings
        native = _NATIVE_ROUTES.get(record.path) if method == "POST" else None
        if not embeddings and native is None and (method != "POST" or record.path not in ("/v1/chat/completions", "/chat/completions")):
            return error_response(404, f"Unknown route {method} {record.path}", code="unknown_url")
        shape = "anthropic" if native == "messages" else None
        if record.body is None:
            return error_response(400, "Request body must be a JSON object.", shape=shape or "openai")
        refused, limits = self._rate_limited(record.body, shape=shape)
        if refused is not None:
            return refused
        if embeddings:
            response = self._embeddings_rejected(record.body) or await self._answer(record.body, embeddings=True, gone=gone)
        elif native is not None:
            problem = check_messages(record.body) if native == "messages" else check_responses(record.body)
            if problem is not None:
                response = self._error(400, problem, shape=shape)
            else:
                response = self._no_flex(record.body) or await self._answer(record.body, gone=gone, route=native)
        elif record.body.get("model") in self.responses_only:
            response = self._error(404, "This model is only supported in v1/responses and not in v1/chat/completions.", param="model")
        else:
            response = (self._rejected(record.body) or self._refused(record.body) or self._no_flex(record.body)
                        or await self._answer(record.body, gone=gone))
        response.headers.update(limits)
        return response

    async def _reward(self, record: RecordedRequest, gone: asyncio.Event | None) -> Response:
        """A reward model's route (:mod:`gradekit.judge.testing._fake_reward`): recorded, rate limited, then
        a scripted or responder's ``Reply`` (its faults apply: status, delay, drop, raw_body), else the score."""
        if record.body is None:
            return error_response(400, "Request body must be a JSON object.")
        try:
            text = reward_text(record.path, record.body)
        except ValueError as e:
            return error_response(400, str(e))
        refused, limits = self._rate_limited(record.body)
        if refused is not None:
            return refused
        with self._lock:
            reply = self._script.popleft() if self._script else None
            responder = self._responder
        if reply is None and responder is not None:
            try:
                result = responder(record.body)
                reply = await result if inspect.isawaitable(result) else result
            except Exception:
                reply = None  # a responder written for chat bodies has no say on a reward route
        reply = reply or Reply()
        latency = self.latency(record.body) if callable(self.latency) else self.latency
        await self._pause(latency + reply.delay, gone)
        if reply.drop:
            return _DroppedResponse()
        if reply.raw_body is not None:
            return Response(reply.raw_body, status_code=reply.status, headers=reply.headers, media_type="application/json")
        if reply.status != 200:
            return self._error(reply.status, reply.error_message or f"FakeProvider scripted error {reply.status}", headers=reply.headers)
        assert self.reward_model is not None
        payload = reward_payload(record.path, record.body, self.reward_model(text), model=self.model, text=text)
        response = JSONResponse(payload, headers=reply.headers)
        response.headers.update(limits)
        return response

    def _no_flex(self, body: dict[str, Any]) -> Response | None:
        """The 429 of a flex request the provider has no capacity for (OpenAI's "Resource Unavailable", not billed)."""
        if body.get("service_tier") != "flex":
            return None
        with self._lock:
            full = self.flex_full or self.flex_refusals > 0
            if full:
                self.flex_refusals = max(0, self.flex_refusals - 1)
                self.flex_refused += 1
        if not full:
            return None
        return self._error(429, "Resource Unavailable: there is no flex processing capacity for this request now. Retry "
                                "later, or send it at the standard tier. You are not charged for this request.",
                           code="resource_unavailable")

    def _error(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
               headers: dict[str, str] | None = None, details: list[dict[str, Any]] | None = None,
               shape: str | None = None) -> JSONResponse:
        return error_response(status, message, code=code, param=param, headers=headers,
                              shape=shape or self.dialect.error_shape, details=details)

    async def _answer_batch_line(self, body: Any) -> Response:
        """A batch line through the live dispatch: capability rejections, the dialect's refusals, then the script."""
        return self._rejected(body) or self._refused(body) or await self._answer(body)

    def _refused(self, body: dict[str, Any]) -> Response | None:
        """The dialect's error for a body its provider refuses (one per request, in the dialect's order),
        then its context-length refusal for a prompt over its window."""
        refusal = self.dialect.refuse(body) or self.dialect.overflowed(body, prompt_tokens_of(body, self.dialect), self.context_window)
        if refusal is None:
            return None
        return self._error(refusal.status, refusal.message, code=refusal.code, param=refusal.param)

    def _embeddings_rejected(self, body: dict[str, Any]) -> Response | None:
        """The 404 for a model the server does not have, the 400 for an input OpenAI refuses."""
        model = body.get("model")
        if self.embedding_models is not None and model not in self.embedding_models:
            return error_response(404, f"The model '{model}' does not exist or you do not have access to it.",
                                  code="model_not_found")
        texts = embedding_inputs(body)
        return error_response(400, texts, param="input") if isinstance(texts, str) else None

    def _bucket_size(self, rps: float | None) -> float:
        return max(1.0, self.rate_limit_burst if self.rate_limit_burst is not None else (rps or 1.0))

    def _scheduled_rps(self, now: float) -> float | None:
        """The limit in force now: ``rate_limit_rps``, or the last schedule entry whose time has come."""
        rps = self.rate_limit_rps
        for at, scheduled in self.rate_limit_schedule:
            if now - self._started >= at:
                rps = scheduled
        return rps

    def _rate_limited(self, body: dict[str, Any], shape: str | None = None) -> tuple[Response | None, dict[str, str]]:
        """Token buckets: requests (capacity ``rate_limit_burst``, refilled at the scheduled rps) and
        tokens per minute. Returns the 429 (or None) and the ``x-ratelimit-*`` headers to send."""
        with self._lock:
            now = time.monotonic()
            rps = self._scheduled_rps(now)
            tpm = self.rate_limit_tpm
            if not rps and not tpm:
                return None, {}
            elapsed, self._refilled = now - self._refilled, now
            if rps:
                capacity = self._bucket_size(rps)
                self._capacity = capacity
                self._tokens = min(capacity, self._tokens + elapsed * rps)
            if tpm:
                self._tpm_tokens = min(tpm / 60, self._tpm_tokens + elapsed * tpm / 60)
                # an embeddings body has ``input`` instead of messages
                cost = (_text_len(body.get("messages")) + len(str(body.get("input") or ""))) // 4 + int(body.get("max_tokens") or 16)
            waits = []
            if rps and self._tokens < 1:
                waits.append((1 - self._tokens) / rps)
            if tpm and self._tpm_tokens < cost:
                waits.append((cost - self._tpm_tokens) / (tpm / 60))
            if not waits:
                if rps:
                    self._tokens -= 1
                if tpm:
                    self._tpm_tokens -= cost
            headers = self._limit_headers(rps, tpm) if self.rate_limit_headers else {}
            if not waits:
                return None, headers
            self.rate_limited += 1
            wait = max(waits)
        what = f"{rps:g} requests per second" if rps and self._tokens < 1 else f"{tpm:g} tokens per minute"
        if shape is None and self.dialect.error_shape == "gemini":
            # Gemini says how long to wait only in the body (google.rpc.RetryInfo), never in a header.
            details = [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}]},
                       {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{wait:.3f}s"}]
            return self._error(429, f"You exceeded your current quota: {what}. Please retry in {wait:.3f}s.",
                               details=details), headers
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
        if self.dialect.rate_headers == "openai":
            headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
        return self._error(429, f"Rate limit reached: {what}. Please retry after {wait:.3f}s.",
                           code="rate_limit_exceeded", headers=headers, shape=shape), headers

    def _limit_headers(self, rps: float | None, tpm: float | None) -> dict[str, str]:
        """The dialect's rate-limit headers: OpenAI's ``x-ratelimit-*`` (limits per minute, what remains, and
        the duration until the bucket is full again), Anthropic's ``anthropic-ratelimit-*`` (the same, the
        reset as an RFC 3339 time), or none (Gemini)."""
        headers: dict[str, str] = {}
        if self.dialect.rate_headers == "none":
            return headers
        if self.dialect.rate_headers == "anthropic":
            if rps:
                headers.update({"anthropic-ratelimit-requests-limit": str(round(rps * 60)),
                                "anthropic-ratelimit-requests-remaining": str(max(0, math.floor(self._tokens))),
                                "anthropic-ratelimit-requests-reset": rfc3339((self._capacity - self._tokens) / rps)})
            if tpm:
                headers.update({"anthropic-ratelimit-tokens-limit": str(round(tpm)),
                                "anthropic-ratelimit-tokens-remaining": str(max(0, math.floor(self._tpm_tokens))),
                                "anthropic-ratelimit-tokens-reset": rfc3339((tpm / 60 - self._tpm_tokens) / (tpm / 60))})
            return headers
        if rps:
            headers.update({"x-ratelimit-limit-requests": str(round(rps * 60)),
                            "x-ratelimit-remaining-requests": str(max(0, math.floor(self._tokens))),
                            "x-ratelimit-reset-requests": openai_duration((self._capacity - self._tokens) / rps)})
        if tpm:
            headers.update({"x-ratelimit-limit-tokens": str(round(tpm)),
                            "x-ratelimit-remaining-tokens": str(max(0, math.floor(self._tpm_tokens))),
                            "x-ratelimit-reset-tokens": openai_duration((tpm / 60 - self._tpm_tokens) / (tpm / 60))})
        return headers

    def _rejected(self, body: dict[str, Any]) -> Response | None:
        """400s for features the simulated model does not support."""
        kind = (body.get("response_format") or {}).get("type")
        if self.reject_json_schema and kind == "json_schema":
            return self._error(400, "Invalid parameter: 'response_format' of type 'json_schema' is not "
                                  "supported with this model.", param="response_format")
        if self.reject_json_object and kind == "json_object":
            return self._error(400, "Invalid parameter: 'response_format' of type 'json_object' is not "
                                  "supported with this model.", param="response_format")
        if self.reject_tools and body.get("tools"):
            return self._error(400, "Invalid parameter: 'tools' is not supported with this model.", param="tools")
        return None

    async def _answer(self, body: dict[str, Any], *, embeddings: bool = False, gone: asyncio.Event | None = None,
                      route: str = "chat") -> Response:
        native, body = (body, chat_view(body, route)) if route != "chat" else (None, body)
        billed = not embeddings and (route != "chat" or self.cache_model is not None)
        if billed:  # the cache is read on arrival and written once the request completes
            segments = messages_segments(native) if route == "messages" else chat_segments(native or body, self.billing.model)
            prompt, cached, writes = self.billing.lookup(segments)
            written = self.billing.written_tokens(segments, writes, cached)
        with self._lock:
            reply = self._script.popleft() if self._script else None
            responder = self._responder
        try:
            if reply is None and responder is not None:
                result = responder(body)
                reply = await result if inspect.isawaitable(result) else result
        except Exception as exc:  # surface responder bugs to the client instead of a bare 500
            if not embeddings:
                return error_response(500, f"FakeProvider responder raised {type(exc).__name__}: {exc}")
            reply = None  # a responder written for chat bodies (body["messages"]) has no say on embeddings
        if reply is None:
            reply = Reply() if embeddings else auto_reply(body)
        latency = self.latency(body) if callable(self.latency) else self.latency
        await self._pause(latency + reply.delay, gone)
        stream = bool(body.get("stream")) and not embeddings
        if reply.drop:
            return _DroppedStream(self._chunks(reply, body)[:2]) if stream else _DroppedResponse()
        if reply.raw_body is not None:
            return Response(reply.raw_body, status_code=reply.status, headers=reply.headers,
                            media_type="application/json")
        if reply.status != 200:
            return self._error(reply.status, reply.error_message or f"FakeProvider scripted error {reply.status}",
                               headers=reply.headers, shape="anthropic" if route == "messages" else None)
        if embeddings:
            texts = embedding_inputs(body)
            assert not isinstance(texts, str)  # refused in _embeddings_rejected
            return JSONResponse(embeddings_payload(body, texts, model=self.model), headers=reply.headers)
        if stream and reply.endless is not None:
            return StreamingResponse(self._endless(reply, body), media_type="text/event-stream", headers=reply.headers)
        if stream:
            events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in self._chunks(reply, body)]
            events.append("data: [DONE]\n\n")
            return StreamingResponse(iter(events), media_type="text/event-stream", headers=reply.headers)
        tier = "flex" if body.get("service_tier") == "flex" else "default"
        if route == "messages":
            thinking = None
            if isinstance(native.get("thinking"), dict) and native["thinking"].get("type") == "enabled":  # type: ignore[union-attr]
                thinking = reply.reasoning if reply.reasoning is not None else \
                    draft_reasoning(body, reply.content or (reply.tool_call or {}).get("arguments"))
            payload = messages_payload(reply, native, number=next(self._counter), thinking=thinking,  # type: ignore[arg-type]
                                       prompt=prompt, cached=cached, written=written)
            spent = payload["usage"]
            read, wrote = int(spent.get("cache_read_input_tokens") or 0), int(spent.get("cache_creation_input_tokens") or 0)
            billed_counts = (int(spent.get("input_tokens") or 0) + read + wrote, read, wrote, int(spent.get("output_tokens") or 0))
        elif route == "responses":
            payload = responses_payload(reply, native, number=next(self._counter), prompt=prompt, cached=cached,  # type: ignore[arg-type]
                                        written=written, tier=tier)
            spent, details = payload["usage"], payload["usage"].get("input_tokens_details") or {}
            billed_counts = (int(spent.get("input_tokens") or 0), int(details.get("cached_tokens") or 0),
                             int(details.get("cache_write_tokens") or 0), int(spent.get("output_tokens") or 0))
        else:
            payload = completion_payload(reply, body, number=next(self._counter), model=self.model,
                                         dialect=self.dialect, cached_tokens=self._cached_tokens(body), served_model=self.served_model,
                                         system_fingerprint=self.system_fingerprint)
            if billed and reply.usage is None:
                details = {"cached_tokens": cached}
                details["cache_creation_input_tokens" if self.billing.model.usage == "dashscope" else "cache_write_tokens"] = written
                payload["usage"] = {**payload["usage"], "prompt_tokens": prompt, "total_tokens": prompt + payload["usage"]["completion_tokens"],
                                    "prompt_tokens_details": {**(payload["usage"].get("prompt_tokens_details") or {}), **details}}
            if billed or "service_tier" in body:
                payload["service_tier"] = tier
            spent, details = payload["usage"], payload["usage"].get("prompt_tokens_details") or {}
            billed_counts = (int(spent.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0),
                             int(details.get("cache_write_tokens") or details.get("cache_creation_input_tokens") or 0),
                             int(spent.get("completion_tokens") or 0))
        if billed:  # what the reply reports is what is billed (a scripted usage included)
            self.billing.charge(str(body.get("model") or self.model), tier, *billed_counts)
            self.billing.completed(writes)
        return JSONResponse(payload, headers=reply.headers)

    async def _endless(self, reply: Reply, body: dict[str, Any]) -> AsyncIterator[str]:
        """An ``endless`` stream: its first chunk, then a keep-alive comment or a reasoning delta forever."""
        first, *_ = self._chunks(reply.model_copy(update={"endless": None}), body)
        yield f"data: {json.dumps(first, ensure_ascii=False)}\n\n"
        field = self.dialect.reasoning_field or "reasoning_content"
        while self._stopping is not None and not self._stopping.is_set():
            await self._pause(reply.endless_every)
            if reply.endless == "keep-alive":
                yield ": keep-alive\n\n"
            else:
                delta = {**first, "choices": [{"index": 0, "delta": {field: "Let me think again. "}, "finish_reason": None}]}
                yield f"data: {json.dumps(delta, ensure_ascii=False)}\n\n"

    def _chunks(self, reply: Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
        return completion_chunks(reply, body, number=next(self._counter), model=self.model, dialect=self.dialect,
                                 cached_tokens=self._cached_tokens(body), served_model=self.served_model,
                                 system_fingerprint=self.system_fingerprint)

    def _cached_tokens(self, body: dict[str, Any]) -> int:
        """Prompt tokens shared with the previous request's messages: the fake's prompt cache.

        A simplification of OpenAI's (which caches prompts from 1,024 tokens on, in 128-token steps):
        any prefix shared with the previous request counts, so small test prompts show cached tokens.
        """
        prompt = json.dumps(body.get("messages"), ensure_ascii=False, sort_keys=True)
        with self._lock:
            previous, self._last_prompt = self._last_prompt, prompt
        shared = 0
        for a, b in zip(previous, prompt):
            if a != b:
                break
            shared += 1
        return shared // 4

    async def _pause(self, seconds: float, gone: asyncio.Event | None = None) -> None:
        """Sleep without blocking other requests; cut short when the server is stopping or the client left."""
        if seconds <= 0 or self._stopping is None:
            return
        waits = [asyncio.ensure_future(self._stopping.wait())]
        if gone is not None:
            waits.append(asyncio.ensure_future(gone.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


_NATIVE_ROUTES = {"/v1/messages": "messages", "/messages": "messages", "/v1/responses": "responses", "/responses": "responses"}


async def _watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client closes the connection (its request body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return
