"""Grade a file of rows: every input row gets exactly one output row, in order, resumably.

A checkpoint beside the output (``<output>.checkpoint.json``) records how many rows are final;
a killed run started again with the same command truncates the output to that point, skips
those rows and goes on. Rows judged but not yet written when it died come back from the judge
cache, so no request is sent twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, Field

from judge import Judge, Rubric, Verdict
from judge._rubric import rubric_fingerprint
from judge._pacing import Pacing

from ._rows import RowMapping
from .._sample import Grade, Grader, Sample
from ._checkpoint import Checkpoint
from ._io import InputError, RowError, RowWriter, file_format, fingerprint, input_columns, parquet_schema, read_rows, written_rows
from .._spread import SpreadReport, SpreadTally

RESULT_COLUMNS = ["score", "label", "status", "error_kind", "error", "rationale", "prompt_tokens", "completion_tokens", "cached"]


class RunSummary(BaseModel):
    """What a batch run did, for the terminal and for --json."""

    rows: int = 0
    ok: int = 0
    errors: int = 0
    skipped: int = 0  # not judged because the budget ran out (error_kind "budget")
    resumed_from: int = 0  # rows already in the output from an earlier, interrupted run
    already_complete: bool = False  # the output was finished before: nothing was done
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
    # Money, filled by the CLI from the price table (None: the model has no price).
    cost_usd: float | None = None  # the tokens above at the table's prices
    saved_tokens: int = 0  # tokens of the replies this run took from the cache
    saved_usd: float | None = None
    budget: str | None = None  # why rows were skipped, with what was spent, when a cap was reached
    pacing: Pacing | None = None  # filled by the CLI from the limiter: how the run paced itself at its end


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
    """Fail before any request when a CSV header or Parquet schema lacks a column the rubric needs."""
    header = input_columns(path)
    if header is None:
        return
    for var, column in mapping.items():
        if rubric.variables[var].required and column not in header:
            raise InputError(
                f"{path}: column {column!r} (variable {var!r} of rubric {rubric.name!r}) is not in the file; "
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


RESULT_TYPES = {"score": "float64", "label": "string", "status": "string", "error_kind": "string", "error": "string",
                "rationale": "string", "prompt_tokens": "int64", "completion_tokens": "int64", "cached": "bool"}


def column_types(source: Path, destination: Path, header: list[str] | None, result_types: Mapping[str, str],
                 result_columns: list[str]) -> dict[str, Any]:
    """Arrow types for a Parquet output: the input's own schema, and fixed types for the results."""
    if file_format(destination) != "parquet":
        return {}
    import pyarrow as pa

    types: dict[str, Any] = {name: pa.type_for_alias(alias) for name, alias in result_types.items()}
    kind = file_format(source)
    if kind == "parquet":
        for field in parquet_schema(source):
            types[f"input_{field.name}" if field.name in result_columns else field.name] = field.type
    elif kind == "csv":
        for name in header or []:
            types.setdefault(f"input_{name}" if name in result_columns else name, pa.string())
    return types


