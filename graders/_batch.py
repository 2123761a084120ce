"""Grade a file of rows with one rubric: every input row gets exactly one output row, in order."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, Field

from judge import Judge, Rubric, Verdict

from ._io import InputError, RowError, RowWriter, csv_header, read_rows
from ._spread import SpreadReport, SpreadTally

RESULT_COLUMNS = ["score", "label", "status", "error_kind", "error", "rationale", "prompt_tokens", "completion_tokens", "cached"]


class RunSummary(BaseModel):
    """What a batch run did, for the terminal and for --json."""

    rows: int = 0
    ok: int = 0
    errors: int = 0
    mean_score: float | None = None
    label_counts: dict[str, int] = Field(default_factory=dict)
    parse_failure_rate: float = 0.0
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    error_examples: list[str] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    requests: int = 0
    wall_s: float = 0.0
    judgements_per_s: float = 0.0
    spread: SpreadReport | None = None  # with --group-by: does the reward vary within and across groups


def resolve_mapping(rubric: Rubric, pairs: Iterable[str]) -> dict[str, str]:
    """``VAR=COLUMN`` pairs -> {variable: column}; unmapped variables read the column of their own name."""
    mapping = {var: var for var in rubric.variables}
    for pair in pairs:
        var, sep, column = pair.partition("=")
        if not sep or not var or not column:
            raise InputError(f"--map {pair!r}: expected VAR=COLUMN")
        if var not in rubric.variables:
            raise InputError(f"--map {pair!r}: rubric {rubric.name!r} has no variable {var!r} (it has: {', '.join(rubric.variables)})")
        mapping[var] = column
    return mapping


def check_columns(path: Path, rubric: Rubric, mapping: Mapping[str, str]) -> None:
    """Fail before any request when a CSV header lacks a column the rubric needs."""
    header = csv_header(path)
    if header is None:
        return
    for var, column in mapping.items():
        if rubric.variables[var].required and column not in header:
            raise InputError(
                f"{path}: column {column!r} (variable {var!r} of rubric {rubric.name!r}) is not in the header; "
                f"columns are {', '.join(header) or '(none)'}; map another with --map {var}=COLUMN"
            )


def _variables(row: Mapping[str, Any], rubric: Rubric, mapping: Mapping[str, str], number: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for var, column in mapping.items():
        if column in row and row[column] is not None:
            values[var] = row[column]
        elif rubric.variables[var].required:
            raise RowError(f"row {number}: field {column!r} (variable {var!r} of rubric {rubric.name!r}) is missing")
    return values


def keep_input(row: Mapping[str, Any], result_columns: list[str] = RESULT_COLUMNS) -> dict[str, Any]:
    """Input columns, with any that a result column would overwrite kept as ``input_<name>``.

    Labelled sets often carry a human ``label``; calibration needs it beside the judge's.
    """
    return {(f"input_{k}" if k in result_columns else k): v for k, v in row.items()}


def output_columns(header: list[str], result_columns: list[str] = RESULT_COLUMNS) -> list[str]:
    return list(keep_input(dict.fromkeys(header), result_columns)) + result_columns


def result_row(row: Mapping[str, Any], verdict: Verdict) -> dict[str, Any]:
    return {
        **keep_input(row),
        "score": verdict.score,
        "label": verdict.label,
        "status": verdict.status,
        "error_kind": verdict.error_kind,
        "error": verdict.error,
        "rationale": verdict.rationale,
        "prompt_tokens": verdict.prompt_tokens,
        "completion_tokens": verdict.completion_tokens,
        "cached": verdict.cached,
    }


async def grade_file(
    judge: Judge,
    rubric: Rubric,
    source: Path,
    destination: Path,
    mapping: Mapping[str, str],
    on_row: Callable[[Verdict], None] | None = None,
    group_by: str | None = None,
) -> RunSummary:
    """Stream ``source`` through the judge into ``destination``, keeping input order.

    Workers pull rows from the reader, so memory is bounded by the concurrency, not the file;
    finished rows wait in a small reorder buffer until every earlier row is written.
    """
    check_columns(source, rubric, mapping)
    header = csv_header(source)
    if group_by is not None and header is not None and group_by not in header:
        raise InputError(f"{source}: --group-by column {group_by!r} is not in the header; columns are {', '.join(header)}")
    spread = SpreadTally() if group_by is not None else None
    writer = RowWriter(destination, columns=output_columns(header) if header is not None else None)
    tally = _Tally()
    started = time.perf_counter()

    def emit(number: int, out_row: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        tally.add(verdict)
        if spread is not None and verdict.status == "ok" and out_row.get(group_by) is not None:
            spread.add(group_key(out_row[group_by]), verdict.score)  # type: ignore[arg-type]
        if on_row is not None:
            on_row(verdict)
        return result_row(out_row, verdict)

    await stream_in_order(
        source, rubric, mapping, writer, judge.limiter.concurrency + 2,
        judge_row=lambda values: judge.judge(rubric, values),
        input_error=lambda message: Verdict(status="error", error_kind="input", error=message),
        emit=emit,
    )
    summary = tally.summary(time.perf_counter() - started)
    summary.spread = spread.report() if spread is not None else None
    return summary


class _Outcome(Protocol):
    status: str
    error: str | None


O = TypeVar("O", bound=_Outcome)


async def stream_in_order(
    source: Path,
    rubric: Rubric,
    mapping: Mapping[str, str],
    writer: RowWriter,
    workers: int,
    judge_row: Callable[[dict[str, Any]], Awaitable[O]],
    input_error: Callable[[str], O],
    emit: Callable[[int, dict[str, Any], O], dict[str, Any]],
) -> None:
    """Judge every row of ``source`` and write ``emit``'s row for each, in input order.

    Workers pull rows from one shared reader, so memory is bounded by the concurrency, not the
    file; finished rows wait in a small reorder buffer until every earlier row is written. A row
    that cannot be read or lacks a variable still gets its row, from ``input_error``.
    """
    rows = enumerate(read_rows(source), start=1)
    pending: dict[int, dict[str, Any]] = {}
    next_to_write = 1

    def flush() -> None:
        nonlocal next_to_write
        while next_to_write in pending:
            writer.write(pending.pop(next_to_write))
            next_to_write += 1

    async def worker() -> None:
        for number, row in rows:  # a shared iterator: each row goes to exactly one worker
            out_row: dict[str, Any] = {}
            if isinstance(row, RowError):
                outcome = input_error(str(row))
            else:
                out_row = row
                try:
                    outcome = await judge_row(_variables(row, rubric, mapping, number))
                except RowError as e:
                    outcome = input_error(str(e))
                if outcome.status == "error" and outcome.error and f"row {number}" not in outcome.error:
                    outcome.error = f"row {number}: {outcome.error}"
            pending[number] = emit(number, out_row, outcome)
            flush()

    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        flush()
        writer.close()


def group_key(value: Any) -> Any:
    """A hashable key for a --group-by cell (JSONL cells may be lists or objects)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if isinstance(value, (list, dict)) else value


