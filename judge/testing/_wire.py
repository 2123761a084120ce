"""What the fake provider puts on the wire and keeps of it: OpenAI-style errors, a dropped reply, recorded requests.

Shared by the live chat-completions handler (``_fake_provider``) and the Batch API
(``_fake_batch``), which answers batch lines through the same dispatch.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send


@dataclasses.dataclass
class RecordedRequest:
    """One request as the fake saw it, so tests can assert on what a client actually sent.

    Attributes:
        time: ``time.monotonic()`` at arrival (compare gaps to check client-side pacing).
        path: URL path, e.g. ``/v1/chat/completions``.
        body: Parsed JSON body, or None if the body was not JSON.
        headers: Request headers (lower-case names).
        status: Status the fake answered with; 0 while still pending or when the reply was
            ``drop`` (no complete response was sent).
        batch_id: For a line answered inside a batch, the batch's id (path and body are the
            line's ``url`` and ``body``, headers empty); None for a live HTTP request.
        cancelled: The client closed the connection before the answer was sent (a hedged request's
            loser, a client timeout): the fake stopped waiting and sent nothing.
        raw: The body's bytes as they arrived (two clients that mean the same JSON may not send the same bytes).
    """

    time: float
    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    status: int = 0
    batch_id: str | None = None
    cancelled: bool = False
    raw: bytes = b""


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_exceeded"}


_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                  429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None, shape: str = "openai",
                   details: list[dict[str, Any]] | None = None) -> JSONResponse:
    """An error body as the provider writes it.

    ``openai`` (and compatible servers): ``{"error": {"message", "type", "param", "code"}}``;
    ``dashscope`` adds ``id`` and ``request_id`` beside it; ``ark`` types a 400 ``BadRequest``;
    ``gemini`` is a JSON array ``[{"error": {"code", "message", "status", "details"}}]``; ``anthropic``
    (the Messages API) is ``{"type": "error", "error": {"type", "message"}}``.
    """
    if shape == "gemini":
        error: dict[str, Any] = {"code": status, "message": message, "status": _GOOGLE_STATUS.get(status, "UNKNOWN")}
        if details:
            error["details"] = details
        return JSONResponse([{"error": error}], status_code=status, headers=headers)
    if shape == "anthropic":
        # Anthropic's Messages API: {"type": "error", "error": {"type", "message"}} (its error-types list).
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return JSONResponse({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"},
                            status_code=status, headers=headers)
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if shape == "ark" and status == 400:
        kind = "BadRequest"
    payload: dict[str, Any] = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    if shape == "dashscope":
        payload["id"] = payload["request_id"] = "fake-dashscope-request"
    return JSONResponse(payload, status_code=status, headers=headers)


class _DroppedResponse(Response):
    """Promises a 1 KiB body, sends a few bytes, then returns: uvicorn closes the socket."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"1024")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})


class _DroppedStream(Response):
    """Starts a server-sent event stream, sends a few events, then returns: the stream breaks mid-reply."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        super().__init__()
        self._events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"content-length", b"65536")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in self._events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