def rubric_settings(judge: Judge, rubric: Rubric, mapping: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    """What decides a rubric run's output rows: a checkpoint from other settings is not resumed."""
    return {"rubric": rubric_fingerprint(rubric), "model": judge.model, "base_url": judge.base_url, "sampling": judge.sampling,
            "logprobs": judge.logprobs, "mapping": dict(mapping), **extra}


async def grade_file(
    judge: Judge,
    rubric: Rubric,
    source: Path,
    destination: Path,
    mapping: Mapping[str, str],
    on_row: Callable[[Verdict], None] | None = None,
    group_by: str | None = None,
    *,
    resume: bool = True,
) -> RunSummary:
    """Stream ``source`` through the judge into ``destination``, keeping input order.

    Workers pull rows from the reader, so memory is bounded by the concurrency, not the file;
    finished rows wait in a small reorder buffer until every earlier row is written. With
    ``resume`` (the default) an interrupted run of the same command continues where it stopped
    and a finished one is not redone; ``resume=False`` starts over.
    """
    check_columns(source, rubric, mapping)
    return await run_file(
        source, destination, RESULT_COLUMNS, RESULT_TYPES, rubric_settings(judge, rubric, mapping), judge.limiter.concurrency + 2,
        prepare=lambda row, number: _variables(row, rubric, mapping, number),
        judge_row=lambda values: judge.judge(rubric, values),
        input_error=lambda message: Verdict(status="error", error_kind="input", error=message),
        to_row=result_row, on_row=on_row, group_by=group_by, resume=resume,
    )


GRADER_COLUMNS = ["score", "status", "error_kind", "error", "parts", "metrics"]
GRADER_TYPES = {"score": "float64", "status": "string", "error_kind": "string", "error": "string", "parts": "string", "metrics": "string"}


def grader_row(row: Mapping[str, Any], grade: Grade) -> dict[str, Any]:
    """A grader's output row. Parts and metrics are one JSON column each, so every file has the
    same columns whatever a row's grader produced (a CSV header is written before the first grade)."""
    return {
        **keep_input(row, GRADER_COLUMNS),
        "score": grade.score,
        "status": "skipped" if grade.error_kind == "budget" else grade.status,
        "error_kind": grade.error_kind,
        "error": grade.error,
        "parts": {name: part.score for name, part in grade.parts.items()} or None,
        "metrics": dict(grade.metrics) or None,
    }


async def grade_file_with(
    grader: Grader,
    source: Path,
    destination: Path,
    mapping: Mapping[str, str] | None = None,
    *,
    concurrency: int = 16,
    settings: Mapping[str, Any] | None = None,
    on_row: Callable[[Grade], None] | None = None,
    group_by: str | None = None,
    resume: bool = True,
) -> RunSummary:
    """Grade every row of ``source`` with any grader (a config file's, a composite, a python one).

    ``mapping`` is {sample path: column} as for :func:`grade_frame`; unmapped columns become
    references under their own names. ``settings`` identify the grader for the checkpoint (the
    CLI passes the config file's hash): a checkpoint from other settings is not resumed.
    """
    rows = RowMapping.build(mapping, input_columns(source))

    async def run(sample: Sample) -> Grade:
        try:
            return await grader(sample)
        except Exception as e:  # a grader bug is that row's error, not the end of the run
            return Grade.failed("error", f"the grader raised {type(e).__name__}: {e}", error_kind="exception")

    return await run_file(
        source, destination, GRADER_COLUMNS, GRADER_TYPES,
        {"grader": getattr(grader, "__name__", type(grader).__name__), "mapping": dict(mapping or {}), **(settings or {})},
        concurrency,
        prepare=lambda row, number: rows.sample(row, f"{source} row {number}"),
        judge_row=run,
        input_error=lambda message: Grade.failed("error", message, error_kind="input"),
        to_row=grader_row, on_row=on_row, group_by=group_by, resume=resume,
    )


async def run_file(
    source: Path,
    destination: Path,
    result_columns: list[str],
    result_types: Mapping[str, str],
    settings: Mapping[str, Any],
    workers: int,
    *,
    prepare: Callable[[dict[str, Any], int], Any],
    judge_row: Callable[[Any], Awaitable[O]],
    input_error: Callable[[str], O],
    to_row: Callable[[dict[str, Any], O], dict[str, Any]],
    on_row: Callable[[O], None] | None = None,
    group_by: str | None = None,
    resume: bool = True,
) -> RunSummary:
    """The file loop behind ``gradekit grade``: checkpointed, ordered, one output row per input row."""
    header = input_columns(source)
    if group_by is not None and header is not None and group_by not in header:
        raise InputError(f"{source}: --group-by column {group_by!r} is not in the file; columns are {', '.join(header)}")
    checkpoint = Checkpoint(source, destination, settings)
    state = checkpoint.load() if resume else None
    if state is not None and state.get("complete"):
        summary = _Tally.restore(state["tally"]).summary(0.0)
        summary.already_complete = True
        summary.resumed_from = summary.rows
        if group_by is not None:
            summary.spread = _spread_of(written_rows(destination), group_by).report()
        return summary
    tally = _Tally.restore(state["tally"]) if state else _Tally()
    mark = state["mark"] if state else None
    writer = RowWriter(destination, columns=output_columns(header, result_columns) if header is not None else None,
                       types=column_types(source, destination, header, result_types, result_columns), resume=mark)
    done = writer.rows
    # A resumed run's spread covers the whole output: the rows written before are read back once.
    spread = (_spread_of(writer.written(), group_by) if done else SpreadTally()) if group_by is not None else None
    started = time.perf_counter()

    def emit(number: int, out_row: dict[str, Any], outcome: O) -> dict[str, Any]:
        tally.add(outcome)
        if spread is not None and outcome.status == "ok" and out_row.get(group_by) is not None:
            spread.add(group_key(out_row[group_by]), outcome.score)  # type: ignore[attr-defined]
        if on_row is not None:
            on_row(outcome)
        return to_row(out_row, outcome)

    finished = False
    try:
        await stream_in_order(source, writer, workers, prepare=prepare, judge_row=judge_row, input_error=input_error, emit=emit,
                              skip=done, on_mark=lambda at: checkpoint.save(at, tally.state()), close=False)
        finished = True
    finally:
        writer.close(complete=finished)
        if finished and tally.skipped:
            checkpoint.discard()  # rows skipped for the budget: the same command with a larger cap grades them
        elif finished:
            checkpoint.save(writer.mark_after_close(), tally.state(), complete=True)
    summary = tally.summary(time.perf_counter() - started)
    summary.resumed_from = done
    summary.spread = spread.report() if spread is not None else None
    return summary


def _spread_of(rows: Iterable[Mapping[str, Any]], group_by: str) -> SpreadTally:
    """The reward spread of rows already in an output file (CSV cells are text, hence float())."""
    spread = SpreadTally()
    for row in rows:
        if row.get("status") == "ok" and row.get(group_by) not in (None, "") and row.get("score") not in (None, ""):
            spread.add(group_key(row[group_by]), float(row["score"]))
    return spread


class _Outcome(Protocol):
    status: str
    error: str | None


O = TypeVar("O", bound=_Outcome)

MARK_EVERY_S = 0.25  # how often a checkpoint is written while rows flow (a flush and a small JSON file)


async def stream_in_order(
    source: Path,
    writer: RowWriter,
    workers: int,
    *,
    prepare: Callable[[dict[str, Any], int], Any],
    judge_row: Callable[[Any], Awaitable[O]],
    input_error: Callable[[str], O],
    emit: Callable[[int, dict[str, Any], O], dict[str, Any]],
    skip: int = 0,
    on_mark: Callable[[dict[str, Any]], None] | None = None,
    close: bool = True,
) -> None:
    """Judge every row of ``source`` and write ``emit``'s row for each, in input order.

    Workers pull rows from one shared reader, so memory is bounded by the concurrency, not the
    file; finished rows wait in a small reorder buffer until every earlier row is written. A row
    that cannot be read or lacks a variable still gets its row, from ``input_error``. ``prepare``
    turns a row (and its number) into what ``judge_row`` takes, raising RowError; the first
    ``skip`` rows are already in the output; ``on_mark`` is told each durable point reached;
    ``close=False`` leaves closing the writer to a caller that must know whether the run finished.
    """
    rows = enumerate(read_rows(source, skip=skip), start=skip + 1)
    pending: dict[int, dict[str, Any]] = {}
    next_to_write = skip + 1
    last_mark = time.monotonic()

    def write_ready() -> None:
        nonlocal next_to_write
        while next_to_write in pending:
            writer.write(pending.pop(next_to_write))
            next_to_write += 1

    def flush() -> None:
        nonlocal last_mark
        write_ready()
        if on_mark is not None and writer.due(last_mark, MARK_EVERY_S):
            on_mark(writer.mark())
            last_mark = time.monotonic()

    async def worker() -> None:
        for number, row in rows:  # a shared iterator: each row goes to exactly one worker
            out_row: dict[str, Any] = {}
            if isinstance(row, RowError):
                outcome = input_error(str(row))
            else:
                out_row = row
                try:
                    outcome = await judge_row(prepare(row, number))
                except RowError as e:
                    outcome = input_error(str(e))
                if outcome.status != "ok" and outcome.error and f"row {number}" not in outcome.error:
                    outcome.error = f"row {number}: {outcome.error}"
            pending[number] = emit(number, out_row, outcome)
            flush()

    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        write_ready()
        if close:
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
        self.prompt_tokens = self.completion_tokens = self.cache_hits = self.requests = self.skipped = 0

    def add(self, verdict: Any) -> None:
        """Count a Verdict, or a grader's Grade (no label, tokens or requests of its own)."""
        self.verdicts += 1
        label = None
        if isinstance(verdict, Grade):  # an LLM grader reports its judge's tokens as metrics, maybe per part
            for name, value in verdict.metrics.items():
                if name.endswith("judge_prompt_tokens"):
                    self.prompt_tokens += int(value)
                elif name.endswith("judge_completion_tokens"):
                    self.completion_tokens += int(value)
                elif name.endswith("judge_cached"):
                    self.cache_hits += int(value)
                elif name.endswith("judge_attempts"):
                    self.requests += int(value)
        else:
            self.prompt_tokens += verdict.prompt_tokens
            self.completion_tokens += verdict.completion_tokens
            self.requests += verdict.attempts
            self.cache_hits += verdict.cached
            label = verdict.label
        if verdict.status == "ok":
            self.ok += 1
            self.score_sum += verdict.score or 0.0
            if label is not None:
                self.labels[label] += 1
        else:
            kind = verdict.error_kind or (verdict.status if verdict.status != "error" else "unknown")
            self.kinds[kind] += 1
            skipped = verdict.status == "skipped" or verdict.error_kind == "budget"  # a grader reports a skipped judgement as an error
            self.skipped += skipped
            if len(self.examples) < 5 and not skipped:
                self.examples.append(f"{kind}: {verdict.error}")

    def state(self) -> dict[str, Any]:
        """The counts, for a checkpoint: a resumed run's summary covers the whole output."""
        return {**{k: v for k, v in vars(self).items() if k not in ("labels", "kinds")},
                "labels": dict(self.labels), "kinds": dict(self.kinds)}

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> _Tally:
        tally = cls()
        for key, value in state.items():
            setattr(tally, key, Counter(value) if key in ("labels", "kinds") else value)
        return tally

    def summary(self, wall: float) -> RunSummary:
        return RunSummary(
            rows=self.verdicts,
            ok=self.ok,
            errors=self.verdicts - self.ok - self.skipped,
            skipped=self.skipped,
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
