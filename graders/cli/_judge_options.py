"""The options that configure a judge, declared once for every command that talks to one.

``@judge_options`` adds them to a command's signature (typer reads ``__signature__``) and hands
the command one :class:`JudgeOptions` value (its ``opts`` argument) instead, so ``grade``, ``meta-eval``, ``probe`` and
``validate`` take the same flags with the same help, and a new judge option reaches all of them
at once (tests/test_judge_options.py checks that every such command takes every option).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._common import fail

if TYPE_CHECKING:  # the library loads when a command runs, not for --help
    from gradekit.judge import Budget, Judge, JudgeCache
    from gradekit.judge._spec import JudgeSpec

PANEL = "Judge options"


def _option(*names: str, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=PANEL, **kwargs)


# (parameter name, type, default, typer option): the one declaration.
_DECLARED: list[tuple[str, Any, Any, Any]] = [
    ("model", list[str], [], _option("--model", envvar="GRADEKIT_MODEL", show_default=False,
                                     help="Judge model [default: gpt-4o-mini]; several: grade judges with a jury (see --jury), "
                                          "cascade fit takes the cascade's judges cheapest first, meta-eval a panel.")),
    ("base_url", list[str], [], _option("--base-url", envvar="OPENAI_BASE_URL", show_default=False,
                                        help="OpenAI-compatible API root, e.g. http://localhost:8000/v1. Repeat it for a fleet: one model "
                                             "served by several replicas or keys, used together with failover (docs/fleets.md). With several --model "
                                             "(a jury): one --base-url for every juror, or one per --model in the same order.")),
    ("api_key", list[str], [], _option("--api-key", envvar="OPENAI_API_KEY", show_default=False,
                                       help="API key (read from OPENAI_API_KEY by default); with several --base-url, one key for all "
                                            "or one per --base-url in the same order.")),
    ("judge_param", list[str], [], _option("--judge-param", metavar="KEY=VALUE", show_default=False,
                                           help="A request parameter for the judge, VALUE parsed as JSON when it parses, else a string "
                                                "(repeatable): reasoning_effort=low, enable_thinking=false, thinking='{\"type\":\"disabled\"}'. "
                                                "Keys the SDK does not know go in the body as they are. See docs/judges.md.")),
    ("temperature", float | None, None, _option("--temperature", help="Sampling temperature [default: 0, or the model's own where it takes no other].")),
    ("reasoning_effort", str | None, None, _option("--reasoning-effort", help="Reasoning models: minimal, low, medium or high.")),
    ("max_completion_tokens", int | None, None, _option("--max-completion-tokens", metavar="N",
                                                        help="Cap on the judge's reply, thinking included (reasoning models count both).")),
    ("rps", float | None, None, _option("--rps", envvar="GRADEKIT_RPS", help="Requests per second for the whole process (per endpoint of a fleet).")),
    ("tpm", float | None, None, _option("--tpm", envvar="GRADEKIT_TPM", help="Tokens per minute for the whole process (per endpoint of a fleet).")),
    ("hedge", bool | None, None, _option("--hedge/--no-hedge", show_default=False,
                                         help="With several --base-url (a fleet): send a request still unanswered after max(p95, 2 x median) "
                                              "of its endpoint's recent latencies once more to another endpoint, first answer wins, at most "
                                              "10% extra requests [default: on for a fleet, and a grader file's judge.hedge; one endpoint never "
                                              "hedges]. See docs/fleets.md.")),
    ("context_window", int | None, None, _option("--context-window", metavar="TOKENS", envvar="GRADEKIT_CONTEXT_WINDOW",
                                                 help="The judge model's context window, which a trajectory is fitted into [default: "
                                                      "learnt from the provider's first context-length refusal and kept in the cache, "
                                                      "or the model's documented window]. See docs/trajectories.md.")),
    ("api", str | None, None, _option("--api", help="How judgements are sent: chat (chat completions), responses (the OpenAI Responses API, "
                                                     "for Responses-only models) or anthropic (Anthropic's Messages API: prompt caching and "
                                                     "structured output) [default: anthropic for api.anthropic.com, else chat]. See docs/judges.md.")),
    ("service_tier", str | None, None, _option("--service-tier", help="flex: the provider's cheaper, slower tier; a flex 429 (no capacity) "
                                                                       "is not a rate limit, and a row still waiting after --flex-deadline "
                                                                       "is sent at the standard tier. See docs/large-runs.md.")),
    ("flex_deadline_s", float | None, None, _option("--flex-deadline", metavar="SECONDS",
                                                    help="With --service-tier flex: seconds a row waits for flex capacity [default: 600].")),
    ("concurrency", int, 16, _option("--concurrency", envvar="GRADEKIT_CONCURRENCY", help="Requests in flight at once.")),
    ("limiter_url", str | None, None, _option("--limiter", envvar="GRADEKIT_LIMITER",
                                              help="Share --rps/--tpm and Retry-After pauses with other processes: redis://host:port/db through Redis, "
                                                   "ray through the Ray cluster's limiter actor [default: this process only; with --ray: ray].")),
    ("limiter_key", str | None, None, _option("--limiter-key", envvar="GRADEKIT_LIMITER_KEY",
                                              help="Name of the shared budget in Redis [default: --base-url|--model as given].")),
    ("no_adapt", bool, False, _option("--no-adapt", envvar="GRADEKIT_NO_ADAPT",
                                      help="Do not pace to the limit the provider's replies show (rate-limit headers, 429s); pace only to --rps/--tpm, if given.")),
    ("timeout", float, 60.0, _option("--timeout", envvar="GRADEKIT_TIMEOUT", help="Seconds per judge request.")),
    ("row_deadline", float | None, None, _option("--row-deadline", metavar="S",
                                                 help="Seconds one row's judge requests may spend in all, every attempt, retry and re-ask "
                                                      "together; past it the row is a timeout error [default: 3 x --timeout].")),
    ("cache_path", str | None, None, _option("--cache", help="Response cache: a SQLite file, or redis://host:port/db that every node of a cluster "
                                                             "reaches [default: $GRADEKIT_CACHE, else the user cache dir].")),
    ("no_cache", bool, False, _option("--no-cache", help="Neither read nor write the response cache.")),
    ("record", Path | None, None, _option("--record", help="Record the judge traffic to this vcrpy cassette (no cache).")),
    ("replay", Path | None, None, _option("--replay", help="Answer every judge request from this cassette, with no network (no cache).")),
    ("max_cost", float | None, None, _option("--max-cost", help="Stop sending requests once this many USD are spent (needs a price for the model; see --prices).")),
    ("max_tokens", int | None, None, _option("--max-tokens", help="Stop sending requests once this many prompt + completion tokens are spent.")),
    ("prices_path", Path | None, None, _option("--prices", envvar="GRADEKIT_PRICES",
                                               help="YAML/JSON {model: {input: USD per 1M tokens, output: ..., cached_input: ...}} merged over the built-in price table.")),
]
OPTION_NAMES = [name for name, *_ in _DECLARED]
_CONTEXT = "judge_options_context"


def parse_judge_params(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as request parameters: VALUE as JSON when it parses (``false``, ``0.2``,
    ``{"type": "disabled"}``), else the string itself (``low``)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--judge-param {pair!r}: expected KEY=VALUE, e.g. reasoning_effort=low")
        if key in ("model", "messages"):
            raise ValueError(f"--judge-param {key}: set by gradekit (use --model; messages come from the rubric)")
        try:
            params[key] = json.loads(text)
        except ValueError:
            params[key] = text
    return params


@dataclass
class JudgeOptions:
    """What the judge options of one command line say, and how to build the judge parts from them."""

    model: list[str] = field(default_factory=list)
    base_url: list[str] = field(default_factory=list)  # several: a fleet (one judge model, many endpoints)
    api_key: list[str] = field(default_factory=list)  # one for all endpoints, or one per --base-url
    judge_param: list[str] = field(default_factory=list)
    temperature: float | None = None
    reasoning_effort: str | None = None
    max_completion_tokens: int | None = None
    rps: float | None = None
    tpm: float | None = None
    hedge: bool | None = None  # None: the default (on for a fleet), or a grader file's judge.hedge
    context_window: int | None = None  # None: learnt, documented, or a grader file's judge.context_window
    api: str | None = None
    service_tier: str | None = None
    flex_deadline_s: float | None = None
    concurrency: int = 16
    limiter_url: str | None = None
    limiter_key: str | None = None
    no_adapt: bool = False
    timeout: float = 60.0
    row_deadline: float | None = None  # None: 3 x timeout (judge._deadline)
    cache_path: str | None = None
    no_cache: bool = False
    record: Path | None = None
    replay: Path | None = None
    max_cost: float | None = None
    max_tokens: int | None = None
    prices_path: Path | None = None
    # Where each option's value came from, as click tells: "command line", "environment" or "default" (an option
    # not listed: the command line, as for options built in Python). A grader file's judge sits between the two.
    sources: dict[str, str] = field(default_factory=dict)
    _said: set[str] = field(default_factory=set, repr=False)

    def given(self, name: str) -> bool:
        """Whether option ``name`` was written on the command line (not read from the environment, not a default)."""
        return self.sources.get(name, "command line") == "command line"

    def check(self) -> None:
        """The options that exclude each other, and what cannot be read: exit 2 before any request."""
        if self.record and self.replay:
            raise fail("--record and --replay exclude each other")
        if self.cache_path and self.no_cache:
            raise fail("--cache and --no-cache exclude each other")
        if self.replay and not self.replay.exists():
            raise fail(f"{self.replay}: no such cassette to replay")
        if self.concurrency < 1:
            raise fail(f"--concurrency must be at least 1, not {self.concurrency}")
        if len(self.api_key) > 1 and len(self.api_key) != max(1, len(self.base_url)):
            raise fail(f"--api-key given {len(self.api_key)} times but --base-url {max(1, len(self.base_url))} "
                       f"time{'s' if len(self.base_url) > 1 else ''}: give one key for all endpoints or one per --base-url, "
                       "in the same order")
        if self.api is not None and self.api not in ("chat", "responses", "anthropic"):
            raise fail(f"--api must be chat, responses or anthropic, not {self.api!r}")
        if self.flex_deadline_s is not None and self.service_tier != "flex":
            raise fail("--flex-deadline is for --service-tier flex")
        if self.flex_deadline_s is not None and self.flex_deadline_s < 0:
            raise fail(f"--flex-deadline must be zero or more seconds, not {self.flex_deadline_s}")
        if self.row_deadline is not None and not self.row_deadline > 0:
            raise fail(f"--row-deadline must be a positive number of seconds, not {self.row_deadline}")
        if self.max_completion_tokens is not None and self.max_completion_tokens < 1:
            raise fail(f"--max-completion-tokens must be at least 1, not {self.max_completion_tokens}")
        if self.context_window is not None and self.context_window < 1:
            raise fail(f"--context-window must be at least 1 token, not {self.context_window}")
        try:
            self.params  # noqa: B018 - parsed here so a bad --judge-param fails before any request
        except ValueError as e:
            raise fail(str(e)) from e

    @property
    def params(self) -> dict[str, Any]:
        """The judge parameters: --judge-param, then the shorthands (which win)."""
        params = parse_judge_params(self.judge_param)
        for key in ("temperature", "reasoning_effort", "max_completion_tokens"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        return params

    def one_model(self, command: str) -> str | None:
        """The model of a command that takes one judge (None: $GRADEKIT_MODEL or the default)."""
        if len(self.model) > 1:
            raise fail(f"--model given {len(self.model)} times ({', '.join(self.model)}): {command} takes one judge model "
                       "(meta-eval takes a panel)")
        return self.model[0] if self.model else None

    @property
    def first_base_url(self) -> str | None:
        """The (first) endpoint's URL: a fleet is named by it (limiter key, checkpoint, cache key)."""
        return self.base_url[0] if self.base_url else None

    @property
    def first_api_key(self) -> str | None:
        return self.api_key[0] if self.api_key else None

    def per_member(self, n: int, what: str) -> list[tuple[str | None, str | None]]:
        """(base_url, api_key) for each of ``n`` judges of a jury or cascade, in order: one --base-url for all of them,
        or one per judge (the i-th for the i-th); none: each keeps its own (a cascade's fitted endpoint, else the default)."""
        urls, keys = self.base_url, self.api_key
        if len(urls) not in (0, 1, n):
            raise fail(f"--base-url given {len(urls)} times for a {what} of {n}: give one for all of them or one per judge, "
                       "in the --model order")
        if len(keys) not in (0, 1, max(1, len(urls))):
            raise fail(f"--api-key given {len(keys)} times but --base-url {len(urls)} times: give one key for all or one per "
                       "--base-url, in the same order")
        url_of = (lambda i: urls[i]) if len(urls) == n and n > 1 else (lambda i: urls[0] if urls else None)
        key_of = (lambda i: keys[i]) if len(keys) > 1 else (lambda i: keys[0] if keys else ("replay" if self.replay else None))
        return [(url_of(i), key_of(i)) for i in range(n)]

    def resolved_cache_path(self) -> str | None:
        # Read here rather than as the option's envvar: --no-cache must win over a GRADEKIT_CACHE in the shell.
        env_cache = os.environ.get("GRADEKIT_CACHE")
        if self.cache_path is None and env_cache and not self.no_cache and not (self.record or self.replay):
            return env_cache
        return self.cache_path

    def open_cache(self, *, by_default: bool = True) -> JudgeCache | None:
        """The response cache, or None (--no-cache; a cassette, which must see every request, unless --cache is explicit)."""
        from gradekit.judge import open_cache

        path = self.resolved_cache_path()
        if self.no_cache or ((self.record or self.replay) and path is None) or (path is None and not by_default):
            return None
        try:
            return open_cache(path)
        except ConnectionError as e:  # a redis:// cache that does not answer: before any request
            raise fail(str(e)) from e

    def limiter(self, model: str | None = None):
        """The process's limiter for these options (shared through --limiter when given)."""
        try:
            return self.spec(model).limiter()
        except (ValueError, ConnectionError) as e:  # a bad URL, or a Redis that does not answer: before any request
            raise fail(str(e)) from e

    def budget(self) -> Budget:
        """Always a Budget: without caps it only counts, so every summary shows what was spent and saved."""
        from gradekit.judge import Budget, load_prices

        try:
            return Budget(max_cost_usd=self.max_cost, max_tokens=self.max_tokens, prices=load_prices(self.prices_path))
        except ValueError as e:
            raise fail(str(e)) from e

    def spec(self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None) -> JudgeSpec:
        """The judge these options describe, as a spec: only what the command line gives is set.

        ``base_url``/``api_key``: one member's of a jury or cascade (``per_member``); by default all of them (a fleet).
        """
        from gradekit.judge._spec import JudgeSpec, Limits

        limits = Limits(rps=self.rps, tpm=self.tpm, concurrency=self.concurrency, adapt=not self.no_adapt, url=self.limiter_url,
                        # The budget is named by the endpoint, so runs against another provider or model never share one by accident.
                        key=self.limiter_key or f"{self.first_base_url or 'default'}|{model or 'default'}")
        keys = api_key or self.api_key or ("replay" if self.replay else None)
        return JudgeSpec.of(model, base_url=base_url or self.base_url, api_key=keys, params=self.params or None,
                            timeout=self.timeout, row_deadline=self.row_deadline, limits=limits, hedge=self.hedge, context_window=self.context_window, api=self.api,
                            service_tier=self.service_tier, flex_deadline_s=self.flex_deadline_s)

    def layers(self, model: str | None = None) -> tuple[JudgeSpec, JudgeSpec]:
        """(beneath, over): what the environment and the defaults say, and what the command line says. A grader file's
        ``judge:`` goes between them (:meth:`file_spec`); without a file ``beneath.merge(over)`` is :meth:`spec`."""
        from dataclasses import replace

        whole = self.spec(model)
        moved = {"model": not self.given("model"), "base_url": not self.given("base_url"), "api_key": not self.given("api_key"),
                 "timeout": not self.given("timeout")}
        beneath = replace(type(whole)(), **{name: getattr(whole, name) for name, low in moved.items() if low})
        over = replace(whole, **{name: None for name, low in moved.items() if low})
        return beneath, over

    def file_spec(self, model: str | None, settings: Any) -> Any:
        """A grader file's judge block between the environment (beneath) and the command line (over); says on
        stderr, once, which endpoint and model the run uses when another layer named others."""
        beneath, over = self.layers(model)
        wanted = settings.under(over, beneath)
        for line in _told_apart(settings, beneath, over, wanted):
            if line not in self._said:
                self._said.add(line)
                typer.echo(line, err=True)
        return wanted

    def judge(self, model: str | None, **parts: Any) -> Judge:
        """A Judge for ``model`` with these options (``parts``: limiter, cache, budget).

        Several ``--base-url`` make it a fleet: each endpoint gets its own limiter built like ``limiter``.
        """
        return self.spec(model).build(**parts)

    def file_judge(self, model: str | None, **parts: Any) -> Callable[[Any], Any]:
        """The judge a grader file's LLM nodes get, built on first need: the file's ``judge:`` beneath these options."""
        def make(settings: Any = None) -> Any:
            spec = self.spec(model) if settings is None else self.file_spec(model, settings)
            return spec.build(**parts)

        make.reads_settings = True  # type: ignore[attr-defined]
        return make

    def traffic(self) -> contextlib.AbstractContextManager[Any]:
        """The cassette the run records to or replays from, or nothing."""
        if not (self.record or self.replay):
            return contextlib.nullcontext()
        from ..runs._cassette import cassette

        return cassette(self.record or self.replay, "record" if self.record else "replay")


