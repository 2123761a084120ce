"""What the fake provider puts on the wire and keeps of it: OpenAI-style errors, a dropped reply, recorded requests.

Shared by the live chat-completions handler (``_fake_provider``) and the Batch API
(``_fake_batch``), which answers batch lines through the same dispatch.
"""

from __future__ import annotations

import dataclasses
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
    """

    time: float
    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    status: int = 0
    batch_id: str | None = None


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_exceeded"}


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(payload, status_code=status, headers=headers)


class _DroppedResponse(Response):
    """Promises a 1 KiB body, sends a few bytes, then returns: uvicorn closes the socket."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"1024")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})
