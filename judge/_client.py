"""The judge client: cache -> limiter -> retry -> OpenAI-compatible API -> parse -> Verdict."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import openai
from openai import AsyncOpenAI
from pydantic import BaseModel
from tenacity import RetryCallState

from ._breaker import current_breaker
from ._budget import Budget
from ._cache import JudgeCache, cache_key
from ._embeddings import Embeddings, embedding_key
from ._checklist import bind_row, row_text, unbound
from ._deadline import DEFAULT_TIMEOUT_S, ROW_DEADLINE_FACTOR, row_clock, row_scope
from ._dialect import Fix, ask_mode_of, dialect_of, error_fields, names_output_format, parameter_fix, user_fix
from ._fastwire import wanted as fast_wire_wanted
from ._fleet import Endpoint, EndpointStats, Fleet, endpoints_of
from ._hedge import HedgePolicy, HedgeStats
from ._limiter import RequestLimiter, estimate_tokens
from ._limiters import process_limiter
from ._pacing import Pacing
from ._parse import Reading, Unread, read_completion, read_missed_schema, reasoning_of
from ._protocol import JudgeIdentity, JudgeStats
from ._redact import redact_url
from ._reward_model import NoScore, RewardRoute, RewardScore, read_reward, server_root
from ._retry import RetryPolicy, is_local, retry_after_seconds
from ._rubric import AskMode, PromptOverflow, Room, Rubric, RubricInputError, rubric_fingerprint
from ._tokens import ESTIMATE, MESSAGE_OVERHEAD, token_counter
from ._trajectory import TrajectoryCoverage
from ._window import known_window, overflow_of
from ._native import claude_minimum_tokens
from ._navigate import navigate
from ._steps import judge_steps
from ._thinking import read_message
from ._tiers import DEFAULT_FLEX_DEADLINE_S, ROW_STARTED, FlexFull, flex_capacity, flex_retrying, standard
from ._verdict import NO_USAGE, ErrorKind, Usage, Verdict
from ._warm import (OPENAI_MINIMUM_TOKENS, Warmer, breakpoint_marker, mark_shared_prefix, prompt_cache_key, shared_prefix,
                    takes_prompt_cache_key)
from ._wire import (Failed, Route, breaker_failure, carrying, error_of, local_message, served_of, spent_by, status_detail, status_error_kind,
                    status_message, status_text, usage_counts, vectors_of)


class _Limits(Protocol):
    @property
    def given(self) -> bool: ...


class JudgeSpecLike(Protocol):
    """What ``Judge(spec)`` reads of a spec (judge._spec's ``JudgeSpec`` meets it). A protocol, not the class: the spec
    module builds Judges (``JudgeSpec.build``), so it imports this one and not the reverse."""

    @property
    def limits(self) -> _Limits: ...

    def limiter(self) -> RequestLimiter: ...

    def judge_keywords(self) -> dict[str, Any]: ...

log = logging.getLogger("gradekit.judge")
Api = Literal["chat", "responses", "anthropic"]
APIS: tuple[str, ...] = ("chat", "responses", "anthropic")
_RESPONSES_ONLY = re.compile(r"only supported in v1/responses|only available (?:in|via|through) the responses api|"
                             r"use the responses api", re.IGNORECASE)
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


def _failed_here(exc: BaseException, started: float) -> Verdict:
    """A judgement that failed in this process (judge._retry.is_local): its local_error Verdict, never an exception."""
    return Verdict(status="error", error_kind="local_error", error=local_message(exc), latency_s=time.perf_counter() - started)


def _route_failure(failure: Failed, url: str, model: str) -> tuple[Usage, str]:
    """What a failed request to a side route (embeddings, a reward model's) spent, and its error text: a 404 says
    which URL lacks the route or the model, the usual cause, before the server's own words."""
    error = str(failure)
    if failure.status == 404:
        error = f"{url} has no route or no model {model!r}: {error}"
    return spent_by(failure), error


class Judge:
    """Asks an OpenAI-compatible model to apply a rubric and returns a Verdict, never an exception.

    Two ways to say which judge: ``Judge(spec, limiter=..., cache=..., budget=...)`` with a
    :class:`~judge.JudgeSpec` (what every front door builds, layered with ``JudgeSpec.merge``), or
    ``Judge(model, base_url=..., timeout=...)`` with the spec's fields as keywords (the library's
    first form, kept: it reads well in a notebook). With a spec, its fields are given in the spec,
    not beside it (a keyword that repeats one is a TypeError); the run's parts (``limiter``,
    ``cache``, ``budget``, ``retry``, ``sleep``, ``warm``, ``fast_wire``) are keywords either way,
    and without ``limiter`` a spec that gives ``limits`` gets a limiter of its own built from them.

    Args:
        model: model name (or a JudgeSpec); defaults to $GRADEKIT_MODEL, else gpt-4o-mini.
        base_url: API root; defaults to $OPENAI_BASE_URL, else OpenAI. A list of roots is a fleet
            (:mod:`gradekit.judge._fleet`): one judge served by several replicas, keys or regions.
        api_key: defaults to $OPENAI_API_KEY; local servers that need none get a placeholder. With
            a list of ``base_url``: one key for all, or a list in the same order.
        endpoints: a fleet given as :class:`~judge.Endpoint` (or mappings): ``base_url``, ``api_key``,
            ``weight``, ``rps``, ``tpm`` each. Every endpoint has its own limiter (built like
            ``limiter``), pacing and health breaker; a request goes to the one with the most free
            capacity, and from a broken one to the others. The fleet is named by its first
            endpoint: ``base_url``, cache keys, the learnt dialect and a run's checkpoint are its.
        timeout: seconds per request (first byte, every gap and the total).
        row_deadline: seconds one row's requests may spend on the wire in all, over every attempt, retry
            and re-ask (:mod:`gradekit.judge._deadline`); None: ``ROW_DEADLINE_FACTOR`` (3) x ``timeout``.
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
        api: how judgements are sent: ``chat`` (chat completions), ``responses`` (the OpenAI Responses API, for
            Responses-only models) or ``anthropic`` (Anthropic's Messages API: prompt caching at a
            ``cache_control`` breakpoint and structured output, which its OpenAI-compatible endpoint drops).
            None: ``anthropic`` for api.anthropic.com, else chat until the endpoint says the model is
            Responses-only (learnt once, kept in the cache like every other fix).
        service_tier: ``flex`` sends every request at the flex tier (about half price, slower, sometimes
            no capacity: :mod:`gradekit.judge._tiers`); None: the provider's standard tier.
        flex_deadline_s: seconds after a row started past which a flex request the provider has no
            capacity for is sent at the standard tier instead [600].
        prompt_cache_key: the provider's prompt-cache routing key, one per (rubric version, judge):
            None sends it where the provider documents it (OpenAI, Azure OpenAI), True everywhere,
            False never, a string is the key itself.
        warm: send one request per cold shared prefix ahead of its wave, so the provider's prompt cache is
            written once and read by the rest (:mod:`gradekit.judge._warm` says when it applies); False: every
            request goes at once, as before.
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
        model: str | JudgeSpecLike | None = None,
        *,
        base_url: str | Sequence[str] | None = None,
        api_key: str | Sequence[str] | None = None,
        endpoints: Sequence[Endpoint | Mapping[str, Any]] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
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
        api: Api | None = None,
        service_tier: str | None = None,
        flex_deadline_s: float | None = None,
        prompt_cache_key: bool | str | None = None,
        warm: bool = True,
        fast_wire: bool | None = None,
        row_deadline: float | None = None,
    ) -> None:
        if model is not None and not isinstance(model, str):  # a JudgeSpec (judge._spec imports this module, so not by name)
            given = locals()
            beside = sorted(name for name, default in _SPEC_KEYWORDS.items() if given[name] != default)
            if beside:
                raise TypeError(f"Judge(spec, ...): give {', '.join(beside)} in the spec (JudgeSpec.merge puts one over another), "
                                "not beside it")
            if limiter is None and model.limits.given:
                limiter = model.limiter()
            self.__init__(**model.judge_keywords(), limiter=limiter, cache=cache, retry=retry, sampling=sampling,  # type: ignore[misc]
                          sleep=sleep, budget=budget, warm=warm, fast_wire=fast_wire)
            return
        self.model = model or os.environ.get("GRADEKIT_MODEL") or DEFAULT_MODEL
        if context_window is not None and context_window < 1:
            raise ValueError(f"context_window must be at least 1 token, got {context_window}")
        self.context_window = context_window
        if row_deadline is not None and not row_deadline > 0:
            raise ValueError(f"`row_deadline` must be a positive number of seconds, not {row_deadline}")
        self.row_deadline = row_deadline if row_deadline is not None else ROW_DEADLINE_FACTOR * timeout
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
        if api is not None and api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {api!r}")
        if flex_deadline_s is not None and not flex_deadline_s >= 0:
            raise ValueError(f"flex_deadline_s must be zero or more seconds, got {flex_deadline_s}")
        self.api = api
        self.service_tier = service_tier or None
        self.flex_deadline_s = DEFAULT_FLEX_DEADLINE_S if flex_deadline_s is None else float(flex_deadline_s)
        self.flex_fallbacks = 0  # flex requests sent at the standard tier after their row's deadline
        self._timeout = timeout
        self._cache_key_setting = prompt_cache_key
        self._cache_keys: dict[int, tuple[Rubric, str]] = {}
        self.warm = warm
        self.warmer = Warmer()
        # The explicit-cache breakpoint this endpoint wants at the end of the shared prefix (None: none); a native API
        # places its own (judge._native), and an endpoint that refuses it is learnt to take none.
        self._marker = breakpoint_marker(fleet[0].base_url, self.model) if prompt_cache_key is not False else None
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
        """What is sent for ``messages`` in ``mode``: build_request with this endpoint's learnt fixes, the
        prompt-cache key and the service tier (neither of which changes the reply, so neither is in the cache key)."""
        request = build_request(rubric, messages, mode, self.model, self.sampling)
        key = self._prompt_cache_key(rubric)
        if key is not None and "prompt_cache_key" not in request:
            request["prompt_cache_key"] = key
        if self.service_tier is not None and "service_tier" not in request:
            request["service_tier"] = self.service_tier
        marker = self._marker
        if marker is not None and marker[0] not in self.dialect.drop and messages:
            request["messages"] = mark_shared_prefix(request["messages"], *marker)
        return self.dialect.apply(request)

    def _prompt_cache_key(self, rubric: Rubric) -> str | None:
        setting = self._cache_key_setting
        if isinstance(setting, str):
            return setting
        if setting is False or (setting is None and not takes_prompt_cache_key(self.base_url)):
            return None
        rubric = unbound(rubric)
        known = self._cache_keys.get(id(rubric))
        if known is None or known[0] is not rubric:
            known = (rubric, prompt_cache_key(rubric_fingerprint(rubric), self.model))
            self._cache_keys[id(rubric)] = known
        return known[1]

    @property
    def route(self) -> Route:
        """How a judgement goes out now: the ``api`` given, else what the endpoint taught (or its host says)."""
        if self.api is not None:
            return self.api
        learnt = self.dialect.api
        if learnt is not None:
            return learnt  # type: ignore[return-value]
        return "anthropic" if (urlsplit(self.base_url).hostname or "").lower() == "api.anthropic.com" else "chat"

    def _warm_key(self, request: Mapping[str, Any], route: Route) -> str | None:
        """The key of the request's shared prefix when it is worth warming (see judge._warm), else None."""
        if not self.warm or self.concurrency <= 1:
            return None
        shared = shared_prefix(request)
        if shared is None:
            return None
        minimum = claude_minimum_tokens(self.model) if route == "anthropic" else OPENAI_MINIMUM_TOKENS
        return f"{route}|{shared[0]}" if shared[1] >= minimum else None

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
        """Judge one row. Every outcome, including bad input and a failure in this process, comes back as a Verdict.

        A rubric with ``granularity: step`` gets one verdict per assistant step (:mod:`gradekit.judge._steps`);
        one with ``navigate: true`` lets the judge read the trace with tools (:mod:`gradekit.judge._navigate`).
        """
        started = time.perf_counter()
        try:
            if rubric.granularity == "step":
                return await judge_steps(self, rubric, row)
            if rubric.navigate:
                return await navigate(self, rubric, row)
            return await self.judge_once(rubric, row)
        except Exception as exc:  # noqa: BLE001 - raised here, not by the judge (which _send makes a Failed): the row's local_error
            return _failed_here(exc, started)

    async def judge_once(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
        """One judgement of one row (a whole trajectory, or one step of it), whatever the rubric's granularity."""
        started = time.perf_counter()
        ROW_STARTED.set(time.monotonic())  # a flex request's deadline counts from here
        try:
            with row_scope(self.row_deadline):  # every attempt, retry and re-ask of this judgement against one deadline
                return await self._judge(rubric, row, started)
        except Exception as exc:  # noqa: BLE001 - one step's judgement failing here is that step's local_error
            return _failed_here(exc, started)

    async def _judge(self, rubric: Rubric, row: Mapping[str, Any], started: float) -> Verdict:
        rubric = bind_row(rubric, row)  # a per-row checklist: this row's criteria and schema
        spent = NO_USAGE  # the requests of the asks that came to nothing (a relearnt request, a refused output mode)

        def finish(**fields: Any) -> Verdict:
            return Verdict(latency_s=time.perf_counter() - started, **fields)

        def told(verdict: Verdict) -> Verdict:
            """The verdict's usage with the judgement's earlier requests added (none: the verdict as it is)."""
            return verdict.model_copy(update={"usage": spent + verdict.usage}) if spent.requests else verdict

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
                    return told(prepared)
                try:
                    verdict = await self._ask_within_budget(rubric, prepared, finish, data=row_text(rubric, row))
                    return told(verdict.shown(prepared.coverage))
                except _Relearn as relearn:
                    spent += spent_by(relearn)
                    if mode in self.dialect.refused_modes and mode != chain[-1]:
                        break  # another request learnt that this mode is refused
                    continue  # a fix was learnt (here or by another request): build the request again
                except Failed as failure:
                    spent += spent_by(failure)
                    structured = mode != chain[-1]
                    # Only a 400 about the output format walks the chain; a model name, a parameter or a
                    # context length fails the same way in every format.
                    if failure.kind == "bad_request" and structured and failure.output_format:
                        first_bad_request = first_bad_request or failure
                        break  # this server may not support the mode: try the next one
                    if first_bad_request is not None and failure.kind == "bad_request":
                        failure = first_bad_request
                    return finish(status="error", error_kind=failure.kind, error=str(failure), mode=mode, coverage=prepared.coverage,
                                  usage=spent)
            else:
                return finish(status="error", error_kind="context_overflow" if rubric.trajectory_variables or self.dialect.window
                              else "bad_request", mode=mode, usage=spent,
                              error=f"the endpoint refused {_MAX_RELEARNS} versions of the request: "
                                    + "; ".join(self.dialect.learnt))
        assert first_bad_request is not None
        return finish(status="error", error_kind="bad_request", error=str(first_bad_request), mode=chain[-1], usage=spent)

    async def embed(self, texts: Sequence[str], *, model: str) -> Embeddings:
        """Embed ``texts`` with ``model`` on the judge's endpoint (``POST {base_url}/embeddings``).

        The same path as a judgement: cache, shared limiter, retry policy and the run's breaker.
        Never raises: a failure is ``status="error"`` with the judge's error kinds (a server
        without the route, or without the model, answers 404: ``bad_request``). Each text is
        cached on its own, so a reference shared by many rows is embedded once; the texts the
        cache lacks go out in one request. Embeddings are not charged to a ``budget``.
        """
        started = time.perf_counter()
        spent = NO_USAGE
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
            return Embeddings(latency_s=time.perf_counter() - started, prompt_tokens=spent.prompt_tokens,
                              attempts=spent.requests, cached=not missing, **fields)

        if missing:
            request = {"model": model, "input": missing, "encoding_format": "float"}  # float: the SDK would ask for base64
            try:
                response, spent = await self._send(request, route="embeddings")
            except Failed as failure:
                spent, error = _route_failure(failure, f"{self.base_url.rstrip('/')}/embeddings", model)
                return finish(status="error", error_kind=failure.kind, error=error)
            fresh = dict(zip(missing, vectors_of(response, len(missing))))
            for text, vector in fresh.items():
                if self.cache is not None:
                    self.cache.put(keys[text], {"object": "embedding", "model": model, "embedding": vector})
            vectors = [fresh[text] if vector is None else vector for text, vector in zip(texts, vectors)]
        return finish(status="ok", vectors=vectors)

    async def reward_score(self, route: RewardRoute, request: dict[str, Any]) -> RewardScore:
        """Ask a served reward model for its score: ``request`` (the route's body, judge._reward_model)
        posted to ``route`` under the endpoint's root, ``model`` set to the judge's.

        The same path as a judgement: the response cache (the reply is cached under the route and
        body), the shared limiter, the retry policy with Retry-After, the run's breaker, and a fleet's
        routing, failover and hedging. Never raises: a failure is ``status="error"`` with the judge's
        error kinds, never a score of 0.
        """
        started = time.perf_counter()
        spent = NO_USAGE
        request = {"model": self.model, **request}
        key = cache_key(self.base_url, {"route": route, **request})

        def finish(**fields: Any) -> RewardScore:
            return RewardScore(latency_s=time.perf_counter() - started, prompt_tokens=spent.prompt_tokens,
                               attempts=spent.requests, **fields)

        stored = self.cache.get(key) if self.cache is not None else None
        if isinstance(stored, dict) and isinstance(value := read_reward(route, stored), float):
            return finish(status="ok", value=value, cached=True)
        try:
            reply, spent = await self._send(request, route=route)
        except Failed as failure:
            spent, error = _route_failure(failure, f"{server_root(self.base_url)}{route}", self.model)
            return finish(status="error", error_kind=failure.kind, error=error)
        value = read_reward(route, reply)
        if isinstance(value, NoScore):
            return finish(status="error", error_kind="bad_request", error=value.message)
        if self.cache is not None:
            self.cache.put(key, reply)
        return finish(status="ok", value=value)

    async def generate(self, messages: list[dict[str, Any]], *, json_object: bool = False) -> Generated:
        """Free text from the judge's model (an optimiser writing guidelines, not a verdict), through the same path as a
        judgement: the cache, the budget, the limiter, the retry policy, the learnt dialect and the run's breaker.

        ``json_object`` asks for a JSON object (``response_format``); an endpoint that refuses it is asked in plain
        text once. Never raises: a failure is ``status="error"`` (or ``skipped`` past the budget) with its kind.
        """
        started = time.perf_counter()
        spent = NO_USAGE

        def finish(**fields: Any) -> Generated:
            # Generated's usage as it always counted: the tokens by kind, not their cache writes or flex part.
            told = Usage(prompt_tokens=spent.prompt_tokens, completion_tokens=spent.completion_tokens,
                         reasoning_tokens=spent.reasoning_tokens, cached_tokens=spent.cached_tokens, requests=spent.requests)
            return Generated(latency_s=time.perf_counter() - started, usage=told, **fields)

        shapes = [True, False] if json_object else [False]
        failure: Failed | None = None
        for as_json in shapes:
            for _ in range(_MAX_RELEARNS):
                request: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": 0.0, **self.sampling}
                if as_json:
                    request["response_format"] = {"type": "json_object"}
                request = self.dialect.apply(request)
                version = self.dialect.version
                key = cache_key(self.base_url, request)
                if self.cache is not None and (stored := self.cache.get(key)) is not None:
                    answer = read_message(((stored.get("choices") or [{}])[0]).get("message") or {}).answer
                    if answer:
                        return finish(status="ok", text=answer, cached=True, **served_of(stored))
                reservation = None
                if self.budget is not None:
                    prompt = sum(estimate_tokens(m.get("content") or "") for m in messages)
                    reply = int(request.get("max_completion_tokens") or request.get("max_tokens") or _COMPLETION_ALLOWANCE)
                    reservation = await self.budget.start(prompt, reply, model=self.model)
                    if reservation is None:
                        return finish(status="skipped", error_kind="budget", error=self.budget.reason())
                used = NO_USAGE
                try:
                    completion, used = await self._send(request, dialect_version=version)
                except _Relearn as relearn:
                    used = spent_by(relearn)
                    continue  # a fix was learnt: build the request again
                except Failed as e:
                    used = spent_by(e)
                    failure = e
                    break
                finally:
                    spent += used
                    if reservation is not None and self.budget is not None:
                        self.budget.settle(reservation, used.prompt_tokens, used.completion_tokens, used.cached_tokens)
                answer = read_message(((completion.get("choices") or [{}])[0]).get("message") or {}).answer
                if not answer:
                    return finish(status="error", error_kind="parse_failure", error="the reply holds no text (only thinking, or nothing)",
                                  **served_of(completion))
                if self.cache is not None:
                    self.cache.put(key, completion)
                return finish(status="ok", text=answer, **served_of(completion))
            else:
                return finish(status="error", error_kind="bad_request", error=f"the endpoint refused {_MAX_RELEARNS} versions of the request")
            if failure is not None and not (as_json and failure.kind == "bad_request" and failure.output_format):
                break  # only a refused output format is worth asking again in plain text
        assert failure is not None
        return finish(status="error", error_kind=failure.kind, error=str(failure))

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

    def _cache_hit(self, rubric: Rubric, stored: dict[str, Any], mode: AskMode, finish: Callable[..., Verdict],
                   data: str | None = None) -> Verdict | None:
        reading = read_completion(rubric, stored, mode, logprobs=self.logprobs is not None, data=data)
        if isinstance(reading, Unread):
            return None  # stale entry from an older parser: ask again
        self._remember(rubric, mode)
        saved = stored.get("usage") or {}
        saved_prompt, saved_completion = int(saved.get("prompt_tokens") or 0), int(saved.get("completion_tokens") or 0)
        if self.budget is not None:
            self.budget.record_cache_hit(saved_prompt, saved_completion, model=self.model)
        return finish(cached=True, mode=mode, **reading.verdict_fields(), reasoning=reading.thinking,
                      saved_prompt_tokens=saved_prompt, saved_completion_tokens=saved_completion, **served_of(stored))

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
        data = row_text(rubric, row) if self.cache is not None else None  # read as the live reply was: the row's planted verdicts
        if shortcut is not None and (stored := self.cache.get_by_row(shortcut)) is not None:  # type: ignore[union-attr]
            if (hit := self._cache_hit(rubric, stored, mode, finish, data)) is not None:
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
            if (hit := self._cache_hit(rubric, stored, mode, finish, data)) is not None:
                if shortcut is not None:
                    self.cache.link(shortcut, key)
                return hit.shown(coverage)
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

    async def _ask_within_budget(self, rubric: Rubric, prepared: Prepared, finish: Callable[..., Verdict],
                                 data: str | None = None) -> Verdict:
        """``_ask`` once the budget admits the request (one reservation covers its retries and re-asks)."""
        if self.budget is None:
            return await self._ask(rubric, prepared, finish, data)
        request, mode = prepared.request, prepared.mode
        prompt = prepared.prompt_estimate
        if prompt < 0:
            prompt = sum(estimate_tokens(m.get("content") or "") for m in request["messages"])
        reply = int(request.get("max_completion_tokens") or request.get("max_tokens") or _COMPLETION_ALLOWANCE)
        reservation = await self.budget.start(prompt, reply, model=self.model)
        if reservation is None:
            return finish(status="skipped", error_kind="budget", error=self.budget.reason(), mode=mode)
        spent = NO_USAGE
        try:
            verdict = await self._ask(rubric, prepared, finish, data)
            spent = verdict.usage
            return verdict
        except BaseException as exc:
            spent = spent_by(exc)
            raise
        finally:
            self.budget.settle(reservation, spent.prompt_tokens, spent.completion_tokens, spent.cached_tokens,
                               cache_write_tokens=spent.cache_write_tokens, reasoning_tokens=spent.reasoning_tokens,
                               flex=(spent.flex_prompt_tokens, spent.flex_completion_tokens, spent.flex_cached_tokens,
                                     spent.flex_cache_write_tokens, spent.flex_reasoning_tokens))

    async def _ask(self, rubric: Rubric, prepared: Prepared, finish: Callable[..., Verdict], data: str | None = None) -> Verdict:
        """Send the prepared request (again while its reply cannot be read, ``parse_retries`` times) and read it. The
        Verdict's usage is these requests'; a failure carries them (``spent_by``)."""
        request, mode = prepared.request, prepared.mode
        last: Unread | None = None
        served: dict[str, str | None] = {}
        spent = NO_USAGE

        def asked(**fields: Any) -> Verdict:
            return finish(usage=spent, **fields)

        for _ in range(1 + self.retry.parse_retries):
            route = self.route
            try:
                async with self.warmer.turn(self._warm_key(request, route), self._timeout):
                    completion, used = await self._send_tiered(request, route, dialect_version=prepared.dialect_version,
                                                               prompt_estimate=prepared.prompt_estimate, counted=prepared.counted)
            except BaseException as exc:
                raise carrying(exc, spent + spent_by(exc))
            spent += used
            if prepared.counted > 0:
                self._answered_size(completion, prepared.counted)
            served = served_of(completion)  # who answered, on every outcome: a drifted judge's failures show it too
            reading = read_completion(rubric, completion, mode, logprobs=self.logprobs is not None, prompt=request["messages"],
                                      data=data)
            if isinstance(reading, Reading):
                if self.cache is not None:
                    self.cache.put(prepared.key, completion, row_key=prepared.row_key)
                self._remember(rubric, mode)
                return asked(mode=mode, **reading.verdict_fields(), reasoning=reading.thinking, **served)
            if reading.kind == "refusal":  # refusals are deterministic: no re-ask
                return asked(status="error", error_kind="refusal", error=reading.error, mode=mode, raw=reading.raw, **served)
            last = reading
            if reading.kind == "truncated":
                break  # the same limit cuts the same reply off again: no re-ask
        assert last is not None
        if (number := read_missed_schema(rubric, last)) is not None:
            return asked(mode=mode, **number.verdict_fields(), reasoning=number.thinking, **served)
        return asked(status="error", error_kind=last.kind, error=last.error, mode=mode, raw=last.raw, reasoning=last.thinking,
                     criteria=list(last.criteria) if last.criteria is not None else None, **served)

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

    async def _send_tiered(self, request: dict[str, Any], route: Route, *,
                           dialect_version: int | None, prompt_estimate: int, counted: int = -1) -> tuple[dict[str, Any], Usage]:
        """``_send`` at the request's service tier; a flex request the provider has no capacity for backs off
        and, once its row is ``flex_deadline_s`` old, goes at the standard tier (see judge._tiers)."""
        if request.get("service_tier") != "flex":
            return await self._send(request, route=route, dialect_version=dialect_version, prompt_estimate=prompt_estimate,
                                    counted=counted)
        deadline = (ROW_STARTED.get() or time.monotonic()) + self.flex_deadline_s
        full = NO_USAGE  # the flex requests refused for capacity
        try:
            async for attempt in flex_retrying(deadline, self._sleep):  # tenacity, the one owner of retries
                with attempt:
                    try:
                        completion, used = await self._send(request, route=route, dialect_version=dialect_version,
                                                            prompt_estimate=prompt_estimate, counted=counted)
                    except FlexFull as refused:
                        full += spent_by(refused)
                        raise
                    return completion, full + used
        except FlexFull:
            pass
        except BaseException as exc:
            raise carrying(exc, full + spent_by(exc))
        self.flex_fallbacks += 1
        log.info("%s: no flex capacity until the row's deadline (%g s): sent at the standard tier", self.model, self.flex_deadline_s)
        try:
            completion, used = await self._send(standard(request), route=route, dialect_version=dialect_version,
                                                prompt_estimate=prompt_estimate, counted=counted)
        except BaseException as exc:
            raise carrying(exc, full + spent_by(exc))
        return completion, full + used

    async def _send(self, request: dict[str, Any], *, route: Route = "chat",
                    dialect_version: int | None = None, prompt_estimate: int = -1, counted: int = -1) -> tuple[dict[str, Any], Usage]:
        """One request through the limiter, the breaker and the retry policy (chat completions or embeddings):
        the completion and what its attempts billed. A failure (``Failed``, a relearn) carries that (``spent_by``).

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
        elif route.startswith("/"):  # a reward model: a conversation or its templated text in, one number out
            estimate = sum(estimate_tokens(str(m.get("content") or "")) for m in request.get("messages") or []) \
                + estimate_tokens(str(request.get("input") or ""))
        else:
            estimate = prompt_estimate if prompt_estimate >= 0 else sum(estimate_tokens(m.get("content") or "") for m in request["messages"])
            estimate += int(request.get("max_completion_tokens") or request.get("max_tokens") or _COMPLETION_ALLOWANCE)
        dialect = self.dialect
        sizing = False
        if route != "embeddings" and counted > WINDOW_GATE_TOKENS and self._window_unknown():
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
            return await self._send_sized(request, route, dialect_version, estimate, counted)
        finally:
            if sizing:
                dialect.window_gate.leave()

    def _window_unknown(self) -> bool:
        """Neither given nor learnt: a documented window may not be this endpoint's (a deployment's own limit)."""
        return self.context_window is None and self.dialect.window is None

    async def _send_sized(self, request: dict[str, Any], route: Route, dialect_version: int | None,
                          estimate: int, counted: int) -> tuple[dict[str, Any], Usage]:
        def before_sleep(state: RetryCallState) -> None:
            self._fleet.before_retry(state.outcome.exception() if state.outcome else None)

        dialect = self.dialect
        learning = False
        judging = route != "embeddings"  # chat completions or a native API: the endpoint's dialect applies
        if judging:
            stale = dialect_version is not None
            if not dialect.knows(request):
                learning = await dialect.gate.enter(
                    lambda: (stale and dialect_version != dialect.version) or dialect.knows(request))
            if stale and dialect_version != dialect.version:
                if learning:
                    dialect.gate.leave()
                raise _Relearn()
        spent = NO_USAGE  # every attempt's, the retried ones' included
        try:
            breaker = current_breaker()
            clock = row_clock()

            async def once() -> dict[str, Any]:
                nonlocal spent
                if clock is not None and (left := clock.left()) is not None and left <= 0:
                    raise Failed("timeout", clock.passed())  # the row's deadline is spent: no further attempt
                try:
                    completion, used = await self._fleet.send(request, estimate, breaker, route)
                except Failed as failed:
                    spent += spent_by(failed)
                    raise
                except Exception as exc:
                    spent += spent_by(exc)
                    if clock is not None:
                        clock.last = str(error_of(exc))
                    if judging and isinstance(exc, openai.APIStatusError) and flex_capacity(exc, request):
                        raise FlexFull() from exc  # no flex capacity now: the row waits or falls back (_send_tiered)
                    if route == "chat" and isinstance(exc, openai.APIStatusError) and exc.status_code in (400, 404) \
                            and self._responses_only(exc):
                        raise _Relearn() from exc  # a Responses-only model: sent again through the Responses API
                    if judging and isinstance(exc, openai.BadRequestError) and (learnt := self._learn_overflow(exc, counted)) is not None:
                        if learnt:
                            raise _Relearn() from exc  # rendered again within the learnt window (or found not to fit)
                        raise Failed("context_overflow", f"{status_message(exc)} (nothing to learn from it: the same prompt "
                                     "would be refused again)", 400) from exc
                    if judging and isinstance(exc, openai.BadRequestError) and self._refused_parameter(exc, request):
                        raise _Relearn() from exc  # not the row's failure, not the breaker's business
                    if breaker is not None and isinstance(exc, openai.RateLimitError):
                        breaker.refused(error_of(exc).args[0], hint=retry_after_seconds(exc), model=request["model"],
                                        base_url=", ".join(m.base_url for m in self._fleet.members))
                    elif breaker is not None and not is_local(exc):  # a failure of this process is no request of the judge's
                        breaker.request(breaker_failure(exc), base_url=self.base_url, model=request["model"])
                    raise
                spent += used
                if breaker is not None:
                    breaker.request(None, base_url=self.base_url, model=request["model"])
                return completion

            try:
                completion = await self.retry.call(once, sleep=self._sleep, before_sleep=before_sleep)
            except (asyncio.CancelledError, _Relearn, FlexFull):
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
            if judging and dialect.settle(request, accepted=True):
                self.dialect.keep(self.cache, self.endpoint)
            return completion, spent
        except BaseException as exc:
            raise carrying(exc, spent)
        finally:
            if learning:
                dialect.gate.leave()

    def _responses_only(self, exc: openai.APIStatusError) -> bool:
        """Learn that the model is served only by the Responses API (OpenAI's o1-pro, codex and pro models answer
        chat completions "only supported in v1/responses"); True when the request is to go there instead."""
        _, _, said = error_fields(exc.body, str(exc))
        if self.api is not None or not _RESPONSES_ONLY.search(said):
            return False
        if self.dialect.learn_api("responses"):
            self.dialect.keep(self.cache, self.endpoint)
            log.warning("%s at %s is served by the Responses API only: judged through it", self.model, self.base_url)
        return True

    def _refused_parameter(self, exc: openai.BadRequestError, request: dict[str, Any]) -> bool:
        """Learn the fix a 400 asks for; True when the request is to be built again with it.

        A parameter the user set is not dropped: that 400 becomes the row's error (with a
        message naming the parameter), except max_tokens/max_completion_tokens, renamed.
        """
        code, param, said = error_fields(exc.body, str(exc))
        marker = self._marker[0] if self._marker is not None else None
        if marker is not None and marker not in self.dialect.drop and marker in f"{param or ''} {said}":
            if self.dialect.learn(Fix(param=marker, drop=(marker,))):  # the explicit-cache breakpoint: sent no more
                self.dialect.keep(self.cache, self.endpoint)
                log.warning("%s at %s: %s", self.model, self.base_url, Fix(param=marker, drop=(marker,)).describe())
            return True
        if names_output_format(code, param, said) and not (code or "").startswith("unsupported"):
            return False
        fix = parameter_fix(code, param, said, request)
        if fix is None:
            return False
        if fix.param == "service_tier" and self.service_tier is not None:
            raise Failed("bad_request", f"{self.model} at {self.base_url} does not take service_tier={self.service_tier!r} "
                          f"(HTTP 400: {said}); run it without `service_tier`", 400) from exc
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
        fields: dict[str, Any] = {"mode": mode, "attempts": attempts, **usage_counts(spent), "reasoning": reasoning_of(completion),
                                  **served_of(completion)}
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


# The keywords that are a JudgeSpec's fields (judge._spec; tests/judge/test_spec_doors.py holds the two lists equal), with their
# defaults: Judge(spec, ...) refuses one given beside the spec.
_SPEC_KEYWORDS = {name: p.default for name, p in inspect.signature(Judge.__init__).parameters.items()
                  if name in ("base_url", "api_key", "endpoints", "timeout", "params", "logprobs", "max_prompt_tokens", "hedge",
                              "context_window", "api", "service_tier", "flex_deadline_s", "prompt_cache_key", "row_deadline")}


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content or [] if isinstance(p, Mapping))


class Generated(BaseModel):
    """What :meth:`Judge.generate` produced: the reply's text (its final answer, thinking set apart), or why not."""

    status: Literal["ok", "error", "skipped"]
    text: str | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    usage: Usage = Usage()
    cached: bool = False
    latency_s: float = 0.0
    served_model: str | None = None
    system_fingerprint: str | None = None


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
