"""The judge client: cache -> limiter -> retry -> OpenAI-compatible API -> parse -> Verdict."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import openai
from openai import AsyncOpenAI
from pydantic import BaseModel
from tenacity import RetryCallState

from ._breaker import current_breaker
from ._budget import Budget
from ._cache import JudgeCache, cache_key
from ._embeddings import Embeddings, embedding_key
from ._checklist import bind_row, unbound
from ._dialect import ask_mode_of, dialect_of, error_fields, names_output_format, parameter_fix, user_fix
from ._fastwire import wanted as fast_wire_wanted
from ._fleet import Endpoint, EndpointStats, Fleet, endpoints_of
from ._hedge import HedgePolicy, HedgeStats
from ._limiter import RequestLimiter, estimate_tokens
from ._limiters import process_limiter
from ._pacing import Pacing
from ._parse import Reading, Unread, read_completion, read_missed_schema, reasoning_of
from ._protocol import JudgeIdentity, JudgeStats
from ._redact import redact_url
from ._retry import RetryPolicy, retry_after_seconds
from ._rubric import AskMode, PromptOverflow, Room, Rubric, RubricInputError, rubric_fingerprint
from ._tokens import ESTIMATE, MESSAGE_OVERHEAD, token_counter
from ._trajectory import TrajectoryCoverage
from ._window import known_window, overflow_of
from ._verdict import ErrorKind, Verdict
from ._wire import Failed, Route, breaker_failure, error_of, status_detail, status_error_kind, status_message, status_text, usage_detail, vectors_of

log = logging.getLogger("gradekit.judge")
TOOL_NAME = "submit_verdict"
DEFAULT_MODEL = "gpt-4o-mini"
# One encoder, built once: json.dumps with options builds a new JSONEncoder on every call.
_VALUES_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
# Above every common context window: a prompt this long is a broken row (a pasted file, a loop in
# a trajectory), and sending it would only buy a 400 or a very large bill.
DEFAULT_MAX_PROMPT_TOKENS = 1_000_000
_COMPLETION_ALLOWANCE = 256  # tokens reserved for the reply when pacing by tokens per minute
# The reply's room in the context window when neither the rubric nor the judge's params cap it (at most a
# quarter of the window: a small local model's 4k window keeps 3k for the prompt).
DEFAULT_OUTPUT_RESERVE = 4096
# While an endpoint's window is unknown, a prompt past this many tokens and larger than any it answered
# waits for the first such one's answer: a wave of long prompts meets one context-length refusal, not one each.
WINDOW_GATE_TOKENS = 8192


_NO_ROOM = Room(None, ESTIMATE)  # no window to check a plain rubric's prompt against


class _Relearn(Exception):
    """The endpoint's dialect changed since this request was built: build it again (new cache key too)."""


# A row rebuilt this many times (each time for a newly learnt fix) has met a server that refuses
# everything; its last 400 is the row's error.
_MAX_RELEARNS = 8



