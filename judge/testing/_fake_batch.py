"""The fake provider's Files and Batch API: upload a JSONL of requests, run it as a batch, download results.

Each batch line is answered by the provider's own live dispatch (capability rejections, then the
script, the responder or :func:`auto_reply`), so a test scripts batch lines exactly as it scripts
live requests. Lines are answered when a poll finds the batch due -- after
``batch_polls_until_done`` polls and once batches are not held -- which makes the progression a
function of the client's polls, not of wall-clock time. Batch lines skip the live rate limit:
a real provider meters the Batch API separately.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from email import policy
from email.parser import BytesParser
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

from ._wire import RecordedRequest, _DroppedResponse, error_response


TERMINAL = ("completed", "failed", "expired", "cancelled")
_ENDPOINTS = ("/v1/chat/completions", "/chat/completions")
_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


class BatchFault(BaseModel):
    """How the next created batch ends instead of completing (FIFO, one fault per batch).

    Attributes:
        status: ``"failed"`` (rejected as a whole, no output), ``"expired"`` (the completion
            window ran out) or ``"cancelled"`` (cancelled by the provider).
        answered: For expired/cancelled: lines answered before the batch stopped; the rest get a
            ``batch_expired`` / ``batch_cancelled`` error line.
        message: The ``errors.data[0].message`` of a failed batch.
    """

    model_config = ConfigDict(extra="forbid")

    status: Literal["failed", "expired", "cancelled"]
    answered: int = 0
    message: str = "FakeProvider: scripted batch failure"


@dataclasses.dataclass
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.content), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": None, "status_details": None}


@dataclasses.dataclass
class _Batch:
    id: str
    number: int
    input_file_id: str
    endpoint: str
    metadata: dict[str, str] | None
    lines: list[dict[str, Any]]
    invalid: list[dict[str, Any]]  # validation errors: the batch fails as a whole
    fault: BatchFault | None
    created_at: int
    status: str = "validating"
    polls: int = 0
    cancel_requested: bool = False
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    times: dict[str, int] = dataclasses.field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        errors = {"object": "list", "data": self.invalid} if self.invalid and self.status == "failed" else None
        stamps = {f"{name}_at": self.times.get(name) for name in
                  ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")}
        return {"id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
                "input_file_id": self.input_file_id, "completion_window": "24h", "status": self.status,
                "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
                "created_at": self.created_at, "expires_at": self.created_at + 86_400, **stamps,
                "request_counts": {"total": len(self.lines), "completed": self.completed, "failed": self.failed},
                "metadata": self.metadata}


def _error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> JSONResponse:
    return error_response(status, message, param=param, code=code)


def _multipart(content_type: str, raw: bytes) -> dict[str, tuple[str | None, bytes]]:
    """``{field: (filename, bytes)}`` of a multipart/form-data body (no python-multipart needed)."""
    message = BytesParser(policy=policy.HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
    fields: dict[str, tuple[str | None, bytes]] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            fields[name] = (part.get_filename(), part.get_payload(decode=True) or b"")  # type: ignore[union-attr]
    return fields


def _problem(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    """One entry of a failed batch's ``errors.data``."""
    return {"code": code, "message": message, "line": line, "param": param}


