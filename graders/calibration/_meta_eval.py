"""Meta-evaluation: score a judge (or a panel) on labelled pairwise suites, beside the published judges.

Every pair is judged in both orders by :func:`pairwise_grader` through the normal Judge path
(cache, limiter, budget, record/replay), so a meta-eval costs and behaves like a `gradekit grade`
run. Per suite, per subset and ``overall`` it reports accuracy, order agreement, position bias,
parse failures, errors, requests, tokens and cost; with several judges a ``jury`` row (majority
of the judges' pair winners) shows whether the panel beats its best member.

Accuracy follows the pair rule. Under ``tie`` it is LLMBar's Acc, the mean over the two orders of
"this order named the gold winner" (a failed order counts wrong): the figure LLMBar published,
so the published rows compare like with like. Under ``vote``, ``first`` and ``third`` the rule
names one winner per pair and accuracy is the share of pairs whose winner is the gold one (a tie
or an error counts wrong), as JudgeBench reports. Both are in every row (``order_accuracy``,
``pair_accuracy``); ``accuracy_by`` says which one ``accuracy`` is.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from gradekit._extras import require
from gradekit.judge import Judge, ModelPrice, Rubric, Usage, cost_usd
from gradekit.judge._budget import price_of

from .._pairwise import ConflictRule, PairVerdict, pairwise_grader
from ._agreement import pairwise_report
from ._suites import OVERALL, PublishedRow, Suite

JURY = "jury"


def default_rule(rubric: Rubric) -> ConflictRule:
    """The pair rule the rubric's benchmark uses: Arena-Hard votes; LLMBar ties a conflict."""
    return "vote" if rubric.name == "arena_hard_pairwise" else "tie"


class MetaEvalRow(BaseModel):
    """One judge on one subset. Accuracy and rates are percent (0-100); None where undefined."""

    suite: str
    subset: str
    judge: str
    n: int
    accuracy: float | None
    agreement: float | None  # share of pairs whose two orders name the same winner (LLMBar's Agr)
    first_position_win_rate: float | None  # of verdicts naming a winner, how often the first-shown output won
    parse_failures: int  # verdicts the judge answered but no offered label could be read from
    errors: int  # pairs without a final verdict
    requests: int
    cost_usd: float | None  # None: no price for the model (--prices)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    order_accuracy: float | None = None
    pair_accuracy: float | None = None
    accuracy_by: Literal["order_mean", "pair"] = "pair"
    one_order: int = 0  # pairs scored from one readable order (vote)
    errors_by_kind: dict[str, int] = Field(default_factory=dict)


class JuryVerdict(BaseModel):
    """Does the panel beat its best member on this subset (pair accuracy, percent)?"""

    suite: str
    subset: str
    accuracy: float | None
    best_member: str | None
    best_member_accuracy: float | None
    beats_best: bool | None


class MetaEvalReport(BaseModel):
    rubric: str
    on_conflict: str
    judges: list[str]
    results: list[MetaEvalRow]
    published: list[PublishedRow] = Field(default_factory=list)
    jury: list[JuryVerdict] = Field(default_factory=list)
    wall_s: float = 0.0


def _pct(count: float, n: int) -> float | None:
    return count / n * 100 if n else None


def _cost(prices: Mapping[str, ModelPrice], model: str, prompt: int, completion: int) -> float | None:
    return cost_usd(prices, model, prompt, completion) if price_of(prices, model) is not None else None


