"""What a judge is, as data: one spec that every front door produces and one place that builds it.

The command line, a grader file's ``judge:`` block, a cascade.json judge and a Ray worker each
describe a judge; they all say it as a :class:`JudgeSpec` (or a :class:`JurySpec`), layer them with
:meth:`JudgeSpec.merge` (lowest first: the environment, a grader file's ``judge:``, the command line, a
server's or a Ray worker's settings) and get the judge from ``Judge(spec)`` (:meth:`JudgeSpec.build`).
A field left ``None`` is *not given*: a merge keeps the layer beneath's, a build sends nothing for it
and :data:`DEFAULTS` holds, so "unset" never turns into a value and a default never counts as given.

Errors name spec fields (``params``, ``limits.concurrency``); a front door that has flags maps a
field to its own flag (graders/cli's flag table), so the judge core never names one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from ._deadline import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from ._budget import Budget
    from ._cache import JudgeCache
    from ._client import Judge
    from ._fleet import Endpoint
    from ._hedge import HedgePolicy
    from ._jury import Jury
    from ._limiter import RequestLimiter


DEFAULT_CONCURRENCY = 16  # requests in flight at once, per limiter
DEFAULT_ADAPT = True  # pace to the provider's rate-limit headers and 429s


def _merged(mine: Any, theirs: Any) -> Any:
    return mine if theirs is None else theirs


@dataclass(frozen=True)
class Limits:
    """How fast a judge may send: told rates, requests in flight, self-pacing, and where the limit is shared."""

    rps: float | None = None  # requests per second (per endpoint of a fleet)
    tpm: float | None = None  # tokens per minute (likewise)
    concurrency: int | None = None  # requests in flight at once [16]
    adapt: bool | None = None  # pace to the provider's rate-limit headers and 429s [True]
    url: str | None = None  # where the limit is shared: None (this process), redis://..., "ray"
    key: str | None = None  # the shared budget's name [base_url|model]

    def merge(self, *layers: Limits) -> Limits:
        """These limits with every field each layer gives put over them, in order (the last layer wins)."""
        merged = self
        for other in layers:
            merged = Limits(**{f.name: _merged(getattr(merged, f.name), getattr(other, f.name)) for f in fields(self)})
        return merged

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def limiter(self, default_key: str = "default") -> RequestLimiter:
        """A limiter with these limits (``default_key`` names a shared one when ``key`` is not given)."""
        from ._limiters import limiter_from_url

        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"`limits.concurrency` must be at least 1, not {self.concurrency}")
        return limiter_from_url(self.url, rps=self.rps, tpm=self.tpm,
                                concurrency=DEFAULT_CONCURRENCY if self.concurrency is None else self.concurrency,
                                adapt=DEFAULT_ADAPT if self.adapt is None else self.adapt, key=self.key or default_key)


@dataclass(frozen=True)
class JudgeSpec:
    """One judge model and how to reach and ask it; ``None`` everywhere means "not given".

    ``base_url``/``api_key`` (one, or one per replica: a fleet) and ``endpoints`` (a declared fleet)
    are one choice of *where*: a merge that gives either replaces both.
    """

    model: str | None = None  # [$GRADEKIT_MODEL, else the default model]
    base_url: tuple[str, ...] | None = None
    api_key: tuple[str, ...] | None = None
    endpoints: tuple[Endpoint, ...] | None = None
    params: Mapping[str, Any] | None = None  # request parameters sent as given; merged key by key
    timeout: float | None = None  # seconds per request [60]
    row_deadline: float | None = None  # seconds a row's requests may spend on the wire in all [3 x timeout] (judge._deadline)
    limits: Limits = field(default_factory=Limits)
    max_prompt_tokens: int | None = None  # [the Judge's default]; above it a row is an input error
    logprobs: int | None = None  # top logprobs per token, asked with every request
    hedge: bool | HedgePolicy | None = None  # hedged requests over a fleet (judge._hedge) [on for two endpoints or more]
    context_window: int | None = None  # the model's window in tokens, a trajectory is fitted into [learnt, or documented]
    api: str | None = None  # chat | responses | anthropic: how judgements are sent [anthropic for api.anthropic.com, else chat]
    service_tier: str | None = None  # flex: the provider's cheaper, slower tier (judge._tiers) [the standard tier]
    flex_deadline_s: float | None = None  # seconds a row waits for flex capacity before the standard tier [600]
    prompt_cache_key: bool | str | None = None  # the provider's prompt-cache routing key [sent to OpenAI and Azure OpenAI]

    @classmethod
    def of(cls, model: str | None = None, *, base_url: str | Sequence[str] | None = None,
           api_key: str | Sequence[str] | None = None, endpoints: Sequence[Endpoint | Mapping[str, Any]] | None = None,
           **rest: Any) -> JudgeSpec:
        """A spec from the loose shapes front doors hold (a URL or a list of them, endpoint mappings)."""
        from ._fleet import Endpoint

        def many(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
            value = [value] if isinstance(value, str) else [v for v in value or [] if v]
            return tuple(value) or None

        fleet = None if endpoints is None else tuple(e if isinstance(e, Endpoint) else Endpoint.model_validate(dict(e))
                                                     for e in endpoints)
        return cls(model=model, base_url=many(base_url), api_key=many(api_key), endpoints=fleet, **rest)

    def merge(self, *layers: JudgeSpec) -> JudgeSpec:
        """This spec with each layer put over it in order: the one rule every layering of judge settings uses.

        ``JudgeSpec.merge(environment, grader_file, command_line)`` reads lowest first. A field a layer
        gives wins over the layers beneath; ``params`` and ``limits`` merge field by field (the higher
        layer's keys win); where the judge is (``base_url``/``endpoints``) is replaced as a whole.
        """
        merged = self
        for other in layers:
            merged = merged._over(other)
        return merged

    def _over(self, other: JudgeSpec) -> JudgeSpec:
        where = ({"base_url": other.base_url, "endpoints": other.endpoints} if other.base_url or other.endpoints
                 else {"base_url": self.base_url, "endpoints": self.endpoints})
        params = None if self.params is None and other.params is None else {**(self.params or {}), **(other.params or {})}
        simple = {f.name: _merged(getattr(self, f.name), getattr(other, f.name))
                  for f in fields(self) if f.name not in ("base_url", "endpoints", "params", "limits")}
        return replace(self, **simple, **where, params=params, limits=self.limits.merge(other.limits))

    @property
    def given(self) -> set[str]:
        """The fields this spec sets (``limits.rps`` for a limit): what a layer says, as pydantic's ``model_fields_set``."""
        top = {f.name for f in fields(self) if f.name != "limits" and getattr(self, f.name) is not None}
        return top | {f"limits.{f.name}" for f in fields(self.limits) if getattr(self.limits, f.name) is not None}

    @property
    def first_base_url(self) -> str | None:
        """The (first) endpoint's URL: a fleet is named by it."""
        if self.base_url:
            return self.base_url[0]
        return self.endpoints[0].base_url if self.endpoints else None

    def limiter(self) -> RequestLimiter:
        """A limiter of its own, built from ``limits`` (its shared budget named ``base_url|model``)."""
        return self.limits.limiter(f"{self.first_base_url or 'default'}|{self.model or 'default'}")

    def build(self, *, cache: JudgeCache | None = None, budget: Budget | None = None,
              limiter: RequestLimiter | None = None) -> Judge:
        """``Judge(self, ...)``: the Judge this spec describes, sharing the run's ``cache``, ``budget`` and ``limiter``.

        Without ``limiter``: one built from ``limits`` when any is given, else the process's limiter.
        """
        from ._client import Judge

        return Judge(self, limiter=limiter, cache=cache, budget=budget)

    def judge_keywords(self) -> dict[str, Any]:
        """The spec as ``Judge``'s keyword arguments, only those it gives (the Judge's defaults, :data:`DEFAULTS`, hold
        for the rest); ``limits`` is not one: ``Judge(spec)`` builds its limiter from them."""
        keywords = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "limits" and getattr(self, f.name) is not None}
        for name in ("base_url", "api_key", "endpoints"):
            if name in keywords:
                keywords[name] = list(keywords[name])
        if "params" in keywords:
            keywords["params"] = dict(keywords["params"])
        return keywords


