"""The Verdict: what one judgement produced, including the ways it can fail."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from ._redact import redact

from ._criteria import CriterionVerdict

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
    "budget",  # status "skipped": --max-cost / --max-tokens was reached, so no request was sent
    "abstained",  # status "abstained": a Cascade none of whose judges was confident enough, or a unanimous Jury that split
    "judged_invalid",  # the judge gave one of the rubric's invalid_labels: the sample cannot be graded (a grader's status=invalid)
]


def clamp(score: float) -> float:
    """Keep a score inside the reward range every platform accepts."""
    return max(-1.0, min(1.0, float(score)))


class Verdict(BaseModel):
    """One judgement. ``status != "ok"`` always has ``score is None``: a failure is never a number.

    ``abstained`` (a Cascade or a unanimous Jury) means the judges answered but none was trusted
    with a decision: the row is one for a human, not a failure (``error_kind="abstained"``).
    ``skipped`` means the judge was not asked (the budget was reached; ``error_kind`` says why):
    nothing failed, and a later run with room in the budget judges it. Token counts are the tokens
    billed in this run; a cache hit bills none and reports what it saved in ``saved_*_tokens``.
    """

    status: Literal["ok", "error", "skipped", "abstained"]
    score: float | None = None
    label: str | None = None
    rationale: str | None = None
    raw: str | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # the reasoning tokens below included, as providers bill them
    reasoning_tokens: int = 0  # usage.completion_tokens_details.reasoning_tokens: a reasoning model's thinking
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens: prompt tokens the provider's cache served
    reasoning: str | None = None  # the judge's thinking (a reasoning field or a <think> block); never parsed
    saved_prompt_tokens: int = 0  # a cache hit: the stored reply's usage, which this run did not pay for
    saved_completion_tokens: int = 0
    attempts: int = 0
    latency_s: float = 0.0
    cached: bool = False
    mode: str | None = Field(default=None, description="output mode the judge was asked in")
    # With Judge(logprobs=N): "logprobs" when the score is the probability-weighted mean over the
    # verdict token's alternatives; "label_no_logprobs" when the server returned no logprobs and
    # "label_no_verdict_token" when none of the tokens is the verdict, the plain label's score used.
    score_source: Literal["label", "logprobs", "label_no_logprobs", "label_no_verdict_token"] = "label"
    # A Jury's or a Cascade's verdict (judge._jury, judge._cascade); None from a single Judge.
    agreement: float | None = None  # Jury: share of the answering jurors whose label is the decision's
    jurors: list[dict[str, Any]] | None = None  # Jury: each juror's model, label, score, status (and error_kind, error)
    decided_by: str | None = None  # Cascade: the model whose confidence met its threshold
    confidence: float | None = None  # Cascade: that judge's confidence (the best one seen on an abstained row)
    # A checklist rubric (judge._checklist): each criterion's verdict, in the rubric's order; ``score``
    # is the weighted mean of those read, ``label`` is None. None for every other rubric.
    criteria: list[CriterionVerdict] | None = None

    @field_validator("error")
    @classmethod
    def _no_secret(cls, error: str | None) -> str | None:
        """An error may quote a provider's body (a 401 echoing the key) or a URL with credentials: never kept."""
        return redact(error)

    @property
    def ok(self) -> bool:
        return self.status == "ok"