def build_request(rubric: Rubric, messages: list[dict[str, str]], mode: AskMode, model: str, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The chat.completions arguments for one ask mode, before the endpoint's learnt fixes.

    Precedence: gradekit's default (temperature 0), then the rubric's ``sampling:``, then the
    judge parameters the user gave (``sampling``). What is finally sent is part of the cache key.
    """
    request: dict[str, Any] = {"model": model, "messages": messages, "temperature": 0.0}
    request.update(rubric.sampling)
    request.update(sampling)
    schema = rubric.output.json_schema
    if mode == "json_schema":
        request["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": _schema_name(rubric.name), "schema": schema, "strict": True},
        }
    elif mode == "tool":
        request["tools"] = [
            {
                "type": "function",
                "function": {"name": TOOL_NAME, "description": "Record the verdict.", "parameters": schema},
            }
        ]
        request["tool_choice"] = {"type": "function", "function": {"name": TOOL_NAME}}
    elif mode == "json_object":
        request["response_format"] = {"type": "json_object"}
    return request


@functools.lru_cache(maxsize=256)
def _schema_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
    return cleaned[:64] or "verdict"


class Judge:
    """Asks an OpenAI-compatible model to apply a rubric and returns a Verdict, never an exception.

    Args:
        model: model name; defaults to $GRADEKIT_MODEL, else gpt-4o-mini.
        base_url: API root; defaults to $OPENAI_BASE_URL, else OpenAI. A list of roots is a fleet
            (:mod:`gradekit.judge._fleet`): one judge served by several replicas, keys or regions.
        api_key: defaults to $OPENAI_API_KEY; local servers that need none get a placeholder. With
            a list of ``base_url``: one key for all, or a list in the same order.
        endpoints: a fleet given as :class:`~judge.Endpoint` (or mappings): ``base_url``, ``api_key``,
            ``weight``, ``rps``, ``tpm`` each. Every endpoint has its own limiter (built like
            ``limiter``), pacing and health breaker; a request goes to the one with the most free
            capacity, and from a broken one to the others. The fleet is named by its first
            endpoint: ``base_url``, cache keys, the learnt dialect and a run's checkpoint are its.
        timeout: seconds per request.
        limiter: defaults to the process-wide limiter every judge shares; for a fleet, the model of
            each endpoint's own limiter (:func:`gradekit.judge._limiters.endpoint_limiter`).
        cache: a JudgeCache, or None for no caching.
        retry: backoff and re-ask policy.
        params: judge parameters for every request (``reasoning_effort``, ``temperature``,
            ``max_completion_tokens``, ``seed``, a provider's own keys such as DashScope's
            ``enable_thinking`` or Ark's ``thinking``); they override the rubric's ``sampling:``
            and reach the request body as given. A parameter set here is never dropped: an
            endpoint that refuses it fails the row with a message naming it (``max_tokens`` /
            ``max_completion_tokens`` are renamed instead). Defaults gradekit or the rubric set
            (temperature 0, a rubric's max_tokens) are dropped or renamed once per (endpoint,
            model) when the endpoint refuses them, as reasoning models do.
        sampling: the former name of ``params`` (both are merged; ``params`` wins).
        sleep: how retries wait; tests pass a recorder instead of asyncio.sleep.
        logprobs: ask for this many top logprobs per token (1-20) and score G-Eval style: the
            probability-weighted mean of the label scores at the verdict token. The Verdict's
            ``score_source`` says per judgement whether that happened or the plain label was used.
        budget: a spend cap (share one between the judges of a run). Past it, a row that misses
            the cache is not sent: its Verdict is ``skipped`` with ``error_kind="budget"``.
        max_prompt_tokens: a rendered prompt estimated above this many tokens is not sent: its
            Verdict is an ``input`` error (the row cannot be judged this way), not a request no
            model accepts. None: no cap.
        hedge: hedged requests over a fleet (:mod:`gradekit.judge._hedge`): None or True (the default: on for
            two endpoints or more), False, or a :class:`~judge.HedgePolicy` / mapping of its knobs.
            A request unanswered after max(p95, 2 x median) of its endpoint's recent latencies is
            sent once more to another endpoint; the first answer wins. One endpoint never hedges.
        context_window: the judge model's context window in tokens, which a trajectory is fitted into
            (:mod:`gradekit.judge._trajectory`). Default: learnt from the provider's first context-length
            refusal and kept in the cache, or the model's documented window (:mod:`gradekit.judge._window`).
        fast_wire: send non-streamed chat requests over aiohttp + orjson with the SDK's own URL, headers,
            body bytes, timeouts and error classes (:mod:`gradekit.judge._fastwire`; about a fifth of the
            SDK's CPU per request). None (the default): on unless ``GRADEKIT_FAST_WIRE=0``; False: the
            SDK sends everything. Streaming, embeddings and unusual clients or proxies always use the SDK.
    """

    panel_columns: tuple[str, ...] = ()  # a single judge's verdicts have no panel (see judge._protocol)
    RELEARN: type[Exception] = _Relearn  # what _send raises when a request must be built again (judge._navigate catches it)

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | Sequence[str] | None = None,
        api_key: str | Sequence[str] | None = None,
        endpoints: Sequence[Endpoint | Mapping[str, Any]] | None = None,
        timeout: float = 60.0,
        limiter: RequestLimiter | None = None,
        cache: JudgeCache | None = None,
        retry: RetryPolicy | None = None,
        sampling: Mapping[str, Any] | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        logprobs: int | None = None,
        budget: Budget | None = None,
        max_prompt_tokens: int | None = DEFAULT_MAX_PROMPT_TOKENS,
        params: Mapping[str, Any] | None = None,
        hedge: bool | HedgePolicy | Mapping[str, Any] | None = None,
        context_window: int | None = None,
        fast_wire: bool | None = None,
    ) -> None:
        self.model = model or os.environ.get("GRADEKIT_MODEL") or DEFAULT_MODEL
        if context_window is not None and context_window < 1:
            raise ValueError(f"context_window must be at least 1 token, got {context_window}")
        self.context_window = context_window
        self.budget = budget
        if budget is not None:
            budget.check_model(self.model)  # an unpriced model under a cost cap fails here, not mid-run
        fleet = endpoints_of(base_url, api_key, endpoints)
        if fleet is None:
            single = base_url if isinstance(base_url, str) else (list(base_url or []) or [None])[0]
            key = api_key if isinstance(api_key, str) else (list(api_key or []) or [None])[0]
            fleet = [Endpoint(base_url=single or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1", api_key=key)]
        self.base_url = fleet[0].base_url
        # max_retries=0: tenacity is the one owner of retries (ARCHITECTURE invariant); the SDK's
        # own retries would multiply attempts and bypass the shared limiter.
        self.retry = retry or RetryPolicy()
        self._fleet = Fleet.build(fleet, model=self.model, retry=self.retry, configured=endpoints is not None,
                                  limiter=limiter if limiter is not None else process_limiter(),
                                  client_options={"max_retries": 0, "timeout": timeout}, hedge=hedge,
                                  fast_wire=fast_wire_wanted(fast_wire))
        self.limiter = self._fleet.limiter
        self.cache = cache
        self.sampling = {**(sampling or {}), **(params or {})}  # the user's judge parameters
        if logprobs is not None:
            if not 1 <= logprobs <= 20:
                raise ValueError(f"logprobs must be between 1 and 20 (top logprobs per token), got {logprobs}")
            # In sampling, so the cache key covers it: a reply without logprobs is not reused.
            self.sampling.update(logprobs=True, top_logprobs=logprobs)
        self.logprobs = logprobs
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}")
        self.max_prompt_tokens = max_prompt_tokens
        self._sleep = sleep
        self._modes: dict[str, AskMode] = {}
        self._shells: dict[tuple[int, str], tuple[Rubric, int, str]] = {}
        # Shared by every Judge of this endpoint and model, and by a whole fleet (named by its first
        # endpoint): one request shape for every replica, so a row's cache key is the fleet's.
        self.dialect = dialect_of(self.base_url, self.model)
        if cache is not None:
            self.dialect.load(cache, self.endpoint)

    @property
    def params(self) -> dict[str, Any]:
        """The judge parameters the user set (``params`` and ``sampling``), as sent unless refused."""
        return self.sampling

    @property
    def endpoint(self) -> str:
        """``base_url|model`` of the (first) endpoint: the name the cache remembers ask modes under."""
        return f"{self.base_url.rstrip('/')}|{self.model}"

    @property
    def concurrency(self) -> int:
        """Requests this judge may have in flight: its limiter's cap, summed over a fleet's endpoints."""
        return self._fleet.concurrency

    @property
    def endpoints(self) -> list[EndpointStats]:
        """Each endpoint's requests, answers, rate and state so far (one entry without a fleet)."""
        return self._fleet.endpoints()

    @property
    def hedges(self) -> HedgeStats:
        """Hedged requests so far: sent, won (answered first), lost (cancelled or failed)."""
        return self._fleet.hedges()

    @property
    def hedging(self) -> bool:
        """Whether this judge hedges (a fleet of two or more endpoints with hedging on)."""
        return self._fleet.hedging

    @property
    def held_seconds(self) -> float:
        """Seconds its limiters held requests so far, over every endpoint of a fleet."""
        return self._fleet.held_seconds

    def pacing(self) -> Pacing:
        """How the judge paces now: its limiter's pacing; for a fleet, the summed rate of its endpoints."""
        return self._fleet.pacing()

    def identity(self) -> JudgeIdentity:
        """What a checkpoint records of this judge: a resume with another model, endpoint or parameters is refused."""
        return JudgeIdentity(model=self.model, base_url=self.base_url, sampling=self.sampling, logprobs=self.logprobs)

    def stats(self) -> JudgeStats:
        """Its endpoints, limiter waits and pacing so far (a single judge has no members)."""
        return JudgeStats(endpoints=self.endpoints, held_seconds=self.held_seconds, pacing=self.pacing())

    def _request(self, rubric: Rubric, messages: list[dict[str, Any]], mode: AskMode) -> dict[str, Any]:
        """What is sent for ``messages`` in ``mode``: build_request with this endpoint's learnt fixes."""
        return self.dialect.apply(build_request(rubric, messages, mode, self.model, self.sampling))

    @property
    def client(self) -> AsyncOpenAI:
        """The SDK client this judge sends with on the running event loop, for control-plane calls
        (files, batches). Calls made through it bypass the cache, the limiter and the retry policy.
        """
        return self._fleet.client()

    async def aclose(self) -> None:
        """Close the clients of the running loop; clients of loops already closed hold nothing to release."""
        await self._fleet.aclose()

    async def __aenter__(self) -> Judge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _start_mode(self, rubric: Rubric) -> int:
        chain = rubric.ask_modes
        if len(chain) == 1:
            return 0
        mode = self._modes.get(self.endpoint)
        if mode is None and self.cache is not None:
            mode = self.cache.get_mode(self.endpoint)  # type: ignore[assignment]
            if mode is not None:
                self._modes[self.endpoint] = mode
        return chain.index(mode) if mode in chain else 0

    def _remember(self, rubric: Rubric, mode: AskMode) -> None:
        if len(rubric.ask_modes) == 1 or self._modes.get(self.endpoint) == mode:
            return
        self._modes[self.endpoint] = mode
        if self.cache is not None:
            self.cache.set_mode(self.endpoint, mode)

    async def judge(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
        """Judge one row. Every outcome, including bad input, comes back as a Verdict.

        A rubric with ``granularity: step`` gets one verdict per assistant step (:mod:`gradekit.judge._steps`);
        one with ``navigate: true`` lets the judge read the trace with tools (:mod:`gradekit.judge._navigate`).
        """
        if rubric.granularity == "step":
            from ._steps import judge_steps

            return await judge_steps(self, rubric, row)
        if rubric.navigate:
            from ._navigate import navigate

            return await navigate(self, rubric, row)
        return await self.judge_once(rubric, row)

    async def judge_once(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
        """One judgement of one row (a whole trajectory, or one step of it), whatever the rubric's granularity."""
        started = time.perf_counter()
        rubric = bind_row(rubric, row)  # a per-row checklist: this row's criteria and schema
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0, "attempts": 0}

        def finish(**fields: Any) -> Verdict:
            return Verdict(latency_s=time.perf_counter() - started, **usage, **fields)

        chain = rubric.ask_modes
        first_bad_request: Failed | None = None
        for mode in chain[self._start_mode(rubric):]:
            if mode in self.dialect.refused_modes and mode != chain[-1]:
                first_bad_request = first_bad_request or Failed(
                    "bad_request", f"{self.model} at {self.base_url} does not take output mode {mode}", 400, output_format=True)
                continue
            for _ in range(_MAX_RELEARNS):
                prepared = self._prepare(rubric, row, mode, finish, need_key=False)
                if isinstance(prepared, Verdict):
                    return prepared
                try:
                    verdict = await self._ask_within_budget(rubric, prepared, usage, finish)
                    return verdict if prepared.coverage is None else verdict.model_copy(update={"coverage": prepared.coverage})
                except _Relearn:
                    if mode in self.dialect.refused_modes and mode != chain[-1]:
                        break  # another request learnt that this mode is refused
                    continue  # a fix was learnt (here or by another request): build the request again
                except Failed as failure:
                    structured = mode != chain[-1]
                    # Only a 400 about the output format walks the chain; a model name, a parameter or a
                    # context length fails the same way in every format.
                    if failure.kind == "bad_request" and structured and failure.output_format:
                        first_bad_request = first_bad_request or failure
                        break  # this server may not support the mode: try the next one
                    if first_bad_request is not None and failure.kind == "bad_request":
                        failure = first_bad_request
                    return finish(status="error", error_kind=failure.kind, error=str(failure), mode=mode, coverage=prepared.coverage)
            else:
                return finish(status="error", error_kind="context_overflow" if rubric.trajectory_variables or self.dialect.window
                              else "bad_request", mode=mode,
                              error=f"the endpoint refused {_MAX_RELEARNS} versions of the request: "
                                    + "; ".join(self.dialect.learnt))
        assert first_bad_request is not None
        return finish(status="error", error_kind="bad_request", error=str(first_bad_request), mode=chain[-1])

    async def embed(self, texts: Sequence[str], *, model: str) -> Embeddings:
        """Embed ``texts`` with ``model`` on the judge's endpoint (``POST {base_url}/embeddings``).

        The same path as a judgement: cache, shared limiter, retry policy and the run's breaker.
        Never raises: a failure is ``status="error"`` with the judge's error kinds (a server
        without the route, or without the model, answers 404: ``bad_request``). Each text is
        cached on its own, so a reference shared by many rows is embedded once; the texts the
        cache lacks go out in one request. Embeddings are not charged to a ``budget``.
        """
        started = time.perf_counter()
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "attempts": 0}
        texts = list(texts)
        vectors: list[list[float] | None] = [None] * len(texts)
        keys = {text: embedding_key(self.base_url, model, text) for text in texts}
        if self.cache is not None:
            for i, text in enumerate(texts):
                stored = self.cache.get(keys[text])
                found = vectors_of({"data": [stored]}, 1) if isinstance(stored, dict) else []
                vectors[i] = found[0] if found else None
        missing = list(dict.fromkeys(text for text, vector in zip(texts, vectors) if vector is None))

        def finish(**fields: Any) -> Embeddings:
            return Embeddings(latency_s=time.perf_counter() - started, prompt_tokens=usage["prompt_tokens"],
                              attempts=usage["attempts"], cached=not missing, **fields)

        if missing:
            request = {"model": model, "input": missing, "encoding_format": "float"}  # float: the SDK would ask for base64
            try:
                response = await self._send(request, usage, route="embeddings")
            except Failed as failure:
                error = str(failure)
                if failure.status == 404:
                    error = f"{self.base_url.rstrip('/')}/embeddings has no route or no model {model!r}: {error}"
                return finish(status="error", error_kind=failure.kind, error=error)
            fresh = dict(zip(missing, vectors_of(response, len(missing))))
            for text, vector in fresh.items():
                if self.cache is not None:
                    self.cache.put(keys[text], {"object": "embedding", "model": model, "embedding": vector})
            vectors = [fresh[text] if vector is None else vector for text, vector in zip(texts, vectors)]
        return finish(status="ok", vectors=vectors)

    def _row_key(self, rubric: Rubric, row: Mapping[str, Any], mode: AskMode) -> str | None:
        """A cache key from the row's values instead of the rendered prompt.

        Rendering is most of the cost of a cache hit; the messages are a pure function of the
        rubric's spec and template, the ask mode and the prepared values, so hashing those finds
        the same stored reply without rendering. None when the row would not render anyway.
        """
        rubric = unbound(rubric)  # one shell per rubric, not per row's criteria: the values hold those
        try:
            values = rubric.prepare(row)
        except RubricInputError:
            return None
        shell = self._shells.get((id(rubric), mode))
        version = self.dialect.version
        if shell is None or shell[0] is not rubric or shell[1] != version:
            request = self._request(rubric, [], mode)  # the learnt fixes decide the reply, so they are in the key
            shell = (rubric, version, cache_key(self.base_url, {**request, "rubric": rubric_fingerprint(rubric)}))
            self._shells[(id(rubric), mode)] = shell
        canonical = _VALUES_JSON.encode(values)  # prepare() yields the rubric's variables in its fixed order
        return hashlib.sha256(f"{shell[2]}|{canonical}".encode()).hexdigest()

    def _cache_hit(self, rubric: Rubric, stored: dict[str, Any], mode: AskMode, finish: Callable[..., Verdict]) -> Verdict | None:
        reading = read_completion(rubric, stored, mode, logprobs=self.logprobs is not None)
        if isinstance(reading, Unread):
            return None  # stale entry from an older parser: ask again
        self._remember(rubric, mode)
        saved = stored.get("usage") or {}
        saved_prompt, saved_completion = int(saved.get("prompt_tokens") or 0), int(saved.get("completion_tokens") or 0)
        if self.budget is not None:
            self.budget.record_cache_hit(saved_prompt, saved_completion, model=self.model)
        return finish(cached=True, mode=mode, **reading.verdict_fields(), reasoning=reading.thinking,
                      saved_prompt_tokens=saved_prompt, saved_completion_tokens=saved_completion)

    def _prepare(self, rubric: Rubric, row: Mapping[str, Any], mode: AskMode, finish: Callable[..., Verdict], *,
                 need_key: bool) -> Prepared | Verdict:
        """The request for ``mode``, or the Verdict that makes sending it needless (a cache hit, bad input).

        The row-values key is tried first (no rendering), then the rendered request's key; a hit
        found only by the latter links the row key to it for next time. Without a cache the
        request key is hashed only when the caller needs it (``need_key``).
        """
        # A trajectory's prompt depends on the window it is fitted into (learnt as the run goes): no row-values shortcut.
        fitted = bool(rubric.trajectory_variables)
        shortcut = self._row_key(rubric, row, mode) if self.cache is not None and not fitted else None
        if shortcut is not None and (stored := self.cache.get_by_row(shortcut)) is not None:  # type: ignore[union-attr]
            if (hit := self._cache_hit(rubric, stored, mode, finish)) is not None:
                return hit
        # A plain rubric's prompt is checked against a window only once one is given or learnt: the hot path of
        # short prompts pays nothing, and the provider's own refusal teaches the window the first time.
        room = self.room(rubric) if fitted or self.context_window is not None or self.dialect.window is not None else _NO_ROOM
        try:
            # render() for the others: a rubric subclass may render its own way (a cascade's demonstrations).
            messages, coverage = rubric.render_fitted(row, mode, room=room) if fitted else (rubric.render(row, mode), None)
        except RubricInputError as e:
            return finish(status="error", error_kind="input", error=str(e), mode=mode)
        except PromptOverflow as e:
            return finish(status="error", error_kind="context_overflow", mode=mode, error=f"{e} ({self._window_said()})")
        counted = -1
        if room.tokens is not None:
            counted = sum(room.counter.count(_message_text(m)) + MESSAGE_OVERHEAD for m in messages)
            if counted > room.tokens:
                return finish(status="error", error_kind="context_overflow", mode=mode, coverage=coverage,
                              error=f"the rendered prompt is about {counted:,} tokens, over the {room.tokens:,} "
                                    f"the judge's window leaves ({self._window_said()})")
        estimated = -1  # not estimated yet (the limiter and the budget estimate it then)
        if self.max_prompt_tokens is not None:
            estimated = sum(estimate_tokens(m.get("content") or "") for m in messages)
            if estimated > self.max_prompt_tokens:
                return finish(status="error", error_kind="input", mode=mode,
                              error=f"the rendered prompt is about {estimated:,} tokens, over max_prompt_tokens ({self.max_prompt_tokens:,})")
        version = self.dialect.version
        request = self._request(rubric, messages, mode)
        key = cache_key(self.base_url, request) if self.cache is not None or need_key else ""
        if self.cache is not None and (stored := self.cache.get(key)) is not None:
            if (hit := self._cache_hit(rubric, stored, mode, finish)) is not None:
                if shortcut is not None:
                    self.cache.link(shortcut, key)
                return hit if coverage is None else hit.model_copy(update={"coverage": coverage})
        # Validated, though every field is ours: pydantic 2's model_construct deep-copies each default and
        # costs twice the validation (which copies only the request's top-level dict).
        return Prepared(key=key, row_key=shortcut, mode=mode, request=request, dialect_version=version, prompt_estimate=estimated,
                        coverage=coverage, counted=counted if counted >= 0 else (
                            sum(room.counter.count(_message_text(m)) + MESSAGE_OVERHEAD for m in messages) if fitted else -1))

    def room(self, rubric: Rubric) -> Room:
        """The prompt tokens this judge has room for with ``rubric``: its context window (configured,
        learnt from a refusal, or documented) less the reply's budget, in the units of its token counter
        scaled by what the provider was seen to count. ``tokens`` is None while the window is unknown."""
        counter = token_counter(self.model)
        windows = [w for w in (self.context_window, self.dialect.window) if w is not None]
        window = min(windows) if windows else known_window(self.model)
        if window is None:
            return Room(None, counter)
        output = 0
        if not (self.dialect.window_input_only and self.dialect.window == window):
            params = {**rubric.sampling, **self.sampling}
            given = params.get("max_completion_tokens") or params.get("max_tokens")
            output = int(given) if isinstance(given, (int, float)) and not isinstance(given, bool) else min(DEFAULT_OUTPUT_RESERVE, window // 4)
        tokens = int((window - output) / self.dialect.token_scale * 0.98)  # 2%: the markup's estimate and a provider's own framing
        return Room(max(tokens, 1), counter)

    def _window_said(self) -> str:
        windows = [w for w in (self.context_window, self.dialect.window) if w is not None]
        if self.dialect.window is not None and self.dialect.window == min(windows):
            return f"window {self.dialect.window:,} tokens, learnt from {self.model} at {self.base_url}"
        if windows:
            return f"window {min(windows):,} tokens (context_window)"
        return f"window {known_window(self.model) or 0:,} tokens, documented for {self.model}"

    async def _ask_within_budget(self, rubric: Rubric, prepared: Prepared,
                                 usage: dict[str, int], finish: Callable[..., Verdict]) -> Verdict:
        """``_ask`` once the budget admits the request (one reservation covers its retries and re-asks)."""
        if self.budget is None:
            return await self._ask(rubric, prepared, usage, finish)
        request, mode = prepared.request, prepared.mode
        prompt = prepared.prompt_estimate
        if prompt < 0:
            prompt = sum(estimate_tokens(m.get("content") or "") for m in request["messages"])
        reply = int(request.get("max_completion_tokens") or request.get("max_tokens") or _COMPLETION_ALLOWANCE)
        reservation = await self.budget.start(prompt, reply, model=self.model)
        if reservation is None:
            return finish(status="skipped", error_kind="budget", error=self.budget.reason(), mode=mode)
        before = usage["prompt_tokens"], usage["completion_tokens"], usage.get("cached_tokens", 0)
        try:
            return await self._ask(rubric, prepared, usage, finish)
        finally:
            self.budget.settle(reservation, usage["prompt_tokens"] - before[0], usage["completion_tokens"] - before[1],
                               usage.get("cached_tokens", 0) - before[2])

    async def _ask(self, rubric: Rubric, prepared: Prepared, usage: dict[str, int], finish: Callable[..., Verdict]) -> Verdict:
        request, mode = prepared.request, prepared.mode
        last: Unread | None = None
        for _ in range(1 + self.retry.parse_retries):
            completion = await self._send(request, usage, dialect_version=prepared.dialect_version,
                                          prompt_estimate=prepared.prompt_estimate, counted=prepared.counted)
            if prepared.counted > 0:
                self._answered_size(completion, prepared.counted)
            reading = read_completion(rubric, completion, mode, logprobs=self.logprobs is not None, prompt=request["messages"])
            if isinstance(reading, Reading):
                if self.cache is not None:
                    self.cache.put(prepared.key, completion, row_key=prepared.row_key)
                self._remember(rubric, mode)
                return finish(mode=mode, **reading.verdict_fields(), reasoning=reading.thinking)
            if reading.kind == "refusal":  # refusals are deterministic: no re-ask
                return finish(status="error", error_kind="refusal", error=reading.error, mode=mode, raw=reading.raw)
            last = reading
            if reading.kind == "truncated":
                break  # the same limit cuts the same reply off again: no re-ask
        assert last is not None
        if (number := read_missed_schema(rubric, last)) is not None:
            return finish(mode=mode, **number.verdict_fields(), reasoning=number.thinking)
        return finish(status="error", error_kind=last.kind, error=last.error, mode=mode, raw=last.raw, reasoning=last.thinking)

    def _answered_size(self, completion: Mapping[str, Any], counted: int) -> None:
        """An answered prompt: its size passes the window gate from now on, and a provider that counted
        more tokens than gradekit did (usage.prompt_tokens) scales gradekit's counts up."""
        said = (completion.get("usage") or {}).get("prompt_tokens")
        tokens = int(said) if isinstance(said, (int, float)) and not isinstance(said, bool) and said > 0 else counted
        changed = self.dialect.answered_size(counted)  # in gradekit's count, the one the gate compares
        if tokens > counted * self.dialect.token_scale * 1.02 and counted >= 256:  # short by more than the noise
            changed = self.dialect.learn_window(None, False, tokens / counted) or changed
        if changed:
            self.dialect.keep(self.cache, self.endpoint)

    def _learn_overflow(self, exc: openai.BadRequestError, counted: int) -> bool | None:
        """A context-length refusal: learn the window (and how short gradekit's count came) from it.

        None: not a context-length refusal; True: something was learnt (render again); False: one,
        but nothing new is known, so the same prompt would be refused again.
        """
        code, _, said = error_fields(exc.body, str(exc))
        found = overflow_of(code, said)
        if found is None:
            return None
        scale = None
        if counted > 0:
            if found.prompt_tokens is not None:
                scale = found.prompt_tokens / counted
            elif found.window is not None and counted * self.dialect.token_scale <= found.window:
                # Refused at fewer tokens than the window by our count, and the refusal does not say how many it
                # counted: it counts more than we do, by an unknown margin; a quarter more than the least it can be.
                scale = max(self.dialect.token_scale * 1.25, (found.window + 1) / counted * 1.1)
        window = found.window
        if window is None and counted > 0:  # a refusal without a number: the prompt was too long, so the window is below it
            window = max(int(counted * self.dialect.token_scale * 0.75), 1)
        if self.dialect.learn_window(window, found.input_only, scale):
            self.dialect.keep(self.cache, self.endpoint)
            log.warning("%s at %s: %s", self.model, redact_url(self.base_url), self.dialect.learnt[-1])
            return True
        # Learnt already by another request of the wave: this one's prompt was built before it, so render it again.
        return self.dialect.window is not None and counted > 0

    async def _send(self, request: dict[str, Any], usage: dict[str, int], *, route: Route = "chat",
                    dialect_version: int | None = None, prompt_estimate: int = -1, counted: int = -1) -> dict[str, Any]:
        """One request through the limiter, the breaker and the retry policy (chat completions or embeddings).

        On an endpoint met carefully (a model family known to refuse parameters, or one that refused
        something), a chat request carrying a parameter or output mode the endpoint has not answered
        yet goes through its learning gate: the others wait for the first such request (at most
        ``LEARN_WAIT_S`` once it is on the wire), so a 400 for a parameter the model refuses is met
        once and its fix (:mod:`gradekit.judge._dialect`) applies to every request after it. A request made
        of what the endpoint accepted before (this process, or an earlier one through the cache),
        or to any other endpoint, is sent at once.
        Raises ``_Relearn`` when the request was built before a fix it lacks.
        """
        if route == "embeddings":
            estimate = sum(estimate_tokens(text) for text in request["input"])
        else:
            estimate = prompt_estimate if prompt_estimate >= 0 else sum(estimate_tokens(m.get("content") or "") for m in request["messages"])
            estimate += int(request.get("max_completion_tokens") or request.get("max_tokens") or _COMPLETION_ALLOWANCE)
        dialect = self.dialect
        sizing = False
        if route == "chat" and counted > WINDOW_GATE_TOKENS and self._window_unknown():
            # A long prompt to an endpoint whose window is unknown: the first goes alone; its refusal (if any)
            # teaches the window, and the others are rendered again within it instead of each meeting the 400.
            sizing = await dialect.window_gate.enter(
                lambda: (dialect_version is not None and dialect_version != dialect.version) or not self._window_unknown()
                or counted <= dialect.accepted_tokens)
            if dialect_version is not None and dialect_version != dialect.version:
                if sizing:
                    dialect.window_gate.leave()
                raise _Relearn()
        try:
            return await self._send_sized(request, usage, route, dialect_version, estimate, counted)
        finally:
            if sizing:
                dialect.window_gate.leave()

    def _window_unknown(self) -> bool:
        """Neither given nor learnt: a documented window may not be this endpoint's (a deployment's own limit)."""
        return self.context_window is None and self.dialect.window is None

    async def _send_sized(self, request: dict[str, Any], usage: dict[str, int], route: Route, dialect_version: int | None,
                          estimate: int, counted: int) -> dict[str, Any]:
        def before_sleep(state: RetryCallState) -> None:
            self._fleet.before_retry(state.outcome.exception() if state.outcome else None)

        dialect = self.dialect
        learning = False
        if route == "chat":
            stale = dialect_version is not None
            if not dialect.knows(request):
                learning = await dialect.gate.enter(
                    lambda: (stale and dialect_version != dialect.version) or dialect.knows(request))
            if stale and dialect_version != dialect.version:
                if learning:
                    dialect.gate.leave()
                raise _Relearn()
        try:
            breaker = current_breaker()

            async def once() -> dict[str, Any]:
                try:
                    completion = await self._fleet.send(request, estimate, usage, breaker, route)
                except Failed:
                    raise
                except Exception as exc:
                    if route == "chat" and isinstance(exc, openai.BadRequestError) and (learnt := self._learn_overflow(exc, counted)) is not None:
                        if learnt:
                            raise _Relearn() from exc  # rendered again within the learnt window (or found not to fit)
                        raise Failed("context_overflow", f"{status_message(exc)} (nothing to learn from it: the same prompt "
                                     "would be refused again)", 400) from exc
                    if route == "chat" and isinstance(exc, openai.BadRequestError) and self._refused_parameter(exc, request):
                        raise _Relearn() from exc  # not the row's failure, not the breaker's business
                    if breaker is not None and isinstance(exc, openai.RateLimitError):
                        breaker.refused(error_of(exc).args[0], hint=retry_after_seconds(exc), model=request["model"],
                                        base_url=", ".join(m.base_url for m in self._fleet.members))
                    elif breaker is not None:
                        breaker.request(breaker_failure(exc), base_url=self.base_url, model=request["model"])
                    raise
                if breaker is not None:
                    breaker.request(None, base_url=self.base_url, model=request["model"])
                return completion

            try:
                completion = await self.retry.call(once, sleep=self._sleep, before_sleep=before_sleep)
            except (asyncio.CancelledError, _Relearn):
                raise
            except Failed:
                if learning:  # an answer all the same (a parameter the user set, refused): the others need not wait
                    dialect.settle(request, accepted=False)
                raise
            except Exception as exc:  # every other failure becomes a Verdict error via Failed
                failure = error_of(exc)
                if failure.output_format and learning:
                    # Learnt by the request the gate let out first: those waiting skip this mode instead
                    # of each meeting the same 400. Later format 400s walk the chain row by row, as they
                    # may be about one row's request rather than the endpoint.
                    self.dialect.refuse_mode(ask_mode_of(request))
                    self.dialect.keep(self.cache, self.endpoint)
                elif failure.output_format:  # met unheld: the next mode this row tries goes through the gate
                    dialect.refused()
                elif learning:
                    dialect.settle(request, accepted=False)
                raise failure from exc
            if route == "chat" and dialect.settle(request, accepted=True):
                self.dialect.keep(self.cache, self.endpoint)
            return completion
        finally:
            if learning:
                dialect.gate.leave()

    def _refused_parameter(self, exc: openai.BadRequestError, request: dict[str, Any]) -> bool:
        """Learn the fix a 400 asks for; True when the request is to be built again with it.

        A parameter the user set is not dropped: that 400 becomes the row's error (with a
        message naming the parameter), except max_tokens/max_completion_tokens, renamed.
        """
        code, param, said = error_fields(exc.body, str(exc))
        if names_output_format(code, param, said) and not (code or "").startswith("unsupported"):
            return False
        fix = parameter_fix(code, param, said, request)
        if fix is None:
            return False
        if fix.param is not None and fix.param in self.sampling:
            name = fix.param
            fix = user_fix(fix)
            if fix is None:
                raise Failed("bad_request", f"{self.model} at {self.base_url} does not take the judge parameter "
                              f"{name}={self.sampling[name]!r} you set (HTTP 400: {said}); remove it "
                              "(`params`, `params.temperature`, `params.reasoning_effort`)", 400) from exc
        if self.dialect.learn(fix):  # said once: the other requests of an unheld wave meet the same 400
            self.dialect.keep(self.cache, self.endpoint)
            log.warning("%s at %s: %s", self.model, self.base_url, fix.describe())
        return True

    # ---- requests built here, sent elsewhere (the provider's Batch API) ---------------------

    def prepare(self, rubric: Rubric, row: Mapping[str, Any], mode: AskMode | None = None) -> Prepared | Verdict:
        """Build the request ``judge`` would send first for this row, without sending it.

        For front doors that deliver requests another way (a provider Batch API run): the request,
        cache key and ask mode are the live path's own, so both paths share one cache. A cache
        hit or a row that does not render comes back as the Verdict ``judge`` would return, so
        such a row is never sent. ``mode`` overrides the mode ``judge`` would start with (the
        next mode of the fallback chain after a bad_request).
        """
        rubric = bind_row(rubric, row)
        return self._prepare(rubric, row, mode or rubric.ask_modes[self._start_mode(rubric)], Verdict, need_key=True)

    def verdict_from_completion(self, rubric: Rubric, completion: Mapping[str, Any], *, mode: AskMode, key: str = "",
                                row_key: str | None = None, attempts: int = 1) -> Verdict:
        """Read a completion obtained elsewhere for a :meth:`prepare` d request, as ``judge`` would.

        ``mode``, ``key`` and ``row_key`` are the Prepared's. A success is cached under its keys and
        its mode remembered; a parse failure is not re-asked here (re-asking is the sender's call).
        """
        completion = dict(completion)
        spent = completion.get("usage") or {}
        fields: dict[str, Any] = {"mode": mode, "attempts": attempts, "prompt_tokens": int(spent.get("prompt_tokens") or 0),
                                  "completion_tokens": int(spent.get("completion_tokens") or 0),
                                  "reasoning_tokens": usage_detail(spent, "completion_tokens_details", "reasoning_tokens"),
                                  "cached_tokens": usage_detail(spent, "prompt_tokens_details", "cached_tokens"),
                                  "reasoning": reasoning_of(completion)}
        if not completion.get("choices"):
            return Verdict(status="error", error_kind="server_error", error="completion has no choices", **fields)
        reading = read_completion(rubric, completion, mode, logprobs=self.logprobs is not None)
        if isinstance(reading, Unread):  # the thinking is in ``fields`` already, for every outcome
            if (number := read_missed_schema(rubric, reading)) is not None:
                return Verdict(**number.verdict_fields(), **fields)
            return Verdict(status="error", error_kind=reading.kind, error=reading.error, raw=reading.raw, **fields)
        if self.cache is not None and key:
            self.cache.put(key, completion, row_key=row_key)
        self._remember(rubric, mode)
        return Verdict(**reading.verdict_fields(), **fields)

    @staticmethod
    def verdict_from_error(*, mode: AskMode, status_code: int | None = None, body: Any = None, code: str | None = None,
                           message: str | None = None, attempts: int = 1) -> Verdict:
        """The error Verdict of a request that failed elsewhere, with the kinds ``judge`` uses.

        Either an HTTP status with its body (a batch line's ``response``), or a provider error
        ``code`` and ``message`` (a batch line's ``error``: request_timeout, batch_expired,
        batch_cancelled, ...).
        """
        if status_code is not None and status_code != 200:
            # Worded as a live APIStatusError is, so a batch row reads like the live one.
            return Verdict(status="error", error_kind=status_error_kind(status_code),
                           error=status_text(status_code, status_detail(status_code, body)), mode=mode, attempts=attempts)
        kind: ErrorKind = "timeout" if code in ("request_timeout", "batch_expired") else "server_error"
        text = f"{code}: {message}" if code else (message or "the request failed without an error message")
        return Verdict(status="error", error_kind=kind, error=text, mode=mode, attempts=attempts)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content or [] if isinstance(p, Mapping))


class Prepared(BaseModel):
    """A judge request built by :meth:`Judge.prepare` but not sent: the same request, cache key and
    ask mode the live path would use. Hand ``mode``/``key``/``row_key`` back to
    :meth:`Judge.verdict_from_completion` with the completion."""

    key: str  # cache_key(base_url, request)
    row_key: str | None = None  # the row-values shortcut, linked to ``key`` when the reply is cached
    mode: AskMode
    request: dict[str, Any]
    dialect_version: int = 0  # the endpoint's learnt fixes it was built with (rebuilt when they change)
    prompt_estimate: int = -1  # estimate_tokens of the messages, when already counted (-1: not yet)
    coverage: TrajectoryCoverage | None = None  # what the judge is shown of the row's trajectory
    counted: int = -1  # the prompt's tokens by the window's counter (-1: not counted), to learn what the provider counts
