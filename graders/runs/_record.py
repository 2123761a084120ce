"""A run's record, and the run filling it: what the rows came to, what it took, what its tokens cost.

The record (``RunSummary``) is two parts: ``results``, what the rows came to (counts, scores, labels, errors, a
spread), and ``stats``, what it took (tokens as one ``Usage``, requests, time, money, pacing, who answered). Each
model keeps to a few fields, related ones in a small sub-model; ``--json`` and a Batch API run's saved state read
the record flat, key for key as before, through one table (``FlatRecord.FLAT``).

A run's loop counts rows and tokens (``_file._Tally``); what those cost at the price table (cache reads and writes
at theirs, the flex part at the flex tier's, a Batch API run's at half), what the response cache saved, and a
panel's per-member figures are added here, by ``grade`` (``_grade``), so a Python caller's record is the command
line's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, model_serializer, model_validator

from gradekit.judge import Usage
from gradekit.judge._pacing import Pacing

from .._spread import SpreadReport

if TYPE_CHECKING:
    from gradekit.judge import Budget, JudgeProtocol
    from gradekit.judge._protocol import JudgeStats


class Outcomes(BaseModel):
    """What every run's rows came to: counted, failed, and how they were decided."""

    rows: int = 0
    ok: int = 0
    errors: int = 0
    decided_by: dict[str, int] = Field(default_factory=dict)  # a cascade: rows each judge decided; a hybrid grader: rows per path
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    error_examples: list[str] = Field(default_factory=list)
    parse_failure_rate: float = 0.0  # a file run: over rows; a pairwise run: over all verdicts asked


class EvalFigures(BaseModel):
    """An Evals-API definition's run figures, named as an eval run reports them (graders._evals)."""

    result_counts: dict[str, int] | None = None
    per_testing_criteria_results: list[dict[str, Any]] | None = None


class RunResults(Outcomes):
    """What a file run's rows came to."""

    skipped: int = 0  # not judged because the budget ran out (error_kind "budget")
    abstained: int = 0  # a cascade (or a unanimous jury) trusted no judge with the row: a row for a human, not an error
    mean_agreement: float | None = None  # a jury: mean share of the answering jurors agreeing with the decision
    mean_score: float | None = None
    label_counts: dict[str, int] = Field(default_factory=dict)
    spread: SpreadReport | None = None  # with `group_by`: does the reward vary within and across groups
    evals: EvalFigures | None = None


class Money(BaseModel):
    """What the tokens cost at the price table (None: the model has no price), and what caches saved."""

    cost_usd: float | None = None  # the tokens at the table's prices (cache reads and writes, each tier at its own)
    cost_by_tier: dict[str, float] | None = None  # {"standard": USD, "flex": USD} with the flex service tier
    cost_basis: str | None = None  # how cost_usd was priced when not at the live price (a Batch API run: the Batch API's)
    # The provider's prompt cache: prompt tokens read from it and written to it (of all prompt tokens), and
    # the USD it saved (reads below the input price) less what its writes cost above it: negative when it cost.
    cache_hit_ratio: float = 0.0
    cache_write_ratio: float = 0.0
    cache_saved_usd: float | None = None
    saved_tokens: int = 0  # tokens of the replies this run took from the response cache
    saved_usd: float | None = None
    budget: str | None = None  # why rows were skipped, with what was spent, when a cap was reached


class RewardTimes(BaseModel):
    """Per-row reward time of the rows this run graded (cache hits included)."""

    p50: float | None = None
    p99: float | None = None
    slowest_rows: list[dict[str, Any]] = Field(default_factory=list)  # [{"row": n, "id": ..., "seconds": s}], slowest first


