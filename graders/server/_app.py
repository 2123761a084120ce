"""The FastAPI app: five platforms' routes over one reward computer, behind a bounded work pool.

=====================  ===================================================================
``GET  /health``       seed 001 and DashScope: the health check plus func_type, processor
``POST /compute_reward``  Bailian seed 001: RewardRequest -> RewardResponse
``POST /api/v1``       DashScope reward processor: func_type ``reward`` or ``group_reward``
``POST /``             Vertex Cloud Run reward: ``{example, response, metadata}`` -> ``{reward}``
``POST /get_reward``   OpenRLHF remote reward model: ``{query, prompts, labels}`` -> ``{rewards}``
``POST /grade``        Foundry endpoint grader: ``{sample, item, trace_id}`` -> ``{score}``
``POST /slime``        slime/miles ``--rm-url``: ``{prompt, response, label}`` -> a number (_rl_routes)
``POST /verify``       NeMo Gym resource server: BaseVerifyRequest -> BaseVerifyResponse (_rl_routes)
``GET  /metrics``      Prometheus text format (_metrics); with ``canary:`` in the config, its checks (_canary)
=====================  ===================================================================

The group routes (DashScope ``group_reward``, OpenRLHF's batch grouped by prompt) decide a group
with a failed or late member by the config's ``group:`` keys (_groups).

Every route: 413 when the body is over ``server.max_body_bytes`` (refused from its
Content-Length before it is read); 408 when it has not arrived within ``server.body_timeout_s``
(a request takes a worker only once its body is in); 504 with no reward when the reward is not
ready within ``server.request_timeout_s``; 400 when the body is not JSON; 422 when it is JSON the contract cannot read (the
``detail`` names the field); 401 without the bearer token, when one is set (``/health`` is
open); 503 "Server is busy" with ``Retry-After`` when the pool is full, decided before the body
is parsed (so under overload a malformed request may see 503 first: shedding load must cost
less than serving it); 500 ``{"message"}`` when the computer raised. A reward that failed (judge error, invalid sample under ``invalid: fail``)
is each contract's failure: seed 001 answers 200 ``status: fail``, DashScope 200
``status: failed``; Vertex, OpenRLHF and Foundry have no failure field, so a judge error gets 502 (OpenRLHF
retries a non-2xx five times, then fails the step; Foundry retries a failed call at most 3 times, then discards the rollout) and an input that can never succeed (an
invalid sample: a missing reference, e.g. ``/get_reward`` without ``labels``) gets 422 naming the
field, since retrying it would only fail the step later -- never a made-up score.

The body is parsed here rather than by FastAPI's typed parameters: the contracts need 400 for
broken JSON (FastAPI says 422) and clients such as ``curl -d`` send no JSON content type.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import inspect
import itertools
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from gradekit._extras import require

require("server", "the reward server (gradekit serve, create_app)")  # one line naming the extra, not fastapi's ImportError

from fastapi import FastAPI, Request  # noqa: E402
from pydantic import BaseModel, ValidationError  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: E402

from .._sample import Grader, sample_from_vertex
from ._computers import BaseRewardComputer, DefaultRewardComputer, GraderRewardComputer
from ._config import ServerConfig, ServerConfigError, load_health_check, parse_server_config
from ._models import (
    DashScopeGroupRewardInput,
    DashScopeRewardInput,
    FoundryGradeRequest,
    OpenRLHFRequest,
    RewardRequest,
    RewardResponse,
    ShapeError,
    VertexRequest,
    dashscope_group_reward,
    dashscope_request,
    dashscope_reward,
    foundry_reply,
    foundry_request,
    label_references,
    openrlhf_reply,
    split_query,
    untemplate,
    vertex_reply,
)
from ._groups import compute_group, fill_member_failed, prompt_groups
from ._pool import Busy, WorkPool
from ._rl_routes import BUSY_REPLIES, RL_ROUTES, register_rl_routes
from ._workers import ProcessWorkers

logger = logging.getLogger("gradekit.server")

BUSY = "Server is busy, please try again later."
RETRY_AFTER = "1"  # seconds; DashScope's and OpenRLHF's clients retry about once a second anyway
REWARD_ROUTES = frozenset({"/compute_reward", "/api/v1", "/", "/get_reward", "/grade"}) | RL_ROUTES
TOKEN_ENV = "GRADEKIT_SERVER_TOKEN"
M = TypeVar("M", bound=BaseModel)


class _Refusal(Exception):
    """An answer other than the contract's normal reply: 400, 422, 502."""

    def __init__(self, status: int, body: dict[str, Any], outcome: str) -> None:
        super().__init__(outcome)
        self.status, self.body, self.outcome = status, body, outcome

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status)


