"""The Verdict: what one judgement produced, including the ways it can fail, made of small values."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._redact import redact

from ._criteria import CriterionVerdict
from ._trajectory import TrajectoryCoverage

ErrorKind = Literal[
    "parse_failure",  # the judge answered, but no offered label could be read from it
    "refusal",  # the judge declined (message.refusal or a content filter)
    "truncated",  # finish_reason "length" and nothing parseable
    "server_error",  # 5xx, malformed body, connection dropped — after retries
    "timeout",  # the request timed out — after retries
    "rate_limited",  # 429 until the retry budget ran out
    "bad_request",  # 400/401/403/404/422: fix the request, model name or key
    "not_recorded",  # a replayed run: the cassette has no reply for this request
    "input",  # the row lacks a variable the rubric needs
    "budget",  # status "skipped": the budget's max_cost_usd / max_tokens was reached, so no request was sent
    "abstained",  # status "abstained": a Cascade none of whose judges was confident enough, or a unanimous Jury that split
    "judged_invalid",  # the judge gave one of the rubric's invalid_labels: the sample cannot be graded (a grader's status=invalid)
    "context_overflow",  # the prompt does not fit the judge's context window even with its trajectory cut (the task and final answer alone)
    "local_error",  # a failure in this process, not at the judge (a broken install, a template's bug): no request was sent
]
ScoreSource = Literal["label", "logprobs", "label_no_logprobs", "label_no_verdict_token"]


def clamp(score: float) -> float:
    """Keep a score inside the reward range every platform accepts."""
    return max(-1.0, min(1.0, float(score)))


class Usage(BaseModel):
    """Requests and tokens a judgement billed in this run; ``a + b`` (and ``sum``) adds them up.

    Like inspect_ai's ``ModelUsage``: a Jury's usage is its jurors' sum, a Cascade's the sum over
    the judges and samples it asked, a run's the sum over its rows. A cache hit bills nothing and
    reports the stored reply's usage in the ``saved_*`` pair.
    """

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0  # the reasoning tokens below included, as providers bill them
    reasoning_tokens: int = 0  # usage.completion_tokens_details.reasoning_tokens: a reasoning model's thinking
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens: prompt tokens the provider's cache served
    # Prompt tokens written to the provider's prompt cache (OpenAI's prompt_tokens_details.cache_write_tokens,
    # Anthropic's cache_creation_input_tokens, DashScope's explicit cache): billed above the input price.
    cache_write_tokens: int = 0
    # The part of the counts above billed at the flex service tier (--service-tier flex), priced at its own rates.
    flex_prompt_tokens: int = 0
    flex_completion_tokens: int = 0
    flex_cached_tokens: int = 0
    flex_cache_write_tokens: int = 0
    flex_reasoning_tokens: int = 0
    saved_prompt_tokens: int = 0  # a cache hit: the stored reply's usage, which this run did not pay for
    saved_completion_tokens: int = 0
    requests: int = 0  # requests sent (retries and re-asks included); 0 for a cache hit or a row never sent

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        mine, theirs = self.__dict__, other.__dict__
        # Zero is the identity and a Usage is immutable: the wire adds one per request to a tally that is mostly
        # zero (one attempt, one endpoint), so those sums cost no new model.
        if not any(theirs.values()):
            return self
        if not any(mine.values()):
            return other
        return Usage(**{name: count + theirs[name] for name, count in mine.items()})

    def __radd__(self, other: Any) -> Usage:
        """``sum(usages)`` starts from 0."""
        if other == 0:
            return self
        return NotImplemented


NO_USAGE = Usage()  # the identity of ``+``: a Usage is immutable, so every tally on the wire starts from this one


class PanelInfo(BaseModel):
    """What a Jury's or a Cascade's verdict adds (judge._jury, judge._cascade); a single Judge's verdict has none."""

    model_config = ConfigDict(frozen=True)

    agreement: float | None = None  # Jury: share of the answering jurors whose label is the decision's
    jurors: list[dict[str, Any]] | None = None  # Jury: each juror's model, label, score, status (and error_kind, error)
    decided_by: str | None = None  # Cascade: the model whose confidence met its threshold
    confidence: float | None = None  # Cascade: that judge's confidence (the best one seen on an abstained row)


class StepVerdict(BaseModel):
    """One assistant step's verdict under ``granularity: step``: a score, or the error that step met (never a 0)."""

    model_config = ConfigDict(frozen=True)

    step: int  # the step's number in the trajectory (1-based, as the judge was shown it)
    status: Literal["ok", "error", "skipped"] = "ok"
    score: float | None = None
    label: str | None = None
    rationale: str | None = None
    error_kind: str | None = None
    error: str | None = None
    cached: bool = False