class _Tally:
    def __init__(self) -> None:
        self.verdicts = 0
        self.ok = 0
        self.score_sum = 0.0
        self.labels: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.examples: list[str] = []
        self.prompt_tokens = self.completion_tokens = self.cache_hits = self.requests = 0

    def add(self, verdict: Verdict) -> None:
        self.verdicts += 1
        self.prompt_tokens += verdict.prompt_tokens
        self.completion_tokens += verdict.completion_tokens
        self.requests += verdict.attempts
        self.cache_hits += verdict.cached
        if verdict.status == "ok":
            self.ok += 1
            self.score_sum += verdict.score or 0.0
            self.labels[verdict.label or ""] += 1
        else:
            self.kinds[verdict.error_kind or "unknown"] += 1
            if len(self.examples) < 5:
                self.examples.append(f"{verdict.error_kind}: {verdict.error}")

    def summary(self, wall: float) -> RunSummary:
        return RunSummary(
            rows=self.verdicts,
            ok=self.ok,
            errors=self.verdicts - self.ok,
            mean_score=self.score_sum / self.ok if self.ok else None,
            label_counts=dict(self.labels.most_common()),
            parse_failure_rate=self.kinds["parse_failure"] / self.verdicts if self.verdicts else 0.0,
            errors_by_kind=dict(self.kinds.most_common()),
            error_examples=self.examples,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cache_hits=self.cache_hits,
            requests=self.requests,
            wall_s=wall,
            judgements_per_s=self.verdicts / wall if wall > 0 else 0.0,
        )