def _validate(content: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Parsed lines, and the validation errors a real provider would fail the batch with."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()
    for number, text in enumerate(content.decode("utf-8", "replace").splitlines(), start=1):
        try:
            line = json.loads(text)
        except ValueError:
            errors.append(_problem("invalid_json_line", "This line is not parseable as valid JSON.", number))
            continue
        problem = None
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str) or not isinstance(line.get("body"), dict):
            problem = ("missing_required_parameter", "Each line needs a string custom_id and an object body.")
        elif line.get("method") != "POST":
            problem = ("invalid_method", "Each line's method must be POST.")
        elif line.get("url") != endpoint:
            problem = ("mismatched_endpoint", f"The line's url {line.get('url')!r} does not match the batch endpoint {endpoint!r}.")
        elif line["custom_id"] in seen:
            problem = ("duplicate_custom_id", f"The custom_id {line['custom_id']!r} is not unique in this batch.")
        if problem is not None:
            errors.append(_problem(*problem, number))
            continue
        seen.add(line["custom_id"])
        models.add(str(line["body"].get("model")))
        lines.append(line)
    if len(models) > 1:
        errors.append(_problem("mismatched_model", "All lines of a batch must use the same model.", param="model"))
    if not lines and not errors:
        errors.append(_problem("empty_file", "The input file has no requests."))
    return lines, errors


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class BatchAPI:
    """Files and batches held in memory by one :class:`FakeProvider`; all handlers run on its loop.

    The provider hands in its request log (and the thread lock guarding it) and its live dispatch
    (``answer``), so a batch line is recorded and answered as a live request is without this module
    knowing the provider's class.
    """

    log: list[RecordedRequest]
    log_lock: threading.Lock
    answer: Callable[[Any], Awaitable[Response]]
    polls_until_done: int
    held: bool
    faults: list[BatchFault]
    shuffle_output: bool
    files: dict[str, _File] = dataclasses.field(default_factory=dict, init=False)
    batches: dict[str, _Batch] = dataclasses.field(default_factory=dict, init=False)
    files_uploaded: int = dataclasses.field(default=0, init=False)
    batches_created: int = dataclasses.field(default=0, init=False)
    batch_polls: int = dataclasses.field(default=0, init=False)
    file_downloads: int = dataclasses.field(default=0, init=False)
    _ids: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1), init=False)
    _lock: asyncio.Lock | None = dataclasses.field(default=None, init=False)  # created on the server loop

    def reset(self) -> None:
        self.faults.clear()
        self.files_uploaded = self.batches_created = self.batch_polls = self.file_downloads = 0

    async def handle(self, method: str, path: str, raw: bytes, content_type: str) -> Response | None:
        """Answer a Files/Batches route, or None when ``path`` is not one (the live dispatch takes it)."""
        route = path[3:] if path.startswith("/v1/") else path
        parts = route.strip("/").split("/")
        if parts[0] not in ("files", "batches"):
            return None
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one batch is never answered twice by two concurrent polls
            if parts[0] == "files":
                return self._files(method, parts[1:], raw, content_type)
            return await self._batches(method, parts[1:], raw)

    # ---- files ---------------------------------------------------------------------------

    def _files(self, method: str, rest: list[str], raw: bytes, content_type: str) -> Response:
        if method == "POST" and not rest:
            fields = _multipart(content_type, raw)
            purpose = (fields.get("purpose") or (None, b""))[1].decode()
            if "file" not in fields:
                return _error(400, "Missing required parameter: 'file'.", param="file")
            if purpose not in _PURPOSES:
                return _error(400, f"Invalid value for 'purpose': {purpose!r}.", param="purpose")
            filename, content = fields["file"]
            stored = self._store(filename or "upload.jsonl", purpose, content)
            self.files_uploaded += 1
            return JSONResponse(stored.payload())
        stored = self.files.get(rest[0]) if rest else None
        if method != "GET" or stored is None or len(rest) > 2 or (len(rest) == 2 and rest[1] != "content"):
            return _error(404, f"No such File object: {rest[0] if rest else ''}", param="id")
        if len(rest) == 1:
            return JSONResponse(stored.payload())
        self.file_downloads += 1
        return Response(stored.content, media_type="application/octet-stream")

    def _store(self, filename: str, purpose: str, content: bytes) -> _File:
        stored = _File(f"file-fake{next(self._ids)}", filename, purpose, content, int(time.time()))
        self.files[stored.id] = stored
        return stored

    # ---- batches -------------------------------------------------------------------------

    async def _batches(self, method: str, rest: list[str], raw: bytes) -> Response:
        if method == "POST" and not rest:
            return self._create(raw)
        if method == "GET" and not rest:
            listing = [b.payload() for b in sorted(self.batches.values(), key=lambda b: -b.number)]
            return JSONResponse({"object": "list", "data": listing, "first_id": listing[0]["id"] if listing else None,
                                 "last_id": listing[-1]["id"] if listing else None, "has_more": False})
        batch = self.batches.get(rest[0]) if rest else None
        if batch is None:
            return _error(404, f"No batch found with id '{rest[0] if rest else ''}'.", param="batch_id")
        if method == "GET" and len(rest) == 1:
            self.batch_polls += 1
            batch.polls += 1
            await self._advance(batch)
            return JSONResponse(batch.payload())
        if method == "POST" and rest[1:] == ["cancel"]:
            if batch.status in TERMINAL:
                return _error(400, f"Cannot cancel a batch with status {batch.status!r}.")
            batch.cancel_requested = True
            batch.status = "cancelling"
            batch.times["cancelling"] = int(time.time())
            return JSONResponse(batch.payload())
        return _error(404, f"Unknown route {method} /v1/batches/{'/'.join(rest)}", code="unknown_url")

    def _create(self, raw: bytes) -> Response:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "Request body must be a JSON object.")
        endpoint = body.get("endpoint")
        if endpoint not in _ENDPOINTS[:1]:
            return _error(400, f"FakeProvider batches support endpoint '/v1/chat/completions', not {endpoint!r}.", param="endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "Invalid value for 'completion_window': only '24h' is supported.", param="completion_window")
        source = self.files.get(str(body.get("input_file_id")))
        if source is None:
            return _error(404, f"No such File object: {body.get('input_file_id')}", param="input_file_id")
        if source.purpose != "batch":
            return _error(400, f"File {source.id} has purpose {source.purpose!r}; batches need 'batch'.", param="input_file_id")
        lines, invalid = _validate(source.content, endpoint)
        number = next(self._ids)
        fault = self.faults.pop(0) if self.faults else None
        batch = _Batch(f"batch_fake{number}", number, source.id, endpoint, body.get("metadata"), lines, invalid, fault,
                       int(time.time()))
        self.batches[batch.id] = batch
        self.batches_created += 1
        return JSONResponse(batch.payload())

    async def _advance(self, batch: _Batch) -> None:
        """Move a polled batch on: in_progress until due, then answer its lines and finish."""
        now = int(time.time())
        if batch.status in TERMINAL:
            return
        if batch.invalid or (batch.fault is not None and batch.fault.status == "failed"):
            if not batch.invalid:
                batch.invalid = [_problem("batch_failed", batch.fault.message)]  # type: ignore[union-attr]
            batch.status, batch.times["failed"] = "failed", now
            return
        if batch.cancel_requested:
            await self._finish(batch, answered=0, stop_code="batch_cancelled", status="cancelled")
            return
        batch.times.setdefault("in_progress", now)
        if self.held or batch.polls < self.polls_until_done:
            batch.status = "in_progress"
            return
        fault = batch.fault
        if fault is None:
            await self._finish(batch, answered=len(batch.lines), stop_code="", status="completed")
        else:
            code = "batch_expired" if fault.status == "expired" else "batch_cancelled"
            await self._finish(batch, answered=fault.answered, stop_code=code, status=fault.status)

    async def _finish(self, batch: _Batch, *, answered: int, stop_code: str, status: str) -> None:
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for index, line in enumerate(batch.lines):
            request_number = f"{batch.number}_{index + 1}"
            if index >= answered:
                message = ("This request could not be executed before the completion window expired."
                           if stop_code == "batch_expired" else "This request was not executed because the batch was cancelled.")
                errors.append({"id": f"batch_req_{request_number}", "custom_id": line["custom_id"], "response": None,
                               "error": {"code": stop_code, "message": message}})
                continue
            status_code, body, error = await self._answer_line(batch, line)
            out = {"id": f"batch_req_{request_number}", "custom_id": line["custom_id"],
                   "response": None if error else {"status_code": status_code, "request_id": f"req_{request_number}", "body": body},
                   "error": error}
            (outputs if status_code == 200 and error is None else errors).append(out)
        batch.completed, batch.failed = len(outputs), len(errors)
        batch.times["finalizing"] = int(time.time())
        for kind, rows in (("output", outputs), ("error", errors)):
            if not rows:
                continue
            if self.shuffle_output:  # a real provider returns lines in any order: clients must key on custom_id
                random.Random(batch.number).shuffle(rows)
            content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
            stored = self._store(f"{batch.id}_{kind}.jsonl", "batch_output", content)
            setattr(batch, f"{kind}_file_id", stored.id)
        batch.status = status
        batch.times[status] = int(time.time())

    async def _answer_line(self, batch: _Batch, line: dict[str, Any]) -> tuple[int, Any, dict[str, Any] | None]:
        """(status_code, body, error) of one line, through the provider's live dispatch."""
        body = line["body"]
        record = RecordedRequest(time=time.monotonic(), path=batch.endpoint, body=body, headers={},
                                                  batch_id=batch.id)
        with self.log_lock:
            self.log.append(record)
        # A batch line is never streamed (the Batch API answers whole bodies), but the dialect still refuses it.
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")} if isinstance(body, dict) else body
        response = await self.answer(body)
        if isinstance(response, _DroppedResponse):
            return 0, None, {"code": "request_timeout", "message": "The underlying call to the model timed out."}
        try:
            payload = json.loads(bytes(response.body))
        except ValueError:
            response = _error(500, "FakeProvider: the scripted raw_body is not JSON.")
            payload = json.loads(bytes(response.body))
        with self.log_lock:
            record.status = response.status_code
        return response.status_code, payload, None