def _unprocessable(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> _Refusal:
    return _Refusal(422, {"detail": [{"loc": ["body", *loc], "msg": msg, "type": kind}]}, "unprocessable")


def _set_outcome(request: Request, outcome: str) -> None:
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


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    too_deep = _Refusal(400, {"detail": f"Invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels (the server's limit)"},
                        "invalid json")
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise too_deep
    try:
        body = json.loads(raw)
    except RecursionError:  # only if the scan was fooled (an encoding it does not read): the same answer
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _Refusal(400, {"detail": f"Invalid JSON body: {e}"}, "invalid json") from None
    if _SURROGATE_ESCAPE.search(raw):  # a pair is one character; a lone half fails every later encode (a 500)
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise _Refusal(400, {"detail": f"Invalid JSON body: a lone surrogate ({e.object[e.start]!r}) is not text"},
                           "invalid json") from None
    return body


def _parse(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        detail = [{"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in e.errors()]
        raise _Refusal(422, {"detail": detail}, "unprocessable") from None


def _failed(failures: Sequence[tuple[str, RewardResponse]], *, missing: str | None = None,
            missing_loc: Sequence[str] = ("example",)) -> _Refusal:
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
        return _Refusal(422, {"detail": detail}, "unprocessable")
    items = [{"item": where, "detail": r.detail or "reward failed", **({"grade_status": r.extra_info["grade_status"]}
              if "grade_status" in r.extra_info else {})} for where, r in failures]
    error = "; ".join(f"{i['item']}: {i['detail']}" if i["item"] else i["detail"] for i in items)
    return _Refusal(502, {"error": error, "status": "fail", "failures": items}, "fail")


def _checked(result: Any, computer: Any) -> RewardResponse:
    name = type(computer).__name__
    if not isinstance(result, RewardResponse):
        try:
            result = RewardResponse.model_validate(result, from_attributes=True)
        except ValidationError as e:
            raise TypeError(f"{name}.compute_reward returned {type(result).__name__}, not a RewardResponse") from e
    if not math.isfinite(result.score):
        raise ValueError(f"{name}.compute_reward returned a non-finite score ({result.score})")
    return result


class _Engine:
    """One computer behind one pool: every route's work goes through ``compute``."""

    def __init__(self, computer: Any, pool: WorkPool, workers: ProcessWorkers | None = None, canary: Any = None) -> None:
        self.computer, self.pool, self.workers, self.canary = computer, pool, workers, canary

    async def compute(self, request: RewardRequest) -> RewardResponse:
        if self.canary is not None and self.canary.on_drift == "fail" and self.canary.drifted:
            return RewardResponse(score=0.0, status="fail", extra_info={"error_kind": "drift"},
                                  detail="the judge changed since the server started (its canary says so; see /stats): no reward")
        if self.workers is not None:  # a plain def in worker processes: a call past its deadline is killed
            return _checked(await self.workers.run(request), self.computer)
        return _checked(await self.pool.run(self.computer.compute_reward, request), self.computer)

    async def compute_all(self, requests: Sequence[RewardRequest]) -> list[RewardResponse]:
        # Not a TaskGroup (3.11+): wait for every item, then raise the first error.
        results = await asyncio.gather(*(self.compute(r) for r in requests), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Refusals become their response; an exception from the computer becomes 500 ``{"message"}``;
    a reward not ready within ``server.request_timeout_s`` is cancelled and answered 504."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        limit = request.app.state.config.server.request_timeout_s
        try:
            return await asyncio.wait_for(handler(request), limit)
        except asyncio.TimeoutError:
            _set_outcome(request, "timeout")
            return JSONResponse({"detail": f"the reward was not ready within server.request_timeout_s ({limit:g} s); no reward"},
                                status_code=504)
        except _Refusal as refusal:
            _set_outcome(request, refusal.outcome)
            return refusal.response()
        except Exception as e:
            logger.exception("%s %s: the reward computer raised", request.method, request.url.path)
            _set_outcome(request, "exception")
            return JSONResponse({"message": f"{type(e).__name__}: {e}"}, status_code=500)

    return run


_RouteHandler = Callable[[Request], Awaitable[tuple[str, Any]]]


def _reward_route(app: FastAPI, path: str) -> Callable[[_RouteHandler], Callable[[Request], Awaitable[Response]]]:
    """``POST path`` as every reward route answers: the handler returns (outcome, reply), the outcome is what the
    request is logged and counted under, the reply a Response or a JSON body (200); ``_guarded`` answers the rest."""

    def register(handler: _RouteHandler) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            outcome, reply = await handler(request)
            _set_outcome(request, outcome)
            return reply if isinstance(reply, Response) else JSONResponse(reply)

        route.__name__ = route.__qualname__ = handler.__name__
        route.__doc__ = handler.__doc__
        return app.post(path)(_guarded(route))

    return register


# ---- middleware ---------------------------------------------------------------------------------


class _BearerAuth:
    """Every route but ``/health`` needs ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.expected = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            scheme, _, credentials = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            # compare_digest: the time taken must not tell how much of a guessed token was right
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.expected):
                scope.setdefault("state", {})["gradekit_outcome"] = "unauthorized"
                response = JSONResponse({"detail": "Not authenticated"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


class _BodyLimits:
    """Reads a reward route's whole body before the request takes a place in the pool: 413 past
    ``max_bytes`` (from Content-Length, before a byte is read, or while streaming a chunked body),
    408 when it has not arrived within ``timeout_s``. A slow or huge upload then holds no worker
    slot and no more memory than the limit; the body is replayed to the app as one message."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float, paths: frozenset[str]) -> None:
        self.app, self.max_bytes, self.timeout_s, self.paths = app, max_bytes, timeout_s, paths

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, detail: str, outcome: str) -> None:
        scope.setdefault("state", {})["gradekit_outcome"] = outcome
        # Connection: close -- the rest of the body is never read, so the connection cannot be reused.
        await JSONResponse({"detail": detail}, status_code=status, headers={"Connection": "close"})(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is over server.max_body_bytes ({self.max_bytes:,} bytes)"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send, 413, too_large, "too large")
            return
        chunks: list[bytes] = []

        async def read() -> bool:
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return False
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    raise _TooLarge
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return True

        try:
            complete = await asyncio.wait_for(read(), self.timeout_s)
        except asyncio.TimeoutError:
            await self._refuse(scope, receive, send, 408, f"the request body did not arrive within server.body_timeout_s "
                               f"({self.timeout_s:g} s)", "body timeout")
            return
        except _TooLarge:
            await self._refuse(scope, receive, send, 413, too_large, "too large")
            return
        if not complete:
            return  # the client went away; nobody to answer
        body, replayed = b"".join(chunks), False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)


class _Admission:
    """Refuses at the door: when the pool is full, a reward route answers 503 before FastAPI routes
    the request or its body is parsed, so a refusal costs next to nothing even under a flood.
    Admitted requests hold their place until the response is sent."""

    def __init__(self, app: ASGIApp, pool: WorkPool, paths: frozenset[str],
                 busy_replies: Mapping[str, Callable[[bytes], Response | None]] | None = None) -> None:
        self.app, self.pool, self.paths = app, pool, paths
        self.busy_replies = dict(busy_replies or {})  # a route whose client stops on any non-2xx answers busy its own way

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        try:
            self.pool.admit()
        except Busy:
            scope.setdefault("state", {})["gradekit_outcome"] = "busy"
            more, body = True, []
            while more:  # drain the body so the keep-alive connection stays usable
                message = await receive()
                body.append(message.get("body", b""))
                more = message.get("more_body", False) and message["type"] == "http.request"
            own = self.busy_replies.get(scope["path"])
            response = own(b"".join(body)) if own is not None else None
            if response is None:
                response = JSONResponse({"detail": BUSY}, status_code=503, headers={"Retry-After": RETRY_AFTER})
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.pool.leave()


class _RequestLog:
    """The outermost middleware: each request timed with its status, then one log line (method, route,
    status, outcome and latency, also as record fields) when ``log``, and told to ``observe`` (/metrics)."""

    def __init__(self, app: ASGIApp, log: bool, observe: Callable[[str, int, float], None]) -> None:
        self.app, self.log, self.observe = app, log, observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        status = 0

        async def capture(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            seconds = time.perf_counter() - started
            route = scope["path"]
            self.observe(route, status, seconds)
            if self.log:
                ms = seconds * 1000
                outcome = state.get("gradekit_outcome") or ("ok" if 200 <= status < 300 else "error")
                logger.info("%s %s -> %d %s in %.1f ms", scope["method"], route, status, outcome, ms,
                            extra={"route": route, "status": status, "outcome": outcome, "latency_ms": ms})


# ---- the app ------------------------------------------------------------------------------------


async def _close(computer: Any) -> None:
    for name in ("aclose", "close"):
        close = getattr(computer, name, None)
        if callable(close):
            result = close()
            if inspect.isawaitable(result):
                await result
            return


def _isolated(computer: Any, cfg: ServerConfig) -> bool:
    """Whether the computer's plain ``def compute_reward`` runs in worker processes (:mod:`._workers`).

    ``thread_pool.isolation`` decides; by default a ``reward.class`` does (a hung call is then killed
    and replaced instead of keeping its worker), an object handed to :func:`create_app` does not (its
    caller may read the instance's state). Async computers run on the loop either way; fork is POSIX only.
    """
    if inspect.iscoroutinefunction(computer.compute_reward) or isinstance(computer, (GraderRewardComputer, DefaultRewardComputer)):
        return False
    if sys.platform == "win32":
        return False
    isolation = cfg.thread_pool.isolation
    if isolation is None:
        return cfg.reward is not None and cfg.reward.class_ is not None
    return isolation == "process"


def create_app(computer: BaseRewardComputer | Grader, config: ServerConfig | Mapping[str, Any] | None = None, *,
               health_check: Callable[[], Any] | None = None) -> FastAPI:
    """The reward server's ASGI app, serving all five contracts from one computer.

    Args:
        computer: a BaseRewardComputer (anything with ``compute_reward``), or a grader, which is
            served through :class:`GraderRewardComputer` with ``reward.invalid`` from the config.
        config: a ServerConfig or its dict (``thread_pool``, ``server.auth_token``, ``logging``,
            ``health_check``); defaults otherwise. The token falls back to ``GRADEKIT_SERVER_TOKEN``.
        health_check: what ``/health`` calls instead of ``health_check.function`` or the
            computer's ``health_check()``.

    The pool starts and the computer is closed (``aclose()``/``close()``) in the app's lifespan,
    so run it with lifespan on (``RewardServer`` does); uvicorn finishes in-flight requests first.
    """
    cfg = config if isinstance(config, ServerConfig) else parse_server_config(dict(config or {}))
    if not callable(getattr(computer, "compute_reward", None)):
        if not callable(computer):
            raise TypeError(f"create_app needs a BaseRewardComputer or a grader, got {type(computer).__name__}")
        invalid = (cfg.reward.invalid if cfg.reward else None) or "fail"
        computer = GraderRewardComputer(computer, invalid=invalid)
    health_fn = health_check or load_health_check(cfg)
    pool = WorkPool(cfg.thread_pool.max_workers, cfg.thread_pool.queue_size)
    workers = ProcessWorkers(computer.compute_reward, cfg.thread_pool.max_workers) if _isolated(computer, cfg) else None
    canary = None
    if cfg.canary is not None:
        from ._canary import build_canary

        try:
            canary = build_canary(cfg.canary, cfg.base, computer, cfg.source)
        except ValueError as e:
            raise ServerConfigError(str(e)) from e
    engine = _Engine(computer, pool, workers, canary)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.start()
        if canary is not None:
            canary.start()  # its first check runs beside the first requests: serving never waits for it
        try:
            yield
        finally:
            if canary is not None:
                await canary.stop()
            await asyncio.to_thread(pool.close)  # in-flight work is done: uvicorn waited for it
            if workers is not None:
                await asyncio.to_thread(workers.close)
            await _close(computer)
            logger.info("reward computer %s closed", type(computer).__name__)

    app = FastAPI(title="gradekit reward server", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.computer, app.state.pool, app.state.config, app.state.canary = computer, pool, cfg, canary

    @app.get("/health")
    async def health(request: Request) -> Response:
        try:
            fn = health_fn or getattr(computer, "health_check", None)
            payload: Any = {"status": "healthy"} if fn is None else (
                fn() if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn))
            if inspect.isawaitable(payload):
                payload = await payload
            if not isinstance(payload, Mapping) or "status" not in payload:
                raise TypeError(f"the health check returned {payload!r}, not a dict with a 'status'")
            payload = dict(payload)
        except Exception as e:
            payload = {"status": "unhealthy", "message": f"{type(e).__name__}: {e}"}
        healthy = payload.get("status") == "healthy"
        _set_outcome(request, "healthy" if healthy else "unhealthy")
        # DashScope's health fields, for the two func_types this server answers on /api/v1.
        body = {**payload, "func_type": "reward", "func_types": ["reward", "group_reward"],
                "processor": type(computer).__name__, "parser": "gradekit",
                "in_flight": pool.admitted, "capacity": pool.capacity}
        return JSONResponse(body, status_code=200 if healthy else 503)

    @_reward_route(app, "/compute_reward")
    async def compute_reward(request: Request) -> tuple[str, Any]:
        reward_request = _parse(RewardRequest, await _json_body(request))
        response = await engine.compute(reward_request)
        return response.status, response.model_dump(mode="json")

    @_reward_route(app, "/api/v1")
    async def dashscope(request: Request) -> tuple[str, Any]:
        body = await _json_body(request)
        kind = body.get("func_type") if isinstance(body, dict) else None
        if kind is None and isinstance(body, dict) and "agent_outputs" in body:
            kind = "group_reward"
        if kind in (None, "reward"):
            single = _parse(DashScopeRewardInput, body)
            response = await engine.compute(dashscope_request(single.agent_output, single.ground_truth, single.request_metadata))
            out = dashscope_reward(response)
        elif kind == "group_reward":
            group = _parse(DashScopeGroupRewardInput, body)
            requests = [dashscope_request(o, group.ground_truth, group.request_metadata) for o in group.agent_outputs]
            responses = await compute_group(engine.compute, requests, cfg.group)
            out = dashscope_group_reward(responses)
        else:
            raise _unprocessable(["func_type"], f"func_type {kind!r} is not served here; gradekit serves 'reward' and 'group_reward'",
                                 "literal_error")
        return out["status"], out

    @_reward_route(app, "/")
    async def vertex(request: Request) -> tuple[str, Any]:
        body = await _json_body(request)
        parsed = _parse(VertexRequest, body)
        try:
            sample = sample_from_vertex(body["example"], body["response"])
        except ValueError as e:
            raise _unprocessable(["example"], str(e)) from None
        reward_request = RewardRequest(messages=sample.messages, response=sample.response_text, response_messages=sample.response or None,
                                       extra_params=sample.references, metadata={**sample.metadata, **parsed.metadata})
        response = await engine.compute(reward_request)
        if response.status != "success":
            raise _failed([("", response)])
        return "success", vertex_reply(response)

    @_reward_route(app, "/get_reward")
    async def openrlhf(request: Request) -> tuple[str, Any]:
        batch = _parse(OpenRLHFRequest, await _json_body(request))
        n = len(batch.query)
        for field in ("prompts", "labels"):
            values = getattr(batch, field)
            if values is not None and len(values) != n:
                raise _unprocessable([field], f"has {len(values)} items but query has {n}")
        requests = []
        for i, query in enumerate(batch.query):
            prompt = batch.prompts[i] if batch.prompts is not None else None
            answer = split_query(query, prompt, cfg.openrlhf.end_tokens)
            if answer is None:
                raise _unprocessable(["query", i], f"does not contain prompts[{i}], so the response cannot be split off")
            references = label_references(batch.labels[i]) if batch.labels is not None else {}
            # The prompt arrives with the chat template applied: ChatML and Llama 3 are read back into messages.
            requests.append(RewardRequest(prompt=untemplate(prompt) if prompt else None, response=answer, extra_params=references,
                                          metadata={"templated_prompt": prompt} if prompt else None))
        responses: list[RewardResponse] = [None] * n  # type: ignore[list-item]
        groups = prompt_groups(batch.prompts if batch.prompts is not None else [None] * n)
        decided = await asyncio.gather(*(compute_group(engine.compute, [requests[i] for i in g], cfg.group) for g in groups))
        for g, rs in zip(groups, decided):
            for i, r in zip(g, rs):
                responses[i] = r
        responses = fill_member_failed(responses)
        failures = [(f"query[{i}]", r) for i, r in enumerate(responses) if r.status != "success"]
        if failures:
            # An invalid item of a request without labels (or prompts) is explained by that absent field.
            absent = "labels" if batch.labels is None else "prompts" if batch.prompts is None else None
            raise _failed(failures, missing=absent)
        return "success", openrlhf_reply(responses)

    @_reward_route(app, "/grade")
    async def foundry(request: Request) -> tuple[str, Any]:
        parsed = _parse(FoundryGradeRequest, await _json_body(request))
        try:
            reward_request = foundry_request(parsed)
        except ShapeError as e:  # a message of item.messages or sample.choices that is no chat message
            raise _unprocessable(e.loc, str(e)) from None
        response = await engine.compute(reward_request)
        if response.status != "success":
            raise _failed([("", response)], missing_loc=["sample"])
        return "success", foundry_reply(response)

    register_rl_routes(app, engine, sys.modules[__name__])
    from ._metrics import install_metrics  # prometheus_client loads with the server only

    install_metrics(app, engine, computer, canary)
    app.add_middleware(_Admission, pool=pool, paths=REWARD_ROUTES, busy_replies=BUSY_REPLIES)  # innermost of ours: after the body is in
    app.add_middleware(_BodyLimits, max_bytes=cfg.server.max_body_bytes, timeout_s=cfg.server.body_timeout_s, paths=REWARD_ROUTES)
    token = cfg.server.auth_token or os.environ.get(TOKEN_ENV) or None
    if token:
        app.add_middleware(_BearerAuth, token=token)
    # added last: outermost, so it times, logs and counts 401s, 413s and 503s too
    app.add_middleware(_RequestLog, log=cfg.logging.enable, observe=app.state.observe_request)
    return app