class Served(BaseModel):
    """Drift, seen (runs._drift): rows per (served model, system_fingerprint) in output order, where it changed, and a
    note for a long run whose judge is named by an alias."""

    groups: list[dict[str, Any]] = Field(default_factory=list)  # [{"model", "system_fingerprint", "rows", "first_row", "last_row"}]
    changes: list[dict[str, Any]] = Field(default_factory=list)  # [{"row", "model", "system_fingerprint", "was": {...}}]
    changes_total: int = 0  # changes seen (the list keeps the first runs._drift.CHANGES_LISTED)
    note: str | None = None


class RunStats(BaseModel):
    """What a run took: its tokens and requests, cache hits, time, and (a file run's) money, pacing and drift."""

    usage: Usage = Field(default_factory=Usage)  # requests and tokens; the flex part is ``flex_usage``
    # The part of the counts above billed at the flex service tier, keyed as the usage's counts, in the order seen.
    flex_usage: dict[str, int] = Field(default_factory=dict)
    cache_hits: int = 0
    wall_s: float = 0.0
    judgements_per_s: float = 0.0
    judge_calls_saved: int | None = None  # a hybrid grader: judge requests the symbolic path made needless (two per row it decided)
    money: Money = Field(default_factory=Money)
    pacing: Pacing | None = None  # how the run paced itself at its end (the limiter's)
    reward_times: RewardTimes = Field(default_factory=RewardTimes)
    served: Served = Field(default_factory=Served)
    canary: dict[str, Any] | None = None  # its checks, agreement at the start and last, and the drift it saw (runs._canary)


def _at(data: Any, path: str) -> Any:
    for part in path.split("."):
        if data is None:
            return None
        data = data[part] if isinstance(data, dict) else getattr(data, part)
    return data


class FlatRecord(BaseModel):
    """A record in parts that reads and writes flat: ``FLAT`` is (key, dotted path) in the flat form's order.

    Keys in ``OMIT_NONE`` are left out when None (a figure only some runs have). A flat dict validates back
    into the parts, so a record saved flat (a Batch API run's state) is read as it was written.
    """

    FLAT: ClassVar[tuple[tuple[str, str], ...]] = ()
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict[str, Any]:
        nested = handler(self)
        return {key: value for key, path in self.FLAT
                if (value := _at(nested, path)) is not None or key not in self.OMIT_NONE}

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(key in data and key not in cls.model_fields for key, _ in cls.FLAT):
            return data  # already in parts
        nested: dict[str, Any] = {}
        for key, path in cls.FLAT:
            if data.get(key) is None:  # every part's figure that may be None is None by default
                continue
            *parents, last = path.split(".")
            where = nested
            for part in parents:
                where = where.setdefault(part, {})
            where[last] = data[key]
        return nested


