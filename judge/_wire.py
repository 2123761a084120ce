"""The wire: what one request looks like to the SDK and what comes back.

The SDK's arguments for a request (unknown keys in ``extra_body``), one raw post, a streamed reply
assembled into the body it stands for, the usage a reply reports, and the SDK's exceptions as the
judge's error kinds. Nothing here knows endpoints, fleets, caches or rubrics: the fleet
(:mod:`gradekit.judge._fleet`) sends through it, the client (:mod:`gradekit.judge._client`) reads what it raises.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import socket
import ssl
import sys
from collections.abc import Mapping
from typing import Any, Literal

import openai

from ._dialect import answered, error_fields, names_output_format, on_wire
from ._fastwire import FastWire
from ._retry import is_local, is_not_recorded
from ._reward_model import NoScore, read_reward, server_root
from ._sdk import sdk_http, whole_request_seconds
from ._verdict import NO_USAGE, ErrorKind, Usage
from ._window import overflow_of


# "responses" and "anthropic": a judgement sent through the OpenAI Responses API or Anthropic's Messages API
# (judge._native), built and read as a chat completion; the last four: a served reward model's routes (judge._reward_model).
Route = Literal["chat", "embeddings", "responses", "anthropic", "/classify", "/pooling", "/v1/classify", "/v1/embeddings"]

class Failed(Exception):
    """A request that failed for good, as the judge's error kind and message."""

    def __init__(self, kind: ErrorKind, message: str, status: int | None = None, *, output_format: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status  # the HTTP status, when the server answered with one
        self.output_format = output_format  # a 400 about the output format: another ask mode may work


# A wrong key, a key without access, or a model the server does not have: another output format
# would fail the same way, so the row fails at once instead of walking the fallback chain.
NO_FALLBACK = (401, 403, 404)


def status_message(exc: openai.APIStatusError) -> str:
    return status_text(exc.status_code, status_detail(exc.status_code, exc.body))


def status_detail(status: int, body: Any) -> str:
    """``Error code: 404 - no such model``: the SDK's words for an error status, the same in every SDK version.

    openai 1.x put the whole error object in its message, later versions only the provider's message;
    rows, a batch line's errors and tests read the same text whichever is installed.
    """
    error = body.get("error", body) if isinstance(body, dict) else body
    said = error.get("message") if isinstance(error, dict) else error
    return f"Error code: {status}" + (f" - {said}" if isinstance(said, str) and said else "")


def status_text(status: int, detail: str) -> str:
    hint = {
        401: "authentication failed: check OPENAI_API_KEY or `api_key`",
        403: "permission denied for this key or model",
        404: "not found: check `model` and that `base_url` ends in the API root (often …/v1)",
    }.get(status)
    return f"HTTP {status}: {hint + ' — ' if hint else ''}{detail}"


def status_error_kind(status: int) -> ErrorKind:
    """The ErrorKind of an HTTP error status, live or inside a batch result line."""
    if status == 429:
        return "rate_limited"
    return "server_error" if status >= 500 else "bad_request"


def error_of(exc: BaseException) -> Failed:
    if is_local(exc):
        return Failed("local_error", local_message(exc))
    if is_not_recorded(exc):
        return Failed("not_recorded", "the cassette has no recorded reply for this request")
    if isinstance(exc, openai.RateLimitError):
        return Failed("rate_limited", f"rate limited until the retry budget ran out: {exc}")
    if isinstance(exc, openai.APITimeoutError):
        return Failed("timeout", f"the judge did not answer within the timeout ({url_of(exc)})")
    if isinstance(exc, openai.APIStatusError):
        code, param, said = error_fields(exc.body, status_message(exc))
        if exc.status_code == 400 and overflow_of(code, said) is not None:  # the prompt is over the judge's window
            return Failed("context_overflow", status_message(exc), 400)
        return Failed(status_error_kind(exc.status_code), status_message(exc), exc.status_code,
                       output_format=exc.status_code == 400 and names_output_format(code, param, said))
    if isinstance(exc, openai.APIConnectionError):
        # The URL tried, so a wrong ``base_url`` or a server not listening reads as such.
        return Failed("server_error", f"connection to {url_of(exc)} failed: {exc}{cause_of(exc)}")
    return Failed("server_error", f"{type(exc).__name__}: {exc}")


def local_message(exc: BaseException) -> str:
    """A failure in this process, said as one: its cause (the exception and where it was raised) and its fix."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    where = f" (at {frames[-1].filename.rsplit('/site-packages/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, ImportError):
        fix = ("a module gradekit needs cannot be imported in this environment: reinstall gradekit and its dependencies "
               "here (pip install gradekit, with the extra the feature names, e.g. 'gradekit[ray]')")
    elif isinstance(exc, OSError):
        fix = "a service or file this process relies on failed (the shared limiter's Redis, the cache's disk): see the cause"
    elif isinstance(exc, UnicodeError):
        fix = "the row holds text that cannot be encoded (a lone surrogate such as \\ud800): clean that cell of the input"
    else:
        fix = ("a bug in gradekit or in a rubric template or plug-in it runs: fix the template, or report it with this message "
               "(GRADEKIT_TRACEBACK=1 prints the traceback of a crash)")
    return (f"{type(exc).__name__}: {exc}{where}: a failure in this process, not at the judge; no request was sent "
            f"for it. Fix: {fix}")


def url_of(exc: BaseException) -> str:
    request = getattr(exc, "request", None)
    url = getattr(request, "url", None)
    return str(url) if url is not None else "the judge"


_CUT_SHORT = re.compile(r"received \d+(?: bytes, expected| of) \d+|without sending complete message body")


def cause_of(exc: BaseException) -> str:
    """The socket-level reason under the SDK's generic "Connection error.", in words that do not depend on
    the HTTP library that met it (the SDK's own, or the fast wire's aiohttp), so a row reads the same either
    way: refused, reset, closed before or while answering, a host name that does not resolve, TLS. Any
    other cause is said as its type and message."""
    chain: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 16:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for cause in chain:
        text = str(cause)
        if isinstance(cause, ConnectionRefusedError):
            return " (connection refused: nothing listens there)"
        if isinstance(cause, socket.gaierror):
            return f" (the host name does not resolve: {cause.strerror or text})"
        if isinstance(cause, ssl.SSLError):
            return f" (TLS failed: {cause.reason or text})"
        if isinstance(cause, ConnectionResetError):
            return " (the connection was reset)"
        if _CUT_SHORT.search(text) is not None or "payload is not completed" in text:
            return " (the server closed the connection mid-answer)"  # not every library counts the bytes
        if "Server disconnected" in text:
            return " (the server closed the connection before answering)"
    said = next((c for c in chain if str(c)), None)
    return f" ({type(said).__name__}: {said})" if said is not None else ""


def breaker_failure(exc: BaseException) -> tuple[str, str] | None:
    """What a failed request tells the run's breaker: (kind, message) if it says the judge is broken.

    None for a 429 (the provider is alive and pacing is the limiter's job), a missing cassette
    entry, and 4xx other than 401/403/404 (the server answered; the request was at fault).
    """
    if isinstance(exc, openai.RateLimitError) or is_not_recorded(exc) or is_local(exc):
        return None  # a local failure is no request, and says nothing about the judge
    if isinstance(exc, openai.APIStatusError) and exc.status_code < 500 and exc.status_code not in NO_FALLBACK:
        return None
    failure = error_of(exc)
    return failure.kind, str(failure)



def served_of(completion: Mapping[str, Any]) -> dict[str, str | None]:
    """Who answered, as the reply says: its ``model`` and ``system_fingerprint`` (None where it gives none)."""
    model, fingerprint = completion.get("model"), completion.get("system_fingerprint")
    return {"served_model": model if isinstance(model, str) and model else None,
            "system_fingerprint": fingerprint if isinstance(fingerprint, str) and fingerprint else None}


def vectors_of(response: Mapping[str, Any], count: int) -> list[list[float]]:
    """The ``count`` vectors of an embeddings response in input order, or [] if it does not hold them all."""
    data = response.get("data")
    if not isinstance(data, list) or len(data) != count:
        return []
    items = sorted(data, key=lambda item: item.get("index", 0) if isinstance(item, dict) else 0) if count > 1 else data
    vectors = []
    for item in items:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list) or not vector or \
                not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector):
            return []  # also NaN or Infinity, which Python's JSON reader lets through
        vectors.append([float(x) for x in vector])
    return vectors



_SDK_CHAT_ARGUMENTS: frozenset[str] | None = None


def sdk_arguments(request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` as keyword arguments of the SDK's ``chat.completions.create``: keys the SDK does
    not know (DashScope's ``enable_thinking``, Ark's ``thinking``, vLLM's ``top_k``) go in
    ``extra_body``, so they reach the request body as the user wrote them."""
    global _SDK_CHAT_ARGUMENTS
    if _SDK_CHAT_ARGUMENTS is None:
        import inspect

        from openai.resources.chat.completions import AsyncCompletions

        _SDK_CHAT_ARGUMENTS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self", "extra_body"}
    known = {k: v for k, v in request.items() if k in _SDK_CHAT_ARGUMENTS}
    extra = {k: v for k, v in request.items() if k not in _SDK_CHAT_ARGUMENTS}
    if extra:
        known["extra_body"] = extra
    return known


def usage_detail(usage: Mapping[str, Any], part: str, name: str) -> int:
    """A count inside usage's ``*_tokens_details`` (absent or null on most providers)."""
    details = usage.get(part)
    value = details.get(name) if isinstance(details, Mapping) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


async def assemble_stream(raw: Any) -> dict[str, Any]:
    """A streamed chat completion as the one non-streaming body it stands for.

    Content and reasoning deltas (``reasoning_content`` / ``reasoning``) are joined apart, tool
    call deltas by index; the usage chunk (``stream_options.include_usage``) gives the usage.
    """
    stream = raw.parse()  # the AsyncStream itself (parse is sync for a stream)
    if asyncio.iscoroutine(stream):
        stream = await stream
    content: list[str] = []
    reasoning: dict[str, list[str]] = {}
    calls: dict[int, dict[str, Any]] = {}
    finish_reason = None
    usage = None
    last: dict[str, Any] = {}
    fingerprint = None
    async for chunk in stream:
        data = chunk.model_dump() if hasattr(chunk, "model_dump") else dict(chunk)
        last = data
        fingerprint = data.get("system_fingerprint") or fingerprint
        if data.get("usage"):
            usage = data["usage"]
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for name in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(name), str) and delta[name]:
                    reasoning.setdefault(name, []).append(delta[name])
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(int(call.get("index") or 0), {"id": None, "type": "function",
                                                                      "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                finish_reason = choice["finish_reason"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
    for name, parts in reasoning.items():
        message[name] = "".join(parts)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    choices = [{"index": 0, "message": message, "finish_reason": finish_reason}] if (content or reasoning or calls or finish_reason) else []
    body = {"id": last.get("id"), "object": "chat.completion", "model": last.get("model"), "choices": choices,
            "usage": usage or {}}
    if fingerprint:
        body["system_fingerprint"] = fingerprint
    return body



async def post(client: Any, request: Mapping[str, Any], route: Route = "chat", fast: FastWire | None = None) -> tuple[Any, Any]:
    """One request as the raw HTTP reply and its JSON body (a stream assembled into one body).

    The raw body, not the SDK's pydantic objects: the cache stores JSON anyway, and skipping model
    construction halves the client's CPU per judgement. The client's timeout bounds the whole request
    (first byte, every gap and the total): the SDK's own is per read, so a stream of keep-alive comments
    or reasoning deltas that never ends would hold the row for ever. Past it the request is an
    ``APITimeoutError``, as the SDK's own timeout is, and the row ends as ``timeout``.

    ``fast``: the client's fast wire (:mod:`gradekit.judge._fastwire`), which carries a non-streamed chat
    request; everything else goes through the SDK.
    """
    if fast is not None and (route != "chat" or request.get("stream")):
        fast = None
    seconds = whole_request_seconds(client)
    if seconds is None:
        return await _post(client, request, route, fast)
    try:
        if sys.version_info >= (3, 11):  # no extra task per request (the client's hot path)
            async with asyncio.timeout(seconds):
                return await _post(client, request, route, fast)
        return await asyncio.wait_for(_post(client, request, route, fast), seconds)
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        raise openai.APITimeoutError(request=sdk_http().Request("POST", route_url(client, route))) from None


def route_url(client: Any, route: Route) -> str:
    """Where ``route`` goes: chat and embeddings under the client's base URL, a reward model's routes
    under the server's root (vLLM's ``/classify`` is not under ``/v1``)."""
    base = str(getattr(client, "base_url", "")).rstrip("/")
    if route.startswith("/"):
        return server_root(base) + route
    return f"{base}/{'embeddings' if route == 'embeddings' else 'chat/completions'}"


async def _post(client: Any, request: Mapping[str, Any], route: Route, fast: FastWire | None = None) -> tuple[Any, Any]:
    if route == "embeddings":
        raw = await client.embeddings.with_raw_response.create(**request)
    elif route.startswith("/"):  # a reward model's route: the SDK's client.post, to an absolute URL
        raw = await client.post(route_url(client, route), body=request, cast_to=sdk_http().Response)
    else:
        if fast is not None:
            send: Any = functools.partial(fast.send, request)
        elif request.get("stream"):  # the SDK's SSE reader assembles the deltas (assemble_stream)
            send = functools.partial(client.chat.completions.with_raw_response.create, **sdk_arguments(request))
        else:
            # The SDK's documented way to call any route (``client.post`` with its transport's Response as cast_to):
            # the body exactly as built here, with the client's auth, base URL, default query (Azure's
            # api-version), timeout and error classes, but not create()'s per-call transform of its
            # arguments, which was 30% of the client's CPU per request (benchmarks/throughput.py (c)).
            send = functools.partial(client.post, "/chat/completions", body=request, cast_to=sdk_http().Response)
        on_wire()  # the SDK's resources and the arguments are built: the learning window starts now
        try:
            raw = await send()
        except openai.BadRequestError:
            answered()  # a refusal: the others wait for its lesson
            raise
        # Only an answer or a refusal ends the learner's window early. A 429, a 5xx or a timeout teaches
        # nothing about the request, and its retries may take minutes: the window runs out as usual
        # and the others go unheld, instead of waiting behind one request's 429 budget.
        answered()
        if fast is not None:
            return raw  # the reply and its body, read by the fast wire
    if not request.get("stream"):
        return raw, json.loads(raw.content)
    try:
        return raw, await assemble_stream(raw)
    finally:
        close = getattr(getattr(raw, "http_response", None), "aclose", None)
        if close is not None:
            await close()  # a stream cut off at the deadline gives its connection back


def reply_usage(spent: Mapping[str, Any], tier: str | None = None) -> Usage:
    """The request that got this reply and the reply's ``usage``, as a Usage (``tier``: the service tier that billed it;
    a flex reply's counts are its flex part too)."""
    counts = usage_counts(spent)
    return Usage(requests=1, **counts, **({f"flex_{name}": value for name, value in counts.items()} if tier == "flex" else {}))


def spent_by(exc: BaseException) -> Usage:
    """What the requests that ended in ``exc`` billed (a failed request is a request too); nothing sent: zero."""
    spent = getattr(exc, "gradekit_usage", None)
    return spent if isinstance(spent, Usage) else NO_USAGE


def carrying(exc: BaseException, spent: Usage) -> BaseException:
    """``exc`` saying ``spent`` (all the raising scope sent, the failed attempt's included) to the code that counts it.

    A failure leaves the wire as an exception, so it carries its usage: the caller adds it like a reply's."""
    exc.gradekit_usage = spent  # type: ignore[attr-defined]
    return exc


def usage_counts(spent: Mapping[str, Any]) -> dict[str, int]:
    """A chat completion's usage as the Verdict's counts. Cache writes: OpenAI's ``cache_write_tokens`` and
    DashScope's ``cache_creation_input_tokens`` in ``prompt_tokens_details`` (the native transports put
    Anthropic's there too)."""
    return {"prompt_tokens": int(spent.get("prompt_tokens") or 0), "completion_tokens": int(spent.get("completion_tokens") or 0),
            "reasoning_tokens": usage_detail(spent, "completion_tokens_details", "reasoning_tokens"),
            "cached_tokens": usage_detail(spent, "prompt_tokens_details", "cached_tokens"),
            "cache_write_tokens": usage_detail(spent, "prompt_tokens_details", "cache_write_tokens")
            or usage_detail(spent, "prompt_tokens_details", "cache_creation_input_tokens")}


def check_body(completion: Any, request: Mapping[str, Any], route: Route) -> None:
    """A 200 whose body is not a completion (or lacks a vector) is transient: raise ValueError to retry it."""
    if route == "embeddings":
        if not vectors_of(completion, len(request["input"])):
            raise ValueError("embeddings response has no vector for every input")  # a malformed 200: transient
    elif route.startswith("/"):
        read = read_reward(route, completion)
        if isinstance(read, NoScore) and read.malformed:
            raise ValueError(read.message)  # a malformed 200: transient (a well-formed refusal is the judge's to say)
    elif not completion.get("choices"):
        raise ValueError("completion has no choices")  # a malformed 200: transient
