"""The FastAPI app: every platform's route over one reward computer, behind a bounded work pool.

Each contract's route is a module of its own, with its request shapes and replies; :data:`CONTRACTS`
registers them, and what they share (the JSON body, parsing, failure answers) is :mod:`._guards`.

=====================  ===================================================================
``GET  /health``       seed 001 and DashScope: the health check plus func_type, processor
``POST /compute_reward``  Bailian seed 001: RewardRequest -> RewardResponse (_native)
``POST /api/v1``       DashScope reward processor: func_type ``reward`` or ``group_reward`` (_dashscope)
``POST /``             Vertex Cloud Run reward: ``{example, response, metadata}`` -> ``{reward}`` (_vertex)
``POST /get_reward``   OpenRLHF remote reward model: ``{query, prompts, labels}`` -> ``{rewards}`` (_openrlhf)
``POST /grade``        Foundry endpoint grader: ``{sample, item, trace_id}`` -> ``{score}`` (_foundry)
``POST /slime``        slime/miles ``--rm-url``: ``{prompt, response, label}`` -> a number (_slime)
``POST /verify``       NeMo Gym resource server: BaseVerifyRequest -> BaseVerifyResponse (_nemo_gym)
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

The body is parsed by the routes (:mod:`._guards`) rather than by FastAPI's typed parameters: the contracts need 400 for
broken JSON (FastAPI says 422) and clients such as ``curl -d`` send no JSON content type.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import logging
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from gradekit._extras import require

require("server", "the reward server (gradekit serve, create_app)")  # one line naming the extra, not fastapi's ImportError

from fastapi import FastAPI, Request  # noqa: E402
from pydantic import ValidationError  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: E402

from .._sample import Grader
from . import _dashscope, _foundry, _native, _nemo_gym, _openrlhf, _slime, _vertex
from ._computers import BaseRewardComputer, DefaultRewardComputer, GraderRewardComputer
from ._config import ServerConfig, ServerConfigError, load_health_check, parse_server_config
from ._guards import set_outcome
from ._models import RewardRequest, RewardResponse
from ._pool import Busy, WorkPool
from ._workers import ProcessWorkers

logger = logging.getLogger("gradekit.server")

BUSY = "Server is busy, please try again later."
RETRY_AFTER = "1"  # seconds; DashScope's and OpenRLHF's clients retry about once a second anyway
TOKEN_ENV = "GRADEKIT_SERVER_TOKEN"

# One module per platform's contract, each with its PATH and register(app, engine, cfg); registered in this order.
CONTRACTS = (_native, _dashscope, _vertex, _openrlhf, _foundry, _slime, _nemo_gym)
REWARD_ROUTES = frozenset(contract.PATH for contract in CONTRACTS)
# Gym's collection stops on any non-2xx: a full server answers /verify with the row's own failure, not 503.
BUSY_REPLIES: dict[str, Callable[[bytes], Response | None]] = {_nemo_gym.PATH: _nemo_gym.verify_busy_reply}


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
        set_outcome(request, "healthy" if healthy else "unhealthy")
        # DashScope's health fields, for the two func_types this server answers on /api/v1.
        body = {**payload, "func_type": "reward", "func_types": ["reward", "group_reward"],
                "processor": type(computer).__name__, "parser": "gradekit",
                "in_flight": pool.admitted, "capacity": pool.capacity}
        return JSONResponse(body, status_code=200 if healthy else 503)

    for contract in CONTRACTS:
        contract.register(app, engine, cfg)
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
