"""A file of pairs graded with a pairwise rubric: one output row per input row, in order, both orders per pair.

Each pair is judged by :func:`gradekit.graders._pairwise.pairwise_grader` (both orders, the pair rule); the run
writes its rows and fills its record (``PairwiseRunSummary``: ``results`` and ``stats``, read flat). Its Acc / Agr
against gold labels are calibration's: its front door (``calibration.grade_pairwise_file``) builds the plan from
:func:`pairwise_grading` and hands :func:`run_pairwise` the report to make.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field

from gradekit.judge import Judge, JudgeProtocol, Jury, Rubric, Usage, Verdict

from .._flags import said_as_flags
from .._pairwise import ConflictRule, PairVerdict, Winner, pairwise_grader
from ._file import _variables, check_columns, failed_reply, keep_input, output_columns, stream_in_order
from ._io import InputError, RowWriter, RunInput
from ._plan import Grading, RunPlan
from ._record import FlatRecord, Outcomes, RunStats

# Acc / Agr of the pairs from both orders' winners and the gold labels as read; None when a label does not read.
PairReport = Callable[[Sequence[Winner | None], Sequence[Winner | None], Sequence[Any]], Any]

PAIRWISE_COLUMNS = [
    "winner", "score", "status", "error_kind", "error", "decided_by", "agree", "orders_read",
    "winner_ab", "winner_ba", "label_ab", "label_ba", "score_ab", "score_ba", "rationale_ab", "rationale_ba",
    "prompt_tokens", "completion_tokens", "cached", "raw_reply_ab", "raw_reply_ba",
]


class PairwiseResults(Outcomes):
    """What a pairwise run's pairs came to; ``report`` holds Acc/Agr when the input has gold labels."""

    winners: dict[str, int] = Field(default_factory=dict)
    agreement: float | None = None  # share of fully judged pairs whose orders agree
    one_order: int = 0  # pairs scored from one readable order (``vote``)
    label_column: str | None = None
    report: Any = None  # calibration's PairwiseReport


class PairwiseRunSummary(FlatRecord):
    """What a pairwise batch run did: its ``results``, and its ``stats`` (tokens, requests, cache hits, time)."""

    results: PairwiseResults = Field(default_factory=PairwiseResults)
    stats: RunStats = Field(default_factory=RunStats)

    FLAT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("rows", "results.rows"), ("ok", "results.ok"), ("errors", "results.errors"), ("winners", "results.winners"),
        ("agreement", "results.agreement"), ("one_order", "results.one_order"), ("decided_by", "results.decided_by"),
        ("errors_by_kind", "results.errors_by_kind"), ("error_examples", "results.error_examples"),
        ("parse_failure_rate", "results.parse_failure_rate"), ("prompt_tokens", "stats.usage.prompt_tokens"),
        ("completion_tokens", "stats.usage.completion_tokens"), ("reasoning_tokens", "stats.usage.reasoning_tokens"),
        ("cached_tokens", "stats.usage.cached_tokens"), ("cache_hits", "stats.cache_hits"), ("requests", "stats.usage.requests"),
        ("wall_s", "stats.wall_s"), ("label_column", "results.label_column"), ("report", "results.report"),
    )


def pair_row(row: Mapping[str, Any], pair: PairVerdict) -> dict[str, Any]:
    """The output row: the input's columns (a gold ``label`` stays as it is), the final verdict, both orders.

    A jury's pair adds ``agreement`` and ``jurors`` (JSON); its ``*_ab`` / ``*_ba`` columns are the
    first answering juror's, and ``winner_ab`` / ``winner_ba`` the jurors' majority per order.
    """
    ab, ba = pair.ab, pair.ba
    panel = {"agreement": pair.agreement, "jurors": json.dumps(pair.jurors, ensure_ascii=False)} if pair.jurors is not None else {}
    return {**_pair_cells(row, pair, ab, ba), **panel}


def _pair_cells(row: Mapping[str, Any], pair: PairVerdict, ab: Verdict, ba: Verdict | None) -> dict[str, Any]:
    usage = sum((v.usage for v in pair.verdicts), Usage())
    return {
        **keep_input(row, PAIRWISE_COLUMNS),
        "winner": pair.winner,
        "score": pair.score,
        "status": pair.status,
        "error_kind": pair.error_kind,
        "error": said_as_flags(pair.error),
        "decided_by": pair.decided_by,
        "agree": pair.agree,
        "orders_read": pair.orders_read,
        "winner_ab": pair.winner_ab,
        "winner_ba": pair.winner_ba,
        "label_ab": ab.label,
        "label_ba": ba.label if ba is not None else None,
        "score_ab": pair.score_ab,
        "score_ba": pair.score_ba,
        "rationale_ab": ab.rationale,
        "rationale_ba": ba.rationale if ba is not None else None,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached": all(v.cached for v in pair.verdicts),
        "raw_reply_ab": failed_reply(ab),
        "raw_reply_ba": failed_reply(ba),
    }


