"""The options that configure a judge, declared once (:class:`JudgeOptions`' fields) for every command that talks to one.

``@judge_options`` adds them to a command's signature (typer reads ``__signature__``) and hands
the command one :class:`JudgeOptions` value (its ``opts`` argument) instead, so ``grade``, ``meta-eval``, ``probe`` and
``validate`` take the same flags with the same help, and a new judge option reaches all of them
at once (tests/cli/test_judge_options.py checks that every such command takes every option).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gradekit.judge._spec import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S

from .._flags import JUDGE_FLAGS
from ._common import fail

if TYPE_CHECKING:  # the library loads when a command runs, not for --help
    from gradekit.judge import Budget, Judge, JudgeCache
    from gradekit.judge._spec import JudgeSpec

    from .._config import FileJudge


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


PANEL = "Judge options"
_BUDGET = ("max_cost_usd", "max_tokens", "prices")  # flag-table fields of the run's Budget, not of the judge spec


def _sets(path: str, *negative: str, many: bool = False, **option: Any) -> Any:
    """An option that sets the judge spec's field ``path`` (judge._spec; ``params.x``, ``limits.x``; the
    budget's): its flag is the flag table's (graders._flags), its value None (unset) unless the user gives it, so
    a layer beneath (a grader file's ``judge:``) is never replaced by a default. ``negative``: the flag that
    turns a switch off (``--no-hedge``); ``many``: repeatable (an empty list is unset)."""
    flags = JUDGE_FLAGS[path] + "".join(f"/{name}" for name in negative)
    return _declared(path, flags, many, option)


def _run_option(flag: str, **option: Any) -> Any:
    """An option of the run's judge traffic that is no spec field (the cache, a cassette)."""
    return _declared(None, flag, False, option)


def _declared(path: str | None, flags: str, many: bool, option: dict[str, Any]) -> Any:
    meta = {"field": path, "flags": flags, "option": typer.Option(flags, rich_help_panel=PANEL, **option)}
    return field(default_factory=list, metadata=meta) if many else field(default=None, metadata=meta)


@dataclass
class JudgeOptions:
    """What the judge options of one command line say, and how to build the judge parts from them.

    Each field is one option, declared here once: ``@judge_options`` makes the command's parameters from these
    fields (their type, and the typer option in their metadata). A default is shown in the help but lives in
    the spec (judge._spec.DEFAULTS): every field is None (or empty) unless the user gave it.
    """

    model: list[str] = _sets("model", many=True, envvar="GRADEKIT_MODEL", show_default=False,
                             help="Judge model [default: gpt-4o-mini]; several: grade judges with a jury (see --jury), "
                                  "cascade fit takes the cascade's judges cheapest first, meta-eval a panel.")
    # several: a fleet (one judge model, many endpoints)
    base_url: list[str] = _sets("base_url", many=True, envvar="OPENAI_BASE_URL", show_default=False,
                                help="OpenAI-compatible API root, e.g. http://localhost:8000/v1. Repeat it for a fleet: one model "
                                     "served by several replicas or keys, used together with failover (docs/fleets.md). With several --model "
                                     "(a jury): one --base-url for every juror, or one per --model in the same order.")
    # one for all endpoints, or one per --base-url
    api_key: list[str] = _sets("api_key", many=True, envvar="OPENAI_API_KEY", show_default=False,
                               help="API key (read from OPENAI_API_KEY by default); with several --base-url, one key for all "
                                    "or one per --base-url in the same order.")
    judge_param: list[str] = _sets("params", many=True, metavar="KEY=VALUE", show_default=False,
                                   help="A request parameter for the judge, VALUE parsed as JSON when it parses, else a string "
                                        "(repeatable): reasoning_effort=low, enable_thinking=false, thinking='{\"type\":\"disabled\"}'. "
                                        "Keys the SDK does not know go in the body as they are. See docs/judges.md.")
    temperature: float | None = _sets("params.temperature",
                                      help="Sampling temperature [default: 0, or the model's own where it takes no other].")
    reasoning_effort: str | None = _sets("params.reasoning_effort", help="Reasoning models: minimal, low, medium or high.")
    max_completion_tokens: int | None = _sets("params.max_completion_tokens", metavar="N",
                                              help="Cap on the judge's reply, thinking included (reasoning models count both).")
    rps: float | None = _sets("limits.rps", envvar="GRADEKIT_RPS", help="Requests per second for the whole process (per endpoint of a fleet).")
    tpm: float | None = _sets("limits.tpm", envvar="GRADEKIT_TPM", help="Tokens per minute for the whole process (per endpoint of a fleet).")
    hedge: bool | None = _sets("hedge", "--no-hedge", show_default=False,
                               help="With several --base-url (a fleet): send a request still unanswered after max(p95, 2 x median) "
                                    "of its endpoint's recent latencies once more to another endpoint, first answer wins, at most "
                                    "10% extra requests [default: on for a fleet, and a grader file's judge.hedge; one endpoint never "
                                    "hedges]. See docs/fleets.md.")
    context_window: int | None = _sets("context_window", metavar="TOKENS", envvar="GRADEKIT_CONTEXT_WINDOW",
                                       help="The judge model's context window, which a trajectory is fitted into [default: "
                                            "learnt from the provider's first context-length refusal and kept in the cache, "
                                            "or the model's documented window]. See docs/trajectories.md.")
    api: str | None = _sets("api", help="How judgements are sent: chat (chat completions), responses (the OpenAI Responses API, "
                                        "for Responses-only models) or anthropic (Anthropic's Messages API: prompt caching and "
                                        "structured output) [default: anthropic for api.anthropic.com, else chat]. See docs/judges.md.")
    service_tier: str | None = _sets("service_tier", help="flex: the provider's cheaper, slower tier; a flex 429 (no capacity) "
                                                          "is not a rate limit, and a row still waiting after --flex-deadline "
                                                          "is sent at the standard tier. See docs/large-runs.md.")
    flex_deadline_s: float | None = _sets("flex_deadline_s", metavar="SECONDS",
                                          help="With --service-tier flex: seconds a row waits for flex capacity [default: 600].")
    concurrency: int | None = _sets("limits.concurrency", envvar="GRADEKIT_CONCURRENCY",
                                    help=f"Requests in flight at once [default: {DEFAULT_CONCURRENCY}].")
    limiter_url: str | None = _sets("limits.url", envvar="GRADEKIT_LIMITER",
                                    help="Share --rps/--tpm and Retry-After pauses with other processes: redis://host:port/db through Redis, "
                                         "ray through the Ray cluster's limiter actor [default: this process only; with --ray: ray].")
    limiter_key: str | None = _sets("limits.key", envvar="GRADEKIT_LIMITER_KEY",
                                    help="Name of the shared budget in Redis [default: --base-url|--model as given].")
    no_adapt: bool | None = _sets("limits.adapt", envvar="GRADEKIT_NO_ADAPT",  # the flag turns limits.adapt off
                                  help="Do not pace to the limit the provider's replies show (rate-limit headers, 429s); pace only to --rps/--tpm, if given.")
    timeout: float | None = _sets("timeout", envvar="GRADEKIT_TIMEOUT",
                                help=f"Seconds per judge request [default: {DEFAULT_TIMEOUT_S:g}].")
    row_deadline: float | None = _sets("row_deadline", metavar="S",  # None: 3 x timeout (judge._deadline)
                                       help="Seconds one row's judge requests may spend in all, every attempt, retry and re-ask "
                                            "together; past it the row is a timeout error [default: 3 x --timeout].")
    cache_path: str | None = _run_option("--cache", help="Response cache: a SQLite file, or redis://host:port/db that every node of a cluster "
                                                         "reaches [default: $GRADEKIT_CACHE, else the user cache dir].")
    no_cache: bool | None = _run_option("--no-cache", help="Neither read nor write the response cache.")
    record: Path | None = _run_option("--record", help="Record the judge traffic to this vcrpy cassette (no cache).")
    replay: Path | None = _run_option("--replay", help="Answer every judge request from this cassette, with no network (no cache).")
    max_cost: float | None = _sets("max_cost_usd", help="Stop sending requests once this many USD are spent (needs a price for the model; see --prices).")
    max_tokens: int | None = _sets("max_tokens", help="Stop sending requests once this many prompt + completion tokens are spent.")
    prices_path: Path | None = _sets("prices", envvar="GRADEKIT_PRICES",
                                     help="YAML/JSON {model: {input: USD per 1M tokens, output: ..., cached_input: ...}} merged over the built-in price table.")
    # Where each option's value came from, as click tells: "command line", "environment" or "default" (an option
    # not listed: the command line, as for options built in Python). A grader file's judge sits between the two.
    sources: dict[str, str] = field(default_factory=dict)
    _said: set[str] = field(default_factory=set, repr=False)

    @property
    def in_flight(self) -> int:
        """Requests in flight at once: --concurrency (or $GRADEKIT_CONCURRENCY), else the spec's default."""
        return DEFAULT_CONCURRENCY if self.concurrency is None else self.concurrency

    def check(self) -> None:
        """The options that exclude each other, and what cannot be read: exit 2 before any request."""
        if self.record and self.replay:
            raise fail("--record and --replay exclude each other")
        if self.cache_path and self.no_cache:
            raise fail("--cache and --no-cache exclude each other")
        if self.replay and not self.replay.exists():
            raise fail(f"{self.replay}: no such cassette to replay")
        if self.concurrency is not None and self.concurrency < 1:
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
        return self.params_of(self.judge_param, {key: getattr(self, key) for key in ("temperature", "reasoning_effort", "max_completion_tokens")})

    @staticmethod
    def params_of(pairs: list[str], shorthands: dict[str, Any]) -> dict[str, Any]:
        return {**parse_judge_params(pairs), **{key: value for key, value in shorthands.items() if value is not None}}

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
        """The judge these options describe, as a spec: what the environment gives with the command line over it.

        ``base_url``/``api_key``: one member's of a jury or cascade (``per_member``); by default all of them (a fleet).
        """
        beneath, over = self.layers(model, base_url=base_url, api_key=api_key)
        return beneath.merge(over)

    def layers(self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None) -> tuple[JudgeSpec, JudgeSpec]:
        """(beneath, over): what the environment says, and what the command line says, each only what it gives (no
        default: those are the spec's, judge._spec.DEFAULTS). A grader file's ``judge:`` goes between them
        (:meth:`file_spec`); without a file, ``beneath.merge(over)`` is :meth:`spec`."""
        from gradekit.judge._spec import JudgeSpec, Limits

        chosen = {"model": [model] if model else [], "base_url": [base_url] if base_url else self.base_url,
                  "api_key": [api_key] if api_key else self.api_key}
        layer: dict[bool, dict[str, Any]] = {True: {}, False: {}}  # command line? -> {field path: value}
        for option in fields(self):
            path = option.metadata.get("field")
            value = chosen.get(option.name, getattr(self, option.name))
            if path is None or value in (None, []) or path in _BUDGET:
                continue
            # Read from the environment: a default beneath a grader file's value (issue 48); written: over it.
            layer[self.sources.get(option.name) != "environment"][path] = value

        def spec(given: dict[str, Any]) -> JudgeSpec:
            limits = {path.removeprefix("limits."): value for path, value in given.items() if path.startswith("limits.")}
            if "adapt" in limits:
                limits["adapt"] = not limits["adapt"]  # --no-adapt
            params = self.params_of(given.get("params", []), {path.removeprefix("params."): value for path, value in given.items()
                                                              if path.startswith("params.")})
            rest = {path: value for path, value in given.items() if "." not in path and path != "params"}
            return JudgeSpec.of(rest.pop("model", [None])[0], params=params or None, limits=Limits(**limits), **rest)

        beneath, over = spec(layer[False]), spec(layer[True])
        if self.replay and not (beneath.api_key or over.api_key):
            beneath = replace(beneath, api_key=("replay",))  # a cassette answers without a key
        # The limiter is named by the endpoint as given, so runs against another provider or model never share one by accident.
        key = over.limits.key or beneath.limits.key or f"{self.first_base_url or 'default'}|{model or 'default'}"
        return beneath, replace(over, limits=replace(over.limits, key=key))

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

    def file_judge(self, model: str | None, **parts: Any) -> FileJudge:
        """The judge a grader file's LLM nodes get, built on first need: the file's ``judge:`` beneath these options."""
        from .._config import FileJudge

        def make(settings: Any = None) -> Any:
            spec = self.spec(model) if settings is None else self.file_spec(model, settings)
            return spec.build(**parts)

        return FileJudge(make)

    def traffic(self) -> contextlib.AbstractContextManager[Any]:
        """The cassette the run records to or replays from, or nothing."""
        if not (self.record or self.replay):
            return contextlib.nullcontext()
        from ..runs._cassette import cassette

        return cassette(self.record or self.replay, "record" if self.record else "replay")


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


# The options, as the command's parameters: made from JudgeOptions' fields, each unset (None) unless given.
OPTIONS = [option for option in fields(JudgeOptions) if "option" in option.metadata]
OPTION_NAMES = [option.name for option in OPTIONS]
_CONTEXT = "judge_options_context"


def judge_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` every judge option; it receives them as one ``opts: JudgeOptions`` argument."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "opts"]
    kinds = typing.get_type_hints(JudgeOptions)
    added = [inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[kinds[option.name], option.metadata["option"]]) for option in OPTIONS]
    # The command's context (typer passes it to a parameter of this type): where each option's value came from.
    added.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    clash = {p.name for p in own} & set(OPTION_NAMES)
    if clash:
        raise TypeError(f"{command.__name__} declares judge options itself: {sorted(clash)}")

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        context = kwargs.pop(_CONTEXT, None)
        given = {name: kwargs.pop(name) for name in OPTION_NAMES if name in kwargs}
        options = JudgeOptions(**{name: list(value or []) if isinstance(value, (list, tuple)) or name in _MANY else value
                                  for name, value in given.items()}, sources=_sources(context, OPTION_NAMES))
        return command(*args, opts=options, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
    wrapper.__dict__.pop("__wrapped__", None)
    return wrapper


_MANY = {option.name for option in OPTIONS if option.default_factory is list}  # repeatable: an empty list is unset