class ReadInfo(BaseModel):
    """How the reply was read: the output mode the judge was asked in, where the score came from, who the reply says
    answered it, and what the judge was shown of a trajectory."""

    model_config = ConfigDict(frozen=True)

    mode: str | None = Field(default=None, description="output mode the judge was asked in")
    # With Judge(logprobs=N): "logprobs" when the score is the probability-weighted mean over the
    # verdict token's alternatives; "label_no_logprobs" when the server returned no logprobs and
    # "label_no_verdict_token" when none of the tokens is the verdict, the plain label's score used.
    score_source: ScoreSource = "label"
    # What the provider says answered (a cached verdict: what answered when it was cached): the reply's ``model`` (a dated
    # snapshot behind an alias) and ``system_fingerprint`` (OpenAI's backend; vLLM's version, GPU, parallelism and config
    # hash), where it gives them. A change mid-run is how a served judge drifts (docs/align.md#drift-seen).
    served_model: str | None = None
    system_fingerprint: str | None = None
    # A rubric with a trajectory variable: what the judge was shown of it (steps and tokens of the total, the cuts).
    coverage: TrajectoryCoverage | None = None


# Flat keys a caller may still pass to Verdict(...): each goes into its value (attempts is Usage.requests).
_USAGE_KEYS = {name: name for name in Usage.model_fields if name != "requests"} | {"attempts": "requests"}
_PANEL_KEYS = tuple(PanelInfo.model_fields)
_READ_KEYS = tuple(ReadInfo.model_fields)


def _folded(data: dict[str, Any], field: str, keys: Any, model: type[BaseModel], rename: dict[str, str] | None = None) -> None:
    """Move the flat ``keys`` of ``data`` into its ``field`` value (merged over one given as a value)."""
    found = {(rename or {}).get(k, k): data.pop(k) for k in list(keys) if k in data}
    if not found:
        return
    given = data.get(field)
    base = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
    data[field] = model(**{**base, **found})


class Verdict(BaseModel):
    """One judgement. ``status != "ok"`` always has ``score is None``: a failure is never a number.

    ``abstained`` (a Cascade or a unanimous Jury) means the judges answered but none was trusted
    with a decision: the row is one for a human, not a failure (``error_kind="abstained"``).
    ``skipped`` means the judge was not asked (the budget was reached; ``error_kind`` says why):
    nothing failed, and a later run with room in the budget judges it. ``usage`` is what this run
    billed; ``panel`` is a Jury's or a Cascade's (None from a single Judge).

    Construction also takes the flat keys of the values (``prompt_tokens=``, ``attempts=``,
    ``agreement=``, ``mode=``, ...) so the code that builds a Verdict stays short; readers use
    ``verdict.usage.prompt_tokens``, ``verdict.panel.agreement``, ``verdict.read.mode``.
    """

    status: Literal["ok", "error", "skipped", "abstained"]
    score: float | None = None
    label: str | None = None
    rationale: str | None = None
    raw: str | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    usage: Usage = Usage()
    reasoning: str | None = None  # the judge's thinking (a reasoning field or a <think> block); never parsed
    latency_s: float = 0.0
    cached: bool = False
    read: ReadInfo = ReadInfo()
    panel: PanelInfo | None = None
    # A checklist rubric (judge._checklist): each criterion's verdict, in the rubric's order; ``score``
    # is the weighted mean of those read, ``label`` is None. None for every other rubric.
    criteria: list[CriterionVerdict] | None = None
    # granularity: step: each assistant step's verdict, in order; ``score`` is their aggregate (step_aggregate).
    steps: list[StepVerdict] | None = None

    @model_validator(mode="before")
    @classmethod
    def _fold_flat_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.keys().isdisjoint((*_USAGE_KEYS, *_PANEL_KEYS, *_READ_KEYS)):
            data = dict(data)
            _folded(data, "usage", _USAGE_KEYS, Usage, _USAGE_KEYS)
            _folded(data, "panel", _PANEL_KEYS, PanelInfo)
            _folded(data, "read", _READ_KEYS, ReadInfo)
        return data

    @field_validator("error", "raw", "rationale", "reasoning")
    @classmethod
    def _no_secret(cls, text: str | None) -> str | None:
        """An error may quote a provider's body (a 401 echoing the key) or a URL with credentials, and a reply may
        quote the request it answers (its Authorization header, its URL): none of it is kept (judge._redact)."""
        return redact(text)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def coverage(self) -> TrajectoryCoverage | None:
        """What the judge was shown of the row's trajectory (``read.coverage``), or None."""
        return self.read.coverage

    def shown(self, coverage: TrajectoryCoverage | None) -> Verdict:
        """This verdict with ``coverage`` as what its judge was shown (a cache hit read for a row fitted anew)."""
        return self if coverage is None else self.model_copy(update={"read": self.read.model_copy(update={"coverage": coverage})})