def judge_row(suite: str, subset: str, judge: str, model: str, labels: Sequence[str], pairs: Sequence[PairVerdict],
              on_conflict: str, prices: Mapping[str, ModelPrice]) -> MetaEvalRow:
    """One judge's figures over some pairs (``labels`` is the gold winner of each, "1" or "2")."""
    n = len(pairs)
    verdicts = [v for p in pairs for v in p.verdicts]
    usage = sum((v.usage for v in verdicts), Usage())
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    report = pairwise_report([p.winner_ab for p in pairs], [p.winner_ba for p in pairs], list(labels), convention="llmbar")
    pair_acc = _pct(sum(p.status == "ok" and p.winner == gold for p, gold in zip(pairs, labels)), n)
    order_acc = report.acc * 100 if report.acc is not None else None
    by: Literal["order_mean", "pair"] = "order_mean" if on_conflict == "tie" else "pair"
    return MetaEvalRow(
        suite=suite, subset=subset, judge=judge, n=n,
        accuracy=order_acc if by == "order_mean" else pair_acc,
        agreement=report.agr * 100 if report.agr is not None else None,
        first_position_win_rate=report.first_position_win_rate * 100 if report.first_position_win_rate is not None else None,
        parse_failures=sum(v.error_kind == "parse_failure" for v in verdicts),
        errors=sum(p.status != "ok" for p in pairs),
        requests=usage.requests,
        cost_usd=_cost(prices, model, prompt, completion),
        prompt_tokens=prompt, completion_tokens=completion, cache_hits=sum(v.cached for v in verdicts),
        order_accuracy=order_acc, pair_accuracy=pair_acc, accuracy_by=by,
        one_order=sum(p.status == "ok" and p.orders_read == 1 for p in pairs),
        errors_by_kind=dict(Counter(p.error_kind or "unknown" for p in pairs if p.status != "ok").most_common()),
    )


def jury_winner(winners: Sequence[str | None]) -> str | None:
    """Majority of the judges' pair winners; a tie or a failed judge abstains, an even split is a tie."""
    if all(w is None for w in winners):
        return None
    votes = Counter(w for w in winners if w in ("1", "2"))
    return "1" if votes["1"] > votes["2"] else "2" if votes["2"] > votes["1"] else "tie"


def jury_row(suite: str, subset: str, labels: Sequence[str], members: Sequence[tuple[str, Sequence[PairVerdict]]],
             prices: Mapping[str, ModelPrice]) -> MetaEvalRow:
    n = len(labels)
    winners = [jury_winner([p[i].winner if p[i].status == "ok" else None for _, p in members]) for i in range(n)]
    verdicts = [v for _, pairs in members for p in pairs for v in p.verdicts]
    spent = [(model, sum((v.usage for p in pairs for v in p.verdicts), Usage())) for model, pairs in members]
    costs = [_cost(prices, model, usage.prompt_tokens, usage.completion_tokens) for model, usage in spent]
    usage = sum((u for _, u in spent), Usage())
    acc = _pct(sum(w == gold for w, gold in zip(winners, labels)), n)
    return MetaEvalRow(
        suite=suite, subset=subset, judge=JURY, n=n, accuracy=acc, agreement=None, first_position_win_rate=None,
        parse_failures=sum(v.error_kind == "parse_failure" for v in verdicts), errors=sum(w is None for w in winners),
        requests=usage.requests, cost_usd=None if None in costs else sum(c or 0.0 for c in costs),
        prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
        cache_hits=sum(v.cached for v in verdicts), pair_accuracy=acc, accuracy_by="pair",
    )


