"""The run fills its own record: what its tokens cost, why rows were skipped, a jury's or cascade's block, the fleet.

A run's loop counts rows and tokens (``_file.RunSummary``); what those cost at the price table
(cache reads and writes at theirs, the flex part at the flex tier's, a Batch API run's at half),
what the response cache saved, and a panel's per-member figures are added here, by ``grade``
(``_grade``), so a Python caller's record is the command line's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradekit.judge import Budget, JudgeProtocol
    from gradekit.judge._protocol import JudgeStats

    from ._file import RunSummary


def add_money(summary: RunSummary, budget: Budget, model: str, *, batch: bool = False) -> None:
    """Cost of the output's tokens at the table's prices (cache reads and writes at theirs, the flex part at the
    flex tier's, a Batch API run's at the Batch API's), what the provider's prompt cache saved or cost, what the
    response cache saved, and why rows were skipped."""
    from decimal import Decimal

    from gradekit.judge._budget import BATCH_PRICE_SHARE, price_of, prompt_cache_usd, usage_cost
    from gradekit.judge._verdict import Usage

    price = price_of(budget.prices, model)
    if price is not None:
        flex = {f"flex_{name}": value for name, value in summary.flex_usage.items()}
        usage = Usage(prompt_tokens=summary.prompt_tokens, completion_tokens=summary.completion_tokens,
                      reasoning_tokens=summary.reasoning_tokens, cached_tokens=summary.cached_tokens,
                      cache_write_tokens=summary.cache_write_tokens, **flex)
        total, flex_part = usage_cost(budget.prices, model, usage), usage_cost(budget.prices, model, usage, tier="flex")
        assert total is not None and flex_part is not None
        if batch:  # the provider's Batch API bills half its live price
            total, flex_part = total * Decimal(str(BATCH_PRICE_SHARE)), flex_part * Decimal(str(BATCH_PRICE_SHARE))
            summary.cost_basis = f"Batch API: {BATCH_PRICE_SHARE:.0%} of the live price"
        summary.cost_usd = float(total)
        if flex:
            summary.cost_by_tier = {"standard": float(total - flex_part), "flex": float(flex_part)}
        if summary.cached_tokens or summary.cache_write_tokens:
            summary.cache_saved_usd = float(prompt_cache_usd(price, usage))
        if summary.cache_write_tokens and not summary.cached_tokens:
            warning = (
                f"{summary.cache_write_tokens} prompt tokens were written to the provider's prompt cache and none was read "
                f"back (${-summary.cache_saved_usd:.4f} above the input price): each row's prefix differs, or the cache "
                "expired between requests" if summary.cache_saved_usd is not None else
                f"{summary.cache_write_tokens} prompt tokens were written to the provider's prompt cache and none was read back")
            summary.warnings.append(warning)
            logging.getLogger("gradekit.runs").warning(warning)
    summary.saved_tokens = budget.saved_tokens
    summary.saved_usd = budget.saved_usd if price is not None else None
    if summary.skipped:
        summary.budget = budget.reason()


def price(summary: RunSummary, prices: Any, model: str) -> None:
    """A Ray run's tokens at the table's prices (its actors keep no table): prompt and completion only."""
    from gradekit.judge import cost_usd
    from gradekit.judge._budget import price_of

    if prices is not None and price_of(prices, model) is not None:
        summary.cost_usd = cost_usd(prices, model, summary.prompt_tokens, summary.completion_tokens)


def endpoints_of(stats: JudgeStats | None) -> list[dict[str, Any]]:
    """A fleet's endpoints as the record lists them (empty before the judge is built)."""
    return [e.model_dump() for e in stats.endpoints] if stats is not None else []


def panel_summary(panel: JudgeProtocol, summary: Any, prices: Any) -> dict[str, Any] | None:
    """The ``jury`` / ``cascade`` block of the run's record (None for a single judge)."""
    from gradekit.judge import Cascade, Jury, cost_usd
    from gradekit.judge._budget import price_of

    def priced(model: str, prompt: int, completion: int, cached: int = 0, written: int = 0) -> float | None:
        return cost_usd(prices, model, prompt, completion, cached, cache_write_tokens=written) if price_of(prices, model) is not None else None

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
                "mean_agreement": summary.mean_agreement, "members": members, "cost_usd": total}
    if not isinstance(panel, Cascade):
        return None
    spec = panel.spec
    judged = summary.ok + summary.abstained
    strongest = spec.judges[-1].model
    # The baseline: the strongest judge alone, asked every row the same way (K samples per row).
    per_row = 1 if spec.confidence == "logprobs" else spec.samples
    rows_asked = summary.rows - summary.resumed_from if not summary.already_complete else 0
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
        "coverage": summary.ok / judged if judged else None,
        "abstained": summary.abstained,
        "decided_by": summary.decided_by,
        "share": {j.model: (summary.decided_by.get(j.model, 0) / judged if judged else None) for j in spec.judges},
        "members": members,
        "requests": requests,
        "cost_usd": total,
        "strongest_alone": {"model": strongest, "requests": alone_requests, "cost_usd": alone_cost,
                            "requests_ratio": requests / alone_requests if alone_requests else None},
        "guarantee": {"target": spec.target, "delta": spec.delta, "delta_per_judge": spec.delta_per_judge,
                      "calibration_n": spec.calibration_n, "confidence": spec.confidence, "samples": spec.samples},
    }