class RunSummary(FlatRecord):
    """What a file run did: its ``results`` and ``stats``, and how it stood to an earlier run of the same output."""

    results: RunResults = Field(default_factory=RunResults)
    stats: RunStats = Field(default_factory=RunStats)
    resumed_from: int = 0  # rows already in the output from an earlier, interrupted run
    already_complete: bool = False  # the output was finished before: nothing was done
    warnings: list[str] = Field(default_factory=list)  # e.g. a checkpoint that did not match the output, so the run started over

    # --json's keys, in --json's order.
    FLAT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("rows", "results.rows"), ("ok", "results.ok"), ("errors", "results.errors"), ("skipped", "results.skipped"),
        ("abstained", "results.abstained"), ("decided_by", "results.decided_by"), ("judge_calls_saved", "stats.judge_calls_saved"),
        ("mean_agreement", "results.mean_agreement"), ("resumed_from", "resumed_from"), ("already_complete", "already_complete"),
        ("mean_score", "results.mean_score"), ("label_counts", "results.label_counts"),
        ("parse_failure_rate", "results.parse_failure_rate"), ("errors_by_kind", "results.errors_by_kind"),
        ("error_examples", "results.error_examples"), ("prompt_tokens", "stats.usage.prompt_tokens"),
        ("completion_tokens", "stats.usage.completion_tokens"), ("reasoning_tokens", "stats.usage.reasoning_tokens"),
        ("cached_tokens", "stats.usage.cached_tokens"), ("cache_write_tokens", "stats.usage.cache_write_tokens"),
        ("flex_usage", "stats.flex_usage"), ("cache_hits", "stats.cache_hits"), ("requests", "stats.usage.requests"),
        ("wall_s", "stats.wall_s"), ("judgements_per_s", "stats.judgements_per_s"), ("spread", "results.spread"),
        ("cost_usd", "stats.money.cost_usd"), ("cost_by_tier", "stats.money.cost_by_tier"),
        ("cache_hit_ratio", "stats.money.cache_hit_ratio"), ("cache_write_ratio", "stats.money.cache_write_ratio"),
        ("cache_saved_usd", "stats.money.cache_saved_usd"), ("saved_tokens", "stats.money.saved_tokens"),
        ("saved_usd", "stats.money.saved_usd"), ("budget", "stats.money.budget"), ("warnings", "warnings"),
        ("cost_basis", "stats.money.cost_basis"), ("pacing", "stats.pacing"), ("result_counts", "results.evals.result_counts"),
        ("per_testing_criteria_results", "results.evals.per_testing_criteria_results"),
        ("reward_seconds_p50", "stats.reward_times.p50"), ("reward_seconds_p99", "stats.reward_times.p99"),
        ("slowest_rows", "stats.reward_times.slowest_rows"), ("served", "stats.served.groups"),
        ("served_changes", "stats.served.changes"), ("served_changes_total", "stats.served.changes_total"),
        ("served_note", "stats.served.note"), ("canary", "stats.canary"),
    )
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"judge_calls_saved", "canary"})  # a hybrid run's figure, a canary run's block


def add_money(summary: RunSummary, budget: Budget, model: str, *, batch: bool = False) -> None:
    """Cost of the output's tokens at the table's prices (cache reads and writes at theirs, the flex part at the
    flex tier's, a Batch API run's at the Batch API's), what the provider's prompt cache saved or cost, what the
    response cache saved, and why rows were skipped."""
    from decimal import Decimal

    from gradekit.judge._budget import BATCH_PRICE_SHARE, price_of, prompt_cache_usd, usage_cost

    stats, money = summary.stats, summary.stats.money
    price = price_of(budget.prices, model)
    if price is not None:
        flex = {f"flex_{name}": value for name, value in stats.flex_usage.items()}
        usage = stats.usage.model_copy(update=flex)
        total, flex_part = usage_cost(budget.prices, model, usage), usage_cost(budget.prices, model, usage, tier="flex")
        assert total is not None and flex_part is not None
        if batch:  # the provider's Batch API bills half its live price
            total, flex_part = total * Decimal(str(BATCH_PRICE_SHARE)), flex_part * Decimal(str(BATCH_PRICE_SHARE))
            money.cost_basis = f"Batch API: {BATCH_PRICE_SHARE:.0%} of the live price"
        money.cost_usd = float(total)
        if flex:
            money.cost_by_tier = {"standard": float(total - flex_part), "flex": float(flex_part)}
        if usage.cached_tokens or usage.cache_write_tokens:
            money.cache_saved_usd = float(prompt_cache_usd(price, usage))
        if usage.cache_write_tokens and not usage.cached_tokens:
            warning = (
                f"{usage.cache_write_tokens} prompt tokens were written to the provider's prompt cache and none was read "
                f"back (${-money.cache_saved_usd:.4f} above the input price): each row's prefix differs, or the cache "
                "expired between requests" if money.cache_saved_usd is not None else
                f"{usage.cache_write_tokens} prompt tokens were written to the provider's prompt cache and none was read back")
            summary.warnings.append(warning)
            logging.getLogger("gradekit.runs").warning(warning)
    money.saved_tokens = budget.saved_tokens
    money.saved_usd = budget.saved_usd if price is not None else None
    if summary.results.skipped:
        money.budget = budget.reason()