_ENV = {"model": "GRADEKIT_MODEL", "base_url": "OPENAI_BASE_URL", "timeout": "GRADEKIT_TIMEOUT"}
_FLAG = {"model": "--model", "base_url": "--base-url", "timeout": "--timeout"}


def _where(spec: Any) -> list[str]:
    from gradekit.judge._redact import redact_url

    if getattr(spec, "endpoints", None):
        return [redact_url(e.base_url) or "" for e in spec.endpoints]
    return [redact_url(u) or "" for u in (getattr(spec, "base_url", None) or ())]


def _told_apart(settings: Any, beneath: Any, over: Any, wanted: Any) -> list[str]:
    """The lines that say which endpoint (and model) a run uses when the command line, the grader file and the
    environment did not all agree: the value used and where it came from, and the one it replaced."""
    from gradekit.judge._spec import JudgeSpec

    if not isinstance(wanted, JudgeSpec):
        return []  # the file's jury: each juror's own endpoint
    lines = []
    file_where = "endpoints" if settings.endpoints else "base_url" if settings.base_url else None
    used = ", ".join(_where(wanted))
    if _where(over) and file_where:
        lines.append(f"judge endpoint: {used} (--base-url; it replaces the grader file's judge.{file_where} "
                     f"{', '.join(_where(settings.spec()))})")
    elif file_where and _where(beneath) and _where(beneath) != _where(wanted):
        lines.append(f"judge endpoint: {used} (the grader file's judge.{file_where}; OPENAI_BASE_URL="
                     f"{', '.join(_where(beneath))} in the environment is only a default, beneath a value the file gives)")
    if settings.model and over.model and over.model != settings.model:
        lines.append(f"judge model: {over.model} (--model; it replaces the grader file's judge.model {settings.model})")
    elif settings.model and beneath.model and beneath.model != settings.model:
        lines.append(f"judge model: {settings.model} (the grader file's judge.model; GRADEKIT_MODEL={beneath.model} in the "
                     "environment is only a default, beneath a value the file gives)")
    return lines


def _sources(context: Any, names: list[str]) -> dict[str, str]:
    """Where click found each option's value: on the command line, in the environment, or its default."""
    if context is None:
        return {}
    said = {"ENVIRONMENT": "environment", "DEFAULT": "default", "DEFAULT_MAP": "default"}
    found = {name: context.get_parameter_source(name) for name in names}
    return {name: said.get(getattr(source, "name", ""), "command line") for name, source in found.items()}


def judge_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` every judge option; it receives them as one ``opts: JudgeOptions`` argument."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "opts"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option])
             for name, kind, default, option in _DECLARED]
    # The command's context (typer passes it to a parameter of this type): where each option's value came from.
    added.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    clash = {p.name for p in own} & set(OPTION_NAMES)
    if clash:
        raise TypeError(f"{command.__name__} declares judge options itself: {sorted(clash)}")

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        context = kwargs.pop(_CONTEXT, None)
        options = JudgeOptions(**{name: kwargs.pop(name) for name in OPTION_NAMES if name in kwargs},
                               sources=_sources(context, OPTION_NAMES))
        return command(*args, opts=options, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
    wrapper.__dict__.pop("__wrapped__", None)
    return wrapper