def pairwise_grading(judge: JudgeProtocol, rubric: Rubric, source: RunInput, mapping: Mapping[str, str], *, swap: bool,
                     on_conflict: ConflictRule, tiebreak: Judge | None) -> Grading[PairVerdict]:
    """How a row of ``source`` becomes a judged pair (both orders when ``swap``, the pair rule): the run's grading.

    The rubric's variables are checked against the input's columns here, before any request.
    """
    grade = pairwise_grader(judge, rubric, swap=swap, on_conflict=on_conflict, tiebreak=tiebreak)
    check_columns(source, rubric, mapping)
    result_columns = [*PAIRWISE_COLUMNS, "agreement", "jurors"] if isinstance(judge, Jury) else PAIRWISE_COLUMNS
    # Each pair holds two requests in flight, so half as many workers keep the limiter as busy.
    workers = max(1, judge.concurrency // (2 if swap else 1)) + 2
    # No checkpoint (a pairwise run is not resumed), so no settings and no Parquet types.
    return Grading(result_columns, {}, {}, workers, prepare=lambda row, number: _variables(row, rubric, mapping, number),
                   judge_row=grade, input_error=_pair_input_error, to_row=pair_row)


def _pair_input_error(message: str) -> PairVerdict:
    failed = Verdict(status="error", error_kind="input", error=message)
    return PairVerdict(ab=failed, status="error", error_kind="input", error=message)


async def run_pairwise(plan: RunPlan[PairVerdict], *, label_column: str | None, report: PairReport | None) -> PairwiseRunSummary:
    """Write one output row per pair, in order, and count them; ``report`` (given each order's winners and the
    rows' ``label_column``) makes the record's ``report``. The caller holds the output's lock."""
    header = plan.input.columns
    columns = output_columns(header, plan.grading.columns) if header is not None else None
    try:
        writer = RowWriter(plan.output, columns=columns)
    except OSError as e:  # a read-only file or folder: before any request
        raise InputError(f"cannot write {plan.output}: {e.strerror or e}") from e
    outcomes: dict[int, tuple[Any, PairVerdict | None]] = {}
    started = time.perf_counter()

    def emit(number: int, out_row: dict[str, Any], pair: PairVerdict) -> dict[str, Any]:
        outcomes[number] = (out_row.get(label_column) if label_column else None, pair)
        if plan.on_row is not None:
            plan.on_row(pair)
        return plan.grading.to_row(out_row, pair)

    await stream_in_order(plan, writer, emit)
    return _summarise([outcomes[k] for k in sorted(outcomes)], label_column, report, time.perf_counter() - started)


def _summarise(outcomes: list[tuple[Any, PairVerdict]], label_column: str | None, report: PairReport | None,
               wall: float) -> PairwiseRunSummary:
    pairs = [p for _, p in outcomes]
    verdicts = [v for p in pairs for v in p.verdicts]
    kinds = Counter(p.error_kind or "unknown" for p in pairs if p.status == "error")
    judged = [p for p in pairs if p.agree is not None]
    usage = sum((v.usage for v in verdicts), Usage())
    results = PairwiseResults(
        rows=len(pairs),
        ok=sum(p.status == "ok" for p in pairs),
        errors=sum(p.status == "error" for p in pairs),
        winners=dict(Counter(p.winner for p in pairs if p.winner is not None).most_common()),
        agreement=sum(bool(p.agree) for p in judged) / len(judged) if judged else None,
        one_order=sum(p.status == "ok" and p.orders_read == 1 and p.ba is not None for p in pairs),
        decided_by=dict(Counter(p.decided_by for p in pairs if p.decided_by is not None).most_common()),
        errors_by_kind=dict(kinds.most_common()),
        error_examples=[f"{p.error_kind}: {said_as_flags(p.error)}" for p in pairs if p.status == "error"][:5],
        parse_failure_rate=sum(v.error_kind == "parse_failure" for v in verdicts) / len(verdicts) if verdicts else 0.0,
    )
    stats = RunStats(usage=usage, cache_hits=sum(v.cached for v in verdicts), wall_s=wall)
    if report is not None and label_column and pairs:
        made = report([p.winner_ab for p in pairs], [p.winner_ba for p in pairs], [label for label, _ in outcomes])
        if made is not None:
            results.label_column, results.report = label_column, made
    return PairwiseRunSummary(results=results, stats=stats)