# The defaults, in one place: what a judge uses for a field no layer gives. A front door shows them (the CLI's
# --help) but never sets them, so a layer beneath (a grader file's judge:) is never replaced by a default.
DEFAULTS = JudgeSpec(timeout=DEFAULT_TIMEOUT_S, limits=Limits(concurrency=DEFAULT_CONCURRENCY, adapt=DEFAULT_ADAPT))


@dataclass(frozen=True)
class JurySpec:
    """Several judges on one row and the rule that turns their verdicts into one (judge._jury)."""

    jurors: tuple[JudgeSpec, ...]
    aggregate: str | None = None  # majority, mean, min, unanimous [majority for labels, mean for scores]
    quorum: int | None = None  # [a majority of the jury]

    def merge(self, *layers: JudgeSpec) -> JurySpec:
        """This jury with each layer put over every juror (a server's ``hedge``, say), as :meth:`JudgeSpec.merge` does."""
        return replace(self, jurors=tuple(juror.merge(*layers) for juror in self.jurors))

    def build(self, *, cache: JudgeCache | None = None, budget: Budget | None = None,
              limiter: RequestLimiter | None = None) -> Jury:
        """The Jury; each juror paces itself with a limiter of its own (``limiter`` is not shared with jurors):
        one slow or rate-limited provider does not hold back the others."""
        from ._jury import Jury

        return Jury([j.build(cache=cache, budget=budget, limiter=j.limiter()) for j in self.jurors],
                    aggregate=self.aggregate, quorum=self.quorum)  # type: ignore[arg-type]