async def meta_eval(
    suites: Sequence[Suite],
    rubric: Rubric,
    judges: Sequence[Judge],
    *,
    on_conflict: ConflictRule | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
    concurrency: int = 16,
    tiebreak: Judge | None = None,
    on_pair: Callable[[], None] | None = None,
) -> MetaEvalReport:
    """Judge every pair of every suite in both orders with each judge and report per subset.

    Args:
        suites: from :func:`load_suite`.
        rubric: a pairwise rubric (``pairwise: {first, second}``) with variables instruction,
            output_1 and output_2 (the shipped ``llmbar_pairwise`` and ``arena_hard_pairwise``).
        judges: one or more judges; their models name the rows, so they must differ.
        on_conflict: the pair rule; default :func:`default_rule` of the rubric.
        prices: the price table for ``cost_usd`` (:func:`judge.load_prices`).
        concurrency: pairs in flight at once per judge (each holds two requests); the judges'
            limiter still caps the requests.
        tiebreak: the judge asked a third time under ``on_conflict="third"``.
        on_pair: called after each judged pair (a progress bar).
    """
    if rubric.pairwise is None:
        raise ValueError(f"rubric {rubric.name!r} is not pairwise; use llmbar_pairwise or arena_hard_pairwise")
    missing = {"instruction", "output_1", "output_2"} - set(rubric.variables)
    if missing:
        raise ValueError(f"rubric {rubric.name!r} lacks the suite variables {', '.join(sorted(missing))}")
    models = [j.model for j in judges]
    if not judges or len(set(models)) != len(models):
        raise ValueError(f"give one or more judges with different models, not {models}")
    rule: ConflictRule = on_conflict or default_rule(rubric)
    table = dict(prices or {})
    started = time.perf_counter()

    async def run_judge(judge: Judge) -> list[list[PairVerdict]]:
        grade = pairwise_grader(judge, rubric, on_conflict=rule, tiebreak=tiebreak)
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(row: dict[str, str]) -> PairVerdict:
            async with gate:
                pair = await grade(row)
            if on_pair is not None:
                on_pair()
            return pair

        return [list(await asyncio.gather(*(one(p.row()) for p in suite.pairs))) for suite in suites]

    per_judge = await asyncio.gather(*(run_judge(j) for j in judges))
    results: list[MetaEvalRow] = []
    jury: list[JuryVerdict] = []
    for s, suite in enumerate(suites):
        subsets = [x for x in suite.subsets if any(p.subset == x for p in suite.pairs)]
        groups = [(x, [i for i, p in enumerate(suite.pairs) if p.subset == x]) for x in subsets]
        if len(subsets) > 1:
            groups.append((OVERALL, list(range(len(suite.pairs)))))
        for subset, idx in groups:
            labels = [suite.pairs[i].label for i in idx]
            members = [(model, [pairs[s][i] for i in idx]) for model, pairs in zip(models, per_judge)]
            rows = [judge_row(suite.name, subset, model, model, labels, pairs, rule, table) for model, pairs in members]
            results += rows
            if len(judges) > 1:
                panel = jury_row(suite.name, subset, labels, members, table)
                results.append(panel)
                best = max(rows, key=lambda r: -1.0 if r.pair_accuracy is None else r.pair_accuracy)
                jury.append(JuryVerdict(suite=suite.name, subset=subset, accuracy=panel.accuracy, best_member=best.judge,
                                        best_member_accuracy=best.pair_accuracy,
                                        beats_best=None if panel.accuracy is None or best.pair_accuracy is None
                                        else panel.accuracy > best.pair_accuracy))
    published = [row for suite in suites for row in suite.published]
    return MetaEvalReport(rubric=rubric.name, on_conflict=rule, judges=models, results=results, published=published,
                          jury=jury, wall_s=time.perf_counter() - started)


def plot_meta_eval(report: MetaEvalReport, folder: str | Path) -> list[str]:
    """Write accuracy.png (per subset and judge) and position_bias.png (first-shown win rate) into ``folder``."""
    require("calibration", "meta-eval plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys((r.suite, r.subset) for r in report.results))
    names = list(dict.fromkeys(r.judge for r in report.results))
    value = {(r.suite, r.subset, r.judge): r for r in report.results}
    written = []
    for filename, field, title, reference in (
        ("accuracy.png", "accuracy", f"accuracy per subset ({report.rubric}, rule {report.on_conflict})", None),
        ("position_bias.png", "first_position_win_rate", "first-shown output wins (50% is unbiased)", 50.0),
    ):
        judges = [j for j in names if any(getattr(value.get((s, x, j)), field, None) is not None for s, x in keys)]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(keys) * max(1, len(judges)) + 2), 4.5))
        width = 0.8 / max(1, len(judges))
        for k, judge in enumerate(judges):
            heights = [getattr(value.get((s, x, judge)), field, None) for s, x in keys]
            ax.bar([i + k * width for i in range(len(keys))], [h if h is not None else 0.0 for h in heights], width, label=judge)
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks([i + width * (len(judges) - 1) / 2 for i in range(len(keys))])
        ax.set_xticklabels([f"{s}\n{x}" for s, x in keys], fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.set_title(title)
        if judges:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / filename
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(str(path))
    return written