def price(summary: RunSummary, prices: Any, model: str) -> None:
    """A Ray run's tokens at the table's prices (its actors keep no table): prompt and completion only."""
    from gradekit.judge import cost_usd
    from gradekit.judge._budget import price_of

    if prices is not None and price_of(prices, model) is not None:
        usage = summary.stats.usage
        summary.stats.money.cost_usd = cost_usd(prices, model, usage.prompt_tokens, usage.completion_tokens)


def endpoints_of(stats: JudgeStats | None) -> list[dict[str, Any]]:
    """A fleet's endpoints as the record lists them (empty before the judge is built)."""
    return [e.model_dump() for e in stats.endpoints] if stats is not None else []


def panel_summary(panel: JudgeProtocol, summary: RunSummary, prices: Any) -> dict[str, Any] | None:
    """The ``jury`` / ``cascade`` block of the run's record (None for a single judge)."""
    from gradekit.judge import Cascade, Jury, cost_usd
    from gradekit.judge._budget import price_of

    def priced(model: str, prompt: int, completion: int, cached: int = 0, written: int = 0) -> float | None:
        return cost_usd(prices, model, prompt, completion, cached, cache_write_tokens=written) if price_of(prices, model) is not None else None

    results = summary.results
    usage = panel.stats().members
    if usage is None:  # a single judge
        return None
    members = []
    for member, figures in usage.by_model.items():
        model = usage.models.get(member, member)
        members.append({"model": model, **({"juror": member} if member != model else {}), **figures,
                        "cost_usd": priced(model, figures["prompt_tokens"], figures["completion_tokens"], figures["cached_tokens"],
                                           figures["cache_write_tokens"])})
    costs = [m["cost_usd"] for m in members]
    total = sum(c for c in costs if c is not None) if costs and all(c is not None for c in costs) else None
    if isinstance(panel, Jury):
        return {"jurors": [j.model for j in panel.jurors], "aggregate": panel.aggregate, "quorum": panel.quorum,
                "mean_agreement": results.mean_agreement, "members": members, "cost_usd": total}
    if not isinstance(panel, Cascade):
        return None
    spec = panel.spec
    judged = results.ok + results.abstained
    strongest = spec.judges[-1].model
    # The baseline: the strongest judge alone, asked every row the same way (K samples per row).
    per_row = 1 if spec.confidence == "logprobs" else spec.samples
    rows_asked = results.rows - summary.resumed_from if not summary.already_complete else 0
    seen = next((m for m in members if m["model"] == strongest and m["requests"]), None) or next((m for m in members if m["requests"]), None)
    alone_requests = rows_asked * per_row
    alone_cost = None
    if seen is not None:
        mean_prompt, mean_completion = seen["prompt_tokens"] / seen["requests"], seen["completion_tokens"] / seen["requests"]
        alone_cost = priced(strongest, round(mean_prompt * alone_requests), round(mean_completion * alone_requests))
    requests = sum(m["requests"] for m in members)
    return {
        "judges": [j.model for j in spec.judges],
        "thresholds": [j.threshold for j in spec.judges],
        "coverage": results.ok / judged if judged else None,
        "abstained": results.abstained,
        "decided_by": results.decided_by,
        "share": {j.model: (results.decided_by.get(j.model, 0) / judged if judged else None) for j in spec.judges},
        "members": members,
        "requests": requests,
        "cost_usd": total,
        "strongest_alone": {"model": strongest, "requests": alone_requests, "cost_usd": alone_cost,
                            "requests_ratio": requests / alone_requests if alone_requests else None},
        "guarantee": {"target": spec.target, "delta": spec.delta, "delta_per_judge": spec.delta_per_judge,
                      "calibration_n": spec.calibration_n, "confidence": spec.confidence, "samples": spec.samples},
    }
