"""What every reward route shares: the body read as JSON (400), parsed into the contract's model (422),
a failed reward as 502 or 422, and the route shape that answers refusals, timeouts (504) and a raising
computer (500). Each contract's route module (``_native``, ``_dashscope``, ...) registers its route with
:func:`reward_route` and imports these directly; the app module only calls each one's ``register``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse, Response

from ._models import RewardRequest, RewardResponse, ShapeError

logger = logging.getLogger("gradekit.server")

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Engine(Protocol):
    """What a route asks for a reward: the app's one computer behind its pool (``_app._Engine``)."""

    async def compute(self, request: RewardRequest) -> RewardResponse: ...


class Refusal(Exception):
    """An answer other than the contract's normal reply: 400, 422, 502."""

    def __init__(self, status: int, body: dict[str, Any], outcome: str) -> None:
        super().__init__(outcome)
        self.status, self.body, self.outcome = status, body, outcome

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status)


def unprocessable(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> Refusal:
    return Refusal(422, {"detail": [{"loc": ["body", *loc], "msg": msg, "type": kind}]}, "unprocessable")


def set_outcome(request: Request, outcome: str) -> None:
    request.state.gradekit_outcome = outcome


MAX_JSON_DEPTH = 64  # no platform's request nests past ~8 levels; Python's parser recurses, so a deep body is a RecursionError
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # "\ud800": valid JSON, but alone it is no text UTF-8 can carry
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(raw: bytes) -> int:
    """How deep ``raw``'s arrays and objects nest, counted on the brackets outside strings, before
    anything is parsed (so a body nested 10^5 deep costs one linear scan, never a recursion)."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


async def json_body(request: Request) -> Any:
    raw = await request.body()
    too_deep = Refusal(400, {"detail": f"Invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels (the server's limit)"},
                       "invalid json")
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise too_deep
    try:
        body = json.loads(raw)
    except RecursionError:  # only if the scan was fooled (an encoding it does not read): the same answer
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as e:
        raise Refusal(400, {"detail": f"Invalid JSON body: {e}"}, "invalid json") from None
    if _SURROGATE_ESCAPE.search(raw):  # a pair is one character; a lone half fails every later encode (a 500)
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise Refusal(400, {"detail": f"Invalid JSON body: a lone surrogate ({e.object[e.start]!r}) is not text"},
                          "invalid json") from None
    return body


def parse(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        detail = [{"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in e.errors()]
        raise Refusal(422, {"detail": detail}, "unprocessable") from None


def parse_as(model: type[M], data: Any, convert: Callable[[M], T]) -> T:
    """``data`` parsed into the contract's ``model`` and turned by ``convert`` into what the route grades; a
    :class:`ShapeError` there (a part of the request that is not its contract's shape) is a 422 naming it."""
    parsed = parse(model, data)
    try:
        return convert(parsed)
    except ShapeError as e:
        raise unprocessable(e.loc, str(e)) from None


def failed(failures: Sequence[tuple[str, RewardResponse]], *, missing: str | None = None,
           missing_loc: Sequence[str] = ("example",)) -> Refusal:
    """Vertex and OpenRLHF have no failure field: a failed reward is a 502 naming each failed item,
    or 422 when an item is invalid (it would fail again however often the platform retried);
    ``missing`` names the request field whose absence explains it (OpenRLHF's ``labels``)."""
    invalid = [(where, r) for where, r in failures if r.extra_info.get("grade_status") == "invalid"]
    if invalid:
        detail = []
        for where, r in invalid:
            loc = [missing] if missing else (["query", int(where[6:-1])] if where.startswith("query[") else list(missing_loc))
            msg = r.detail or "the sample cannot be graded"
            detail.append({"loc": ["body", *loc], "msg": f"missing: {msg}" if missing else msg, "type": "missing" if missing else "value_error"})
        return Refusal(422, {"detail": detail}, "unprocessable")
    items = [{"item": where, "detail": r.detail or "reward failed", **({"grade_status": r.extra_info["grade_status"]}
              if "grade_status" in r.extra_info else {})} for where, r in failures]
    error = "; ".join(f"{i['item']}: {i['detail']}" if i["item"] else i["detail"] for i in items)
    return Refusal(502, {"error": error, "status": "fail", "failures": items}, "fail")


def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Refusals become their response; an exception from the computer becomes 500 ``{"message"}``;
    a reward not ready within ``server.request_timeout_s`` is cancelled and answered 504."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        limit = request.app.state.config.server.request_timeout_s
        try:
            return await asyncio.wait_for(handler(request), limit)
        except asyncio.TimeoutError:
            set_outcome(request, "timeout")
            return JSONResponse({"detail": f"the reward was not ready within server.request_timeout_s ({limit:g} s); no reward"},
                                status_code=504)
        except Refusal as refusal:
            set_outcome(request, refusal.outcome)
            return refusal.response()
        except Exception as e:
            logger.exception("%s %s: the reward computer raised", request.method, request.url.path)
            set_outcome(request, "exception")
            return JSONResponse({"message": f"{type(e).__name__}: {e}"}, status_code=500)

    return run


RouteHandler = Callable[[Request], Awaitable[tuple[str, Any]]]


def reward_route(app: FastAPI, path: str) -> Callable[[RouteHandler], Callable[[Request], Awaitable[Response]]]:
    """``POST path`` as every reward route answers: the handler returns (outcome, reply), the outcome is what the
    request is logged and counted under, the reply a Response or a JSON body (200); ``guarded`` answers the rest."""

    def register(handler: RouteHandler) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            outcome, reply = await handler(request)
            set_outcome(request, outcome)
            return reply if isinstance(reply, Response) else JSONResponse(reply)

        route.__name__ = route.__qualname__ = handler.__name__
        route.__doc__ = handler.__doc__
        return app.post(path)(guarded(route))

    return register
