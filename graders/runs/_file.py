"""Grade a file of rows: every input row gets exactly one output row, in order, resumably.

A checkpoint beside the output (``<output>.checkpoint.json``) records how many rows are final;
a killed run started again with the same command truncates the output to that point, skips
those rows and goes on. Rows judged but not yet written when it died come back from the judge
cache, so no request is sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gradekit.judge import JudgeProtocol, Rubric, Usage, Verdict
from gradekit.judge._breaker import Breaker, BreakerTripped, Trip, breaker_scope
from gradekit.judge._redact import redact_url
from gradekit.judge._rubric import rubric_fingerprint

from .._atif import TrajectoryError, is_atif, trajectory_messages
from .._flags import said_as_flags
from ._rows import RowMapping
from .._sample import Grade, Grader, Sample
from ._canary import Canary
from ._checkpoint import Checkpoint
from ._drift import ServedTally, alias_note
from ._io import InputError, RowError, RowWriter, RunInput, file_format, written_rows
from ._lock import output_lock
from ._plan import Grading, O, RunOptions, RunPlan
from ._record import Money, RewardTimes, RunResults, RunStats, RunSummary, Served
from .._spread import SpreadTally

logger = logging.getLogger("gradekit.runs")

RESULT_COLUMNS = ["score", "label", "status", "error_kind", "error", "rationale", "prompt_tokens", "completion_tokens", "cached",
                  "raw_reply", "attempts", "served_model", "system_fingerprint"]
RAW_REPLY_CHARS = 2000  # an error row keeps this much of the judge's reply: enough to see why, not a whole essay
# The error kinds --retry-errors grades again: nothing about the row itself caused them.
TRANSIENT = frozenset({"server_error", "timeout", "rate_limited"})


def resolve_mapping(rubric: Rubric, pairs: Iterable[str]) -> dict[str, str]:
    """``VAR=COLUMN`` pairs -> {variable: column}; unmapped variables read the column of their own name."""
    mapping = {var: var for var in rubric.variables}
    for pair in pairs:
        var, sep, column = pair.partition("=")
        if not sep or not var or not column:
            raise InputError(f"`mapping` {pair!r}: expected VAR=COLUMN")
        if var not in rubric.variables:
            raise InputError(f"`mapping` {pair!r}: rubric {rubric.name!r} has no variable {var!r} (it has: {', '.join(rubric.variables)})")
        mapping[var] = column
    return mapping


def check_columns(source: RunInput, rubric: Rubric, mapping: Mapping[str, str]) -> None:
    """Fail before any request when a CSV header or Parquet schema lacks a column the rubric needs.

    Every missing column is named in the one message, so a user fixes them all in one run.
    """
    header = source.columns
    if header is None:
        return
    missing = {var: column for var, column in mapping.items() if rubric.variables[var].required and column not in header
               and not (rubric.variables[var].type == "trajectory" and column == var and "messages" in header)}
    if missing:
        raise InputError(f"{source}: {_lacking(missing, rubric, 'column')} not in the file; "
                         f"columns are {', '.join(header) or '(none)'}; {_map_hint(missing, header, mapping)}")


def _variables(row: Mapping[str, Any], rubric: Rubric, mapping: Mapping[str, str], number: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for var, column in mapping.items():
        if rubric.variables[var].type == "trajectory":
            try:
                found = trajectory_cell(row, var, column)
            except RowError as e:
                raise RowError(f"row {number}: {e}") from None
            if found is not None:
                values[var] = found[1]
                continue
        if column in row and row[column] is not None:
            values[var] = row[column]
        elif rubric.variables[var].required:
            missing[var] = column
    if missing:
        present = [k for k in row if row[k] is not None]
        raise RowError(f"row {number}: {_lacking(missing, rubric, 'field')} missing; {_map_hint(missing, present, mapping)}")
    return values


# Column names datasets use for a rubric variable, beyond what difflib finds close.
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "prediction": ("model_answer", "model_output", "output", "response", "completion", "answer", "generation", "pred"),
    "references": ("answer", "answers", "reference", "gold", "gold_answer", "target", "label", "ground_truth", "expected"),
    "question": ("prompt", "query", "input", "instruction", "problem"),
    "response": ("output", "completion", "model_answer", "answer", "prediction"),
}


def trajectory_cell(row: Mapping[str, Any], var: str, column: str) -> tuple[str, list[dict[str, Any]]] | None:
    """A trajectory variable's value as chat messages: its column, else (unmapped) a ``messages`` column or the
    row itself when the row is an ATIF document; None when the row has none. An unreadable one is the row's
    error, naming the field at fault (RowError)."""
    if row.get(column) is not None:
        where, value = column, row[column]
    elif column == var and row.get("messages") is not None:
        where, value = "messages", row["messages"]
    elif column == var and is_atif(row):
        where, value = "the row (an ATIF document)", row
    else:
        return None
    try:
        return where, trajectory_messages(value)
    except TrajectoryError as e:
        raise RowError(f"{where}: not a trajectory: {e}") from None


def _lacking(missing: Mapping[str, str], rubric: Rubric, what: str) -> str:
    """The subject of the message: which columns (or fields) and their variables, with the verb."""
    if len(missing) == 1:
        var, column = next(iter(missing.items()))
        return f"{what} {column!r} (variable {var!r} of rubric {rubric.name!r}) is"
    named = ", ".join(repr(c) if c == v else f"{c!r} for variable {v!r}" for v, c in missing.items())
    return f"{len(missing)} {what}s of rubric {rubric.name!r} ({named}) are"


def _map_hint(missing: Mapping[str, str], columns: Iterable[str], mapping: Mapping[str, str]) -> str:
    """``--map VAR=COLUMN`` for each missing variable, with a guessed COLUMN where one is close."""
    import difflib

    free = [c for c in columns if c not in mapping.values()]  # a column already read for another variable is no guess
    hints = []
    for var in missing:
        guess = next((c for c in _SYNONYMS.get(var, ()) if c in free), None)
        if guess is None:
            close = difflib.get_close_matches(var, free, n=1, cutoff=0.6)
            guess = close[0] if close else None
        if guess is not None:
            free.remove(guess)
        hints.append(f"`mapping` {var}={guess or 'COLUMN'}")
    return f"map {'it' if len(hints) == 1 else 'them'} with {' '.join(hints)}"


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
        "error": said_as_flags(verdict.error),  # an output file is the command line's: a spec field is said as its flag
        "rationale": verdict.rationale,
        "prompt_tokens": verdict.usage.prompt_tokens,
        "completion_tokens": verdict.usage.completion_tokens,
        "cached": verdict.cached,
        # Why a row failed: what the judge said and how often it was asked. On failed rows only, so an
        # ok row reads the same whether it came from the judge or the cache (ok rows have their rationale).
        "raw_reply": failed_reply(verdict),
        "attempts": verdict.usage.requests if verdict.status != "ok" else None,
        # Who answered, as the provider says (docs/align.md#drift-seen): how a judge that changed mid-run shows.
        "served_model": verdict.read.served_model,
        "system_fingerprint": verdict.read.system_fingerprint,
    }


def failed_reply(verdict: Verdict | None) -> str | None:
    """The judge's reply when the verdict failed (parse failure, truncation, refusal), cut to RAW_REPLY_CHARS.

    An ok verdict's reply is its label and rationale already, and an ok row must read the same
    whether it came from the judge or the cache: only failures keep it, which also keeps files small.
    """
    return verdict.raw[:RAW_REPLY_CHARS] if verdict is not None and verdict.status != "ok" and verdict.raw else None


RESULT_TYPES = {"score": "float64", "label": "string", "status": "string", "error_kind": "string", "error": "string",
                "rationale": "string", "prompt_tokens": "int64", "completion_tokens": "int64", "cached": "bool",
                "raw_reply": "string", "attempts": "int64", "served_model": "string", "system_fingerprint": "string"}
# The columns a Jury (agreement, jurors) or a Cascade (decided_by, confidence) adds: its ``panel_columns``.
PANEL_TYPES = {"agreement": "float64", "jurors": "string", "decided_by": "string", "confidence": "float64"}


def panel_cells(verdict: Verdict, columns: Iterable[str]) -> dict[str, Any]:
    """A Jury's or a Cascade's own cells, from its ``panel``; ``jurors`` as a JSON list (one cell in every format)."""
    cells: dict[str, Any] = {}
    panel = verdict.panel.model_dump() if verdict.panel is not None else {}
    for column in columns:
        value = panel.get(column)
        if column == "jurors" and value is not None:  # each juror's error, as the error column says it: in flags
            value = json.dumps([{**j, "error": said_as_flags(j["error"])} if j.get("error") else j for j in value], ensure_ascii=False)
        cells[column] = value
    return cells


def column_types(source: RunInput, destination: Path, header: list[str] | None, result_types: Mapping[str, str],
                 result_columns: list[str]) -> dict[str, Any]:
    """Arrow types for a Parquet output: the input's own schema, and fixed types for the results."""
    if file_format(destination) != "parquet":
        return {}
    import pyarrow as pa

    types: dict[str, Any] = {name: pa.type_for_alias(alias) for name, alias in result_types.items()}
    kind = source.format
    if kind == "parquet":
        for field in source.schema:
            types[f"input_{field.name}" if field.name in result_columns else field.name] = field.type
    elif kind == "csv":
        for name in header or []:
            types.setdefault(f"input_{name}" if name in result_columns else name, pa.string())
    return types


def rubric_settings(judge: JudgeProtocol, rubric: Rubric, mapping: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    """What decides a rubric run's output rows: a checkpoint from other settings is not resumed."""
    who = judge.identity()
    return {"rubric": rubric_fingerprint(rubric), "model": who.model, "base_url": redact_url(who.base_url), "sampling": who.sampling,
            "logprobs": who.logprobs, "mapping": dict(mapping), **extra}


async def grade_file(
    judge: JudgeProtocol,
    rubric: Rubric,
    source: Path | RunInput,
    destination: Path,
    mapping: Mapping[str, str],
    on_row: Callable[[Verdict], None] | None = None,
    group_by: str | None = None,
    *,
    resume: bool = True,
    keep_going: bool = False,
    retry_errors: bool = False,
    encoding: str | None = None,
    keep_reasoning: bool = False,
    canary: Canary | None = None,
) -> RunSummary:
    """Stream ``source`` through the judge into ``destination``, keeping input order.

    Workers pull rows from the reader, so memory is bounded by the concurrency, not the file;
    finished rows wait in a small reorder buffer until every earlier row is written. With
    ``resume`` (the default) an interrupted run of the same command continues where it stopped
    and a finished one is not redone; ``resume=False`` starts over. ``encoding`` reads a CSV or
    JSONL input in another encoding than UTF-8.


    A broken judge (dead endpoint, wrong key or model) stops the run early with
    :class:`~judge._breaker.BreakerTripped` unless ``keep_going``; ``retry_errors`` grades again
    the rows an earlier run left with a transient error. See :func:`run_file`. ``source`` may be
    a :class:`RunInput` the caller resolved already. A ``canary`` (:mod:`gradekit.graders.runs._canary`)
    is judged before the run and again as it goes; a judge that changed stops it (or, ``on_drift="flag"``,
    its later rows get ``drift = true``), and after a change rows are judged by the canary's judge,
    which reads no cache.
    """
    source = RunInput.resolve(source, encoding)  # the run's door: past it the input is this RunInput
    check_columns(source, rubric, mapping)
    extra: dict[str, Any] = {"encoding": encoding} if encoding else {}
    columns, types, to_row = RESULT_COLUMNS, RESULT_TYPES, result_row
    if keep_reasoning:  # the judge's thinking, for reading next to the verdict; never parsed
        extra["keep_reasoning"] = True
        columns, types = [*RESULT_COLUMNS, "reasoning"], {**RESULT_TYPES, "reasoning": "string"}
        to_row = lambda row, verdict: {**result_row(row, verdict), "reasoning": verdict.reasoning}  # noqa: E731
    panel = [c for c in judge.panel_columns if c in PANEL_TYPES]  # a Jury's or a Cascade's columns
    if panel:
        plain = to_row
        columns, types = [*columns, *panel], {**types, **{c: PANEL_TYPES[c] for c in panel}}
        to_row = lambda row, verdict: {**plain(row, verdict), **panel_cells(verdict, panel)}  # noqa: E731
    if rubric.is_checklist:
        columns, types, to_row = _checklist_output(rubric, destination, columns, types, to_row)
    if rubric.trajectory_variables:  # what the judge saw of each row's trajectory (and each step's score)
        extra_cells = ["trajectory_coverage", *(["step_scores"] if rubric.granularity == "step" else [])]
        inner = to_row
        columns, types = [*columns, *extra_cells], {**types, **{c: "string" for c in extra_cells}}
        to_row = lambda row, verdict: {**inner(row, verdict), **trajectory_cells(verdict, extra_cells)}  # noqa: E731
    def asked(values: dict[str, Any]) -> Awaitable[Verdict]:
        # After a change the canary saw, no cached verdict (the old judge's) is read: its judge has no cache.
        who = canary.fresh if canary is not None and canary.after_change else judge
        return who.judge(rubric, values)

    grading = Grading(
        columns, types, rubric_settings(judge, rubric, mapping, **extra), judge.concurrency + 2,
        prepare=lambda row, number: _variables(row, rubric, mapping, number),
        judge_row=(lambda values: _invalid_as_error(rubric, asked(values))) if rubric.invalid_labels else asked,
        input_error=verdict_input_error, to_row=to_row,
    )
    options = RunOptions(resume=resume, keep_going=keep_going, retry_errors=retry_errors, group_by=group_by)
    return await run_file(RunPlan(source, destination, grading, options, on_row=on_row, canary=canary))


def trajectory_cells(verdict: Verdict, columns: Iterable[str]) -> dict[str, Any]:
    """``trajectory_coverage`` (steps and tokens shown of the total, the strategy) and ``step_scores`` (each
    assistant step's score, None for a step that failed) of a verdict; None when it has none."""
    cells: dict[str, Any] = {}
    if "trajectory_coverage" in columns:
        cells["trajectory_coverage"] = verdict.coverage.model_dump(exclude_none=True) if verdict.coverage is not None else None
    if "step_scores" in columns:
        cells["step_scores"] = [s.score for s in verdict.steps] if verdict.steps is not None else None
    return cells


def verdict_input_error(message: str) -> Verdict:
    """A rubric run's row that cannot be graded (unreadable, or lacking a variable): an error row of kind input."""
    return Verdict(status="error", error_kind="input", error=message)


def _checklist_output(rubric: Rubric, destination: Path, columns: list[str], types: dict[str, str],
                      to_row: Callable[[Mapping[str, Any], Verdict], dict[str, Any]]) -> tuple[list[str], dict[str, str], Any]:
    """A checklist run's extra columns: criteria_read, criteria_total, checklist (JSON), and
    ``criteria.<id>.label`` / ``.score`` per criterion. Per-row criteria have no fixed ids, so their
    flat columns are written where rows may differ in columns (JSONL); CSV and Parquet keep the JSON."""
    from .._checklist import CHECKLIST_TYPES, checklist_cells, criterion_columns

    fixed = rubric.criteria
    flat_types = criterion_columns(c.id for c in fixed) if fixed is not None else {}
    flat = fixed is not None or file_format(destination) == "jsonl"
    total = len(fixed) if fixed is not None else None
    columns = [*columns, *CHECKLIST_TYPES, *flat_types]
    types = {**types, **CHECKLIST_TYPES, **flat_types}
    inner = to_row
    return columns, types, lambda row, verdict: {**inner(row, verdict), **checklist_cells(verdict.criteria, total=total, flat=flat)}


async def _invalid_as_error(rubric: Rubric, pending: Awaitable[Verdict]) -> Verdict:
    """A verdict naming one of the rubric's ``invalid_labels`` as the row it is in a rubric run: not a score.

    A rubric run's rows are verdicts, whose failures are ``status=error`` (a row that lacks a
    variable is ``error``/``input`` there too); a grader makes the same verdict ``status=invalid``.
    """
    verdict = await pending
    if verdict.status != "ok" or not rubric.is_invalid(verdict.label):
        return verdict
    return verdict.model_copy(update={"status": "error", "score": None, "error_kind": "judged_invalid",
                                      "error": f"the judge labelled the sample {verdict.label!r}, which rubric {rubric.name!r} names invalid"})


GRADER_COLUMNS = ["score", "status", "error_kind", "error", "parts", "metrics", "attempts"]
GRADER_TYPES = {"score": "float64", "status": "string", "error_kind": "string", "error": "string", "parts": "string", "metrics": "string",
                "attempts": "int64"}


def grader_row(row: Mapping[str, Any], grade: Grade, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """A grader's output row. Parts and metrics are one JSON column each, so every file has the
    same columns whatever a row's grader produced (a CSV header is written before the first grade).
    ``extra``: the columns the grader declares (``output_columns``), filled from ``grade.columns``."""
    return {
        **keep_input(row, [*GRADER_COLUMNS, *extra]),
        "score": grade.score,
        "status": "skipped" if grade.error_kind == "budget" else grade.status,
        "error_kind": grade.error_kind,
        "error": said_as_flags(grade.error),
        "parts": {name: part.score for name, part in grade.parts.items()} or None,
        "metrics": dict(grade.metrics) or None,
        # Requests the grader's judges sent for a failed row (None: no judge was asked, or the row is ok).
        "attempts": grade.usage.requests if grade.status != "ok" and grade.usage is not None else None,
        **{column: grade.columns.get(column) for column in extra},
    }


def grader_columns(grader: Any) -> tuple[str, ...]:
    """The extra output columns a grader declares (``output_columns``: math_equivalence's ``parsed``)."""
    return tuple(c for c in getattr(grader, "output_columns", ()) if c not in GRADER_COLUMNS)


async def grade_file_with(
    grader: Grader,
    source: Path | RunInput,
    destination: Path,
    mapping: Mapping[str, str] | None = None,
    *,
    concurrency: int = 16,
    settings: Mapping[str, Any] | None = None,
    on_row: Callable[[Grade], None] | None = None,
    group_by: str | None = None,
    resume: bool = True,
    keep_going: bool = False,
    retry_errors: bool = False,
    encoding: str | None = None,
) -> RunSummary:
    """Grade every row of ``source`` with any grader (a config file's, a composite, a python one).

    ``mapping`` is {sample path: column} as for :func:`grade_frame`; unmapped columns become
    references under their own names. ``settings`` identify the grader for the checkpoint (the
    CLI passes the config file's hash): a checkpoint from other settings is not resumed.
    The judges of the grader's LLM nodes report to the run's circuit breaker as in
    :func:`grade_file`; ``keep_going`` and ``retry_errors`` are as there.
    """
    source = RunInput.resolve(source, encoding)  # the run's door: past it the input is this RunInput
    extra = grader_columns(grader)

    async def run(sample: Sample) -> Grade:
        try:
            return await grader(sample)
        except Exception as e:  # a grader bug is that row's error, not the end of the run
            return Grade.failed("error", f"the grader raised {type(e).__name__}: {e}", error_kind="exception")

    settings = {"grader": getattr(grader, "__name__", type(grader).__name__), "mapping": dict(mapping or {}), **(settings or {}),
                **({"encoding": encoding} if encoding else {})}
    grading = grader_grading(source, mapping, settings, concurrency, run, extra)
    options = RunOptions(resume=resume, keep_going=keep_going, retry_errors=retry_errors, group_by=group_by)
    return await run_file(RunPlan(source, destination, grading, options, on_row=on_row))


def grader_grading(source: RunInput, mapping: Mapping[str, str] | None, settings: Mapping[str, Any], workers: int,
                   judge_row: Callable[[Sample], Awaitable[Grade]], extra: tuple[str, ...] = ()) -> Grading[Grade]:
    """A grader run's rows: samples by ``mapping`` (see :class:`RowMapping`), grades as rows with the grader's columns."""
    rows = RowMapping.build(mapping, source.columns)
    return Grading(
        [*GRADER_COLUMNS, *extra], {**GRADER_TYPES, **{c: "string" for c in extra}}, settings, workers,
        prepare=lambda row, number: rows.sample(row, f"{source} row {number}"),
        judge_row=judge_row,
        input_error=lambda message: Grade.failed("error", message, error_kind="input"),
        to_row=lambda row, grade: grader_row(row, grade, extra),
    )


async def run_file(plan: RunPlan[Any], *, lock: bool = True) -> RunSummary:
    """The file loop behind ``gradekit grade``: checkpointed, ordered, one output row per input row.

    Unless ``plan.options.keep_going``, the run has a circuit breaker (:mod:`gradekit.judge._breaker`): once
    the judge is seen to be broken it stops, the output ends before the first row that failed for
    it, the checkpoint is saved and :class:`BreakerTripped` is raised, so the same call resumes once
    the judge is fixed. ``retry_errors`` grades again, in place, the rows of an earlier run's output
    (finished or not) that failed for a transient reason, and keeps every other row as it is.

    It holds the output's lock (see :func:`output_lock`) unless ``lock=False`` says the caller
    already does (the Batch API run holds it from its first upload).
    """
    with output_lock(plan.input, plan.output) if lock else contextlib.nullcontext():
        return await _run_locked(plan)


async def _run_locked(plan: RunPlan[Any]) -> RunSummary:
    source, destination, grading, options = plan.input, plan.output, plan.grading, plan.options
    settings, result_columns, result_types, to_row, on_row = grading.settings, grading.columns, grading.types, grading.to_row, plan.on_row
    group_by, resume, keep_going, retry_errors = options.group_by, options.resume, options.keep_going, options.retry_errors
    header = source.columns
    if group_by is not None and header is not None and group_by not in header:
        raise InputError(f"{source}: `group_by` column {group_by!r} is not in the file; columns are {', '.join(header)}")
    checkpoint = Checkpoint(source, destination, settings)
    state = checkpoint.load() if resume or retry_errors else None
    warnings = [checkpoint.warning] if (resume or retry_errors) and checkpoint.warning else []
    # A data file with a checkpoint (or lock, or parts) beside it is an earlier output, not input: say so, it may be neither.
    mine = {destination.resolve(), _retry_path(destination).resolve()}
    outputs = [f for f in source.skipped if f.resolve() not in mine]
    if outputs:
        names = ", ".join(str(f.relative_to(source.source)) for f in outputs[:10]) + (", ..." if len(outputs) > 10 else "")
        warnings.insert(0, f"{source}: skipped {len(outputs)} file(s) that are earlier gradekit outputs (a .checkpoint.json, "
                           f".lock or .parts beside them): {names}; move them out of the folder, or delete that file, to grade them")
    if source.ignored:  # a folder of ATIF trajectories: its other JSON files are not rows, and the run says which
        names = ", ".join(str(f.relative_to(source.source)) for f in source.ignored[:10]) + (", ..." if len(source.ignored) > 10 else "")
        warnings.append(f"{source}: read {len(source.files)} ATIF trajectory file(s); {len(source.ignored)} other .json file(s) "
                        f"are not ATIF trajectories (no schema_version ATIF-v1.x) and were not read: {names}")
    for warning in warnings:
        logger.warning("warning: %s", warning)
    previous: Iterator[dict[str, Any]] | None = None
    if retry_errors:
        # An empty output is this run's own placeholder (created to lock its inode), not an earlier run's rows.
        written = destination.exists() and destination.stat().st_size > 0
        if state is None and (written or checkpoint.path.exists()):
            raise InputError(f"`retry_errors`: {destination} has no checkpoint from an earlier run of this command (same input "
                             "and settings), so its rows cannot be matched to the input; run without `retry_errors`")
        if state is not None:
            previous = _previous_rows(destination, state)
    if previous is None and state is not None and state.get("complete"):
        summary = _Tally.restore(state["tally"]).summary(0.0)
        summary.already_complete = True
        summary.resumed_from = summary.results.rows
        if group_by is not None:
            summary.results.spread = _spread_of(written_rows(destination), group_by).report()
        return summary
    tally = _Tally.restore(state["tally"]) if state and previous is None else _Tally()
    mark = state["mark"] if state and previous is None else None
    # --retry-errors writes a new copy beside the output and swaps it in when done: the earlier
    # output is read while the new one is written, and stays whole if this run stops.
    target = _retry_path(destination) if previous is not None else destination
    # The run's judge, named by its settings from the start: a trip before any request reached the wire (a parameter
    # the dialect already refuses) still says which judge it is.
    breaker = None if keep_going else Breaker(endpoint=(settings.get("base_url"), settings.get("model")))
    canary = plan.canary
    if canary is not None:  # rows get a drift cell: true when judged after the judge changed (on_drift flag)
        to_row = _with_drift(to_row, canary)
        result_columns, result_types = [*result_columns, "drift"], {**result_types, "drift": "bool"}
        # Before any row: the start's check, or a resumed run's check against the start it saved (a change seen: exit 3).
        with breaker_scope(breaker):
            await canary.start(state.get("canary") if state else None)
        if canary.stopping:
            summary = _Tally.restore(state["tally"]).summary(0.0) if state else _Tally().summary(0.0)
            summary.stats.canary = canary.report()
            raise BreakerTripped(canary.trip(), canary.message(f"{destination} was left as it was"), summary)
    try:
        writer = RowWriter(target, columns=output_columns(header, result_columns) if header is not None else None,
                           types=column_types(source, destination, header, result_types, result_columns), resume=mark)
    except OSError as e:  # a read-only file or folder, a full disk: before any request
        raise InputError(f"cannot write {target}: {e.strerror or e}") from e
    done = writer.rows
    # A resumed run's spread covers the whole output: the rows written before are read back once.
    spread = (_spread_of(writer.written(), group_by) if done else SpreadTally()) if group_by is not None else None
    started = time.perf_counter()
    timed = _RowTimes()
    timed_plan = plan.judged_by(timed.wrap(grading.judge_row))

    def emit(number: int, out_row: dict[str, Any], outcome: O) -> dict[str, Any]:
        timed.emitted(number, out_row, outcome)
        tally.add(outcome)
        if spread is not None and outcome.status == "ok" and out_row.get(group_by) is not None:
            spread.add(group_key(out_row[group_by]), outcome.score)  # type: ignore[attr-defined]
        if on_row is not None:
            on_row(outcome)
        return to_row(out_row, outcome, number) if canary is not None else to_row(out_row, outcome)

    def reuse(old: dict[str, Any]) -> dict[str, Any] | None:
        if old.get("status") == "error" and old.get("error_kind") in TRANSIENT:
            return None  # graded again
        tally.add_written(old)
        if spread is not None and old.get("status") == "ok" and old.get(group_by) not in (None, "") and old.get("score") not in (None, ""):
            spread.add(group_key(old[group_by]), float(old["score"]))
        if on_row is not None:
            on_row(_Written(old))
        return old

    trip: Trip | None = None
    finished = False
    saved: list[Mapping[str, Any] | None] = [mark]  # the last mark a checkpoint holds: where the output is whole

    def save_mark(at: Mapping[str, Any]) -> None:
        checkpoint.save(at, tally.state(), canary=canary.state() if canary is not None else None)
        saved[0] = at

    try:
        try:
            with breaker_scope(breaker):
                trip = await stream_in_order(
                    timed_plan, writer, emit, skip=done, on_mark=save_mark if previous is None else None, close=False,
                    breaker=breaker, previous=previous, reuse=reuse, canary=canary)
            finished = trip is None
        finally:
            if previous is None and not finished and trip is not None:
                save_mark(writer.mark())  # the output ends before the rows the broken judge failed
            writer.close(complete=finished)
            if previous is not None and not finished:
                _remove_output(target)  # the earlier output and its checkpoint stay as they were
            elif previous is not None:
                os.replace(target, destination)
                _remove_output(destination, parts_only=True)
            if finished and tally.skipped:
                checkpoint.discard()  # rows skipped for the budget: the same command with a larger cap grades them
            elif finished:
                checkpoint.save(writer.mark_after_close() if previous is None else _mark_of(destination, writer.rows),
                                tally.state(), complete=True, canary=canary.state() if canary is not None else None)
    except OSError as e:
        if not _disk_full(e):
            raise
        raise _stop_disk_full(e, writer, destination, checkpoint, saved[0], previous is not None) from None
    summary = tally.summary(time.perf_counter() - started)
    stats = summary.stats
    stats.served.note = alias_note(settings.get("model"), stats.served.groups, summary.results.rows, stats.wall_s)
    stats.canary = canary.report() if canary is not None else None
    stats.reward_times = timed.report()
    summary.resumed_from = done
    summary.results.spread = spread.report() if spread is not None else None
    summary.warnings = warnings
    if trip is not None:
        kept = writer.rows if previous is None else 0
        where = (f"{destination} holds the first {kept} rows and its checkpoint is saved" if previous is None
                 else f"{destination} was left as it was")
        if canary is not None and trip.kind == "drift":
            raise BreakerTripped(trip, canary.message(where), summary)
        raise BreakerTripped(trip, f"{trip.describe()}. Stopped early: {where}; fix it and run the same command again "
                                   "to resume (`keep_going` turns this check off).", summary)
    return summary


def _with_drift(to_row: Callable[..., dict[str, Any]], canary: Canary) -> Callable[..., dict[str, Any]]:
    """The output row with its ``drift`` cell, from the canary (told the row's number as the row is written)."""
    def row(out_row: dict[str, Any], outcome: Any, number: int) -> dict[str, Any]:
        return {**to_row(out_row, outcome), "drift": canary.drifted(number)}

    return row


def _disk_full(error: OSError) -> bool:
    """A write failed for want of room: a full device, a quota, or a file size limit (Arrow says it in words)."""
    import errno

    return error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or any(
        words in str(error) for words in ("No space left", "Disk quota exceeded", "File too large"))


def _stop_disk_full(error: OSError, writer: RowWriter, destination: Path, checkpoint: Checkpoint, mark: Mapping[str, Any] | None,
                    retrying: bool) -> InputError:
    """Cut the output back to the last whole row its checkpoint holds, so the same command resumes once there is room."""
    import contextlib

    target = writer.path
    reason = error.strerror or str(error)
    # Closed first, whatever its buffer still holds: a later flush (at exit, once the cut frees room) must not write past the cut.
    with contextlib.suppress(OSError):
        writer.close(complete=False)
    with contextlib.suppress(OSError):
        checkpoint.path.with_name(checkpoint.path.name + ".tmp").unlink(missing_ok=True)
    for stale in (target.with_name(target.name + ".tmp"), *target.with_name(target.name + ".parts").glob("*.tmp")):
        with contextlib.suppress(OSError):
            stale.unlink(missing_ok=True)
    if retrying:
        _remove_output(target)
        return InputError(f"cannot write {target}: {reason}. {destination} was left as it was; make room on the device "
                          "and run the same command again")
    rows = int(mark["rows"]) if mark else 0
    if file_format(target) != "parquet":
        with contextlib.suppress(OSError):
            os.truncate(target, int(mark["offset"]) if mark else 0)  # the rows after it come back from the cache
    return InputError(f"cannot write {destination}: {reason}. It ends at its last whole row ({rows} rows) and its checkpoint "
                      "is saved; make room on the device and run the same command again to resume")


class _Written:
    """A row kept from an earlier output (``--retry-errors``), as ``on_row`` sees it."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        self.status = str(row.get("status") or "")
        self.error_kind = row.get("error_kind") or None
        self.error = row.get("error") or None


def _retry_path(destination: Path) -> Path:
    return destination.with_name(f"{destination.stem}.retrying{destination.suffix}")


def _remove_output(path: Path, parts_only: bool = False) -> None:
    """Remove an output and a Parquet run's part folder (only the folder with ``parts_only``)."""
    import shutil

    if not parts_only:
        path.unlink(missing_ok=True)
    shutil.rmtree(path.with_name(path.name + ".parts"), ignore_errors=True)


def _mark_of(path: Path, rows: int) -> dict[str, Any]:
    return {"rows": rows} if file_format(path) == "parquet" else {"rows": rows, "offset": path.stat().st_size}


def _previous_rows(destination: Path, state: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The rows an earlier run wrote to ``destination`` and its checkpoint vouches for, in order."""
    mark = state.get("mark") or {}
    rows = int(mark.get("rows", 0))
    if file_format(destination) == "parquet" and not state.get("complete"):
        import pyarrow.parquet as pq

        parts = destination.with_name(destination.name + ".parts")

        def read_parts() -> Iterator[dict[str, Any]]:
            for number in range(int(mark.get("parts", 0))):
                yield from pq.read_table(parts / f"part-{number:05d}.parquet").to_pylist()

        return itertools.islice(read_parts(), rows)
    return itertools.islice(written_rows(destination), rows)


def _spread_of(rows: Iterable[Mapping[str, Any]], group_by: str) -> SpreadTally:
    """The reward spread of rows already in an output file (CSV cells are text, hence float())."""
    spread = SpreadTally()
    for row in rows:
        if row.get("status") == "ok" and row.get(group_by) not in (None, "") and row.get("score") not in (None, ""):
            spread.add(group_key(row[group_by]), float(row["score"]))
    return spread


MARK_EVERY_S = 0.25  # how often a checkpoint is written while rows flow (a flush and a small JSON file)
# Rows finished after an error row that waits for the breaker's verdict, at most: past this the
# held rows are written anyway, so memory stays bounded when a provider never answers well again.
HOLD_ROWS = 10_000


async def stream_in_order(
    plan: RunPlan[O],
    writer: RowWriter,
    emit: Callable[[int, dict[str, Any], O], dict[str, Any]],
    *,
    skip: int = 0,
    on_mark: Callable[[dict[str, Any]], None] | None = None,
    close: bool = True,
    breaker: Breaker | None = None,
    previous: Iterator[dict[str, Any]] | None = None,
    reuse: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    canary: Canary | None = None,
) -> Trip | None:
    """Judge every row of the plan's input and write ``emit``'s row for each, in input order.

    The plan's ``workers`` pull rows from one shared reader, so memory is bounded by the
    concurrency, not the file; finished rows wait in a small reorder buffer until every earlier row
    is written. A row that cannot be read or lacks a variable still gets its row, from the plan's
    ``input_error``; the first ``skip`` rows are already in the output; ``on_mark`` is told each durable point reached;
    ``close=False`` leaves closing the writer to a caller that must know whether the run finished.
    ``emit`` is called as each row is written, in input order, so whatever it counts at a mark
    is exactly the rows written: a resumed run's summary counts each output row once.

    With a ``breaker``, a row that failed the way a broken judge fails is not written until the
    judge has answered well after it (or the run ends); once the breaker trips no row is started,
    the rows in flight finish, the output ends before the first such row, and the trip is returned.
    ``previous`` (an earlier output's rows, in order) and ``reuse`` (the row to keep, or None to
    judge it again) make a run that keeps some of an earlier output's rows. With a ``canary``, a
    row waits until a check after it passes (:meth:`Canary.holds`); on drift with ``on_drift="stop"``
    no row is started, the output ends before the first row not vouched for, and the trip is returned.
    """
    grading = plan.grading
    prepare, judge_row, input_error = grading.prepare, grading.judge_row, grading.input_error
    rows = enumerate(plan.reader(plan.input, skip), start=skip + 1)
    pending: dict[int, tuple[dict[str, Any], Any, int]] = {}  # number -> (row, outcome, breaker successes when it finished)
    kept: dict[int, dict[str, Any]] = {}
    next_to_write = skip + 1
    last_mark = time.monotonic()
    stopped = False  # the breaker tripped: nothing more is written

    def held(outcome: Any, seen: int) -> bool:
        return (breaker is not None and outcome.status == "error" and breaker.holds(outcome.error_kind)
                and breaker.successes <= seen and len(pending) < HOLD_ROWS)

    def write_ready(until: int | None = None, hold: bool = True) -> None:
        nonlocal next_to_write
        while not stopped and (until is None or next_to_write < until):
            if next_to_write in kept:
                writer.write(kept.pop(next_to_write))
            elif next_to_write in pending:
                out_row, outcome, seen = pending[next_to_write]
                if hold and held(outcome, seen):
                    return  # maybe the first row of an outage: it waits for a good answer after it, or the run's end
                if canary is not None and canary.holds(next_to_write):
                    return  # no canary check after it has passed yet (or, the judge changed, it is cut)
                del pending[next_to_write]
                writer.write(emit(next_to_write, out_row, outcome))
            else:
                return
            next_to_write += 1

    def flush() -> None:
        nonlocal last_mark
        write_ready()
        if on_mark is not None and writer.due(last_mark, MARK_EVERY_S):
            on_mark(writer.mark())
            last_mark = time.monotonic()

    async def worker() -> None:
        while (breaker is None or breaker.tripped is None) and (canary is None or not canary.stopping):
            try:
                number, row = next(rows)  # a shared iterator: each row goes to exactly one worker
                old = next(previous, None) if previous is not None else None
            except StopIteration:
                return
            if old is not None and reuse is not None and (keep := reuse(old)) is not None:
                kept[number] = keep
                flush()
                continue
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
                if breaker is not None and getattr(outcome, "error_kind", None) not in ("input", "budget"):
                    breaker.row(outcome.status, getattr(outcome, "error_kind", None), outcome.error, getattr(outcome, "raw", None))
            if canary is not None:
                canary.finished(number, outcome)
            pending[number] = (out_row, outcome, breaker.successes if breaker is not None else 0)
            flush()

    ticker = asyncio.ensure_future(canary.ticker()) if canary is not None else None
    if canary is not None:
        canary.wake = flush
    try:
        await asyncio.gather(*(worker() for _ in range(grading.workers)))
        if canary is not None and not canary.stopping and (breaker is None or breaker.tripped is None):
            await canary.final()  # the tail of the run is vouched for, flagged or cut like the rest
        trip = breaker.tripped if breaker is not None else None
        if trip is None and canary is not None and canary.stopping:
            write_ready(hold=False)  # the rows vouched for; the output ends at the first row judged after the last check passed
            stopped = True
            return canary.trip()
        if trip is not None:
            assert breaker is not None
            failed = [n for n, (_, outcome, _) in pending.items() if outcome.status == "error" and breaker.cuts(outcome.error_kind)]
            write_ready(until=min(failed) if failed else None, hold=False)
            stopped = True
        else:
            write_ready(hold=False)  # the run is over: rows held for the breaker's verdict are final
        return trip
    finally:
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        if canary is not None:
            canary.wake = None
            await canary.aclose()
        write_ready()
        if close:
            writer.close()


def group_key(value: Any) -> Any:
    """A hashable key for a --group-by cell (JSONL cells may be lists or objects)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if isinstance(value, (list, dict)) else value


class _RowTimes:
    """How long each row's grading took (from the call to its outcome), keyed to the row when it is written."""

    SLOWEST = 10

    def __init__(self) -> None:
        self._pending: dict[int, float] = {}
        self.seconds: list[float] = []
        self.slowest: list[tuple[float, int, Any]] = []

    def wrap(self, judge_row: Callable[[Any], Awaitable[O]]) -> Callable[[Any], Awaitable[O]]:
        async def timed(values: Any) -> O:
            began = time.perf_counter()
            outcome = await judge_row(values)
            self._pending[id(outcome)] = time.perf_counter() - began
            return outcome

        return timed

    def emitted(self, number: int, out_row: Mapping[str, Any], outcome: Any) -> None:
        seconds = self._pending.pop(id(outcome), None)
        if seconds is None:
            return  # an input error: nothing was graded
        self.seconds.append(seconds)
        self.slowest.append((seconds, number, out_row.get("id")))
        if len(self.slowest) > 4 * self.SLOWEST:
            self.slowest = sorted(self.slowest, key=lambda t: -t[0])[: self.SLOWEST]

    def report(self) -> RewardTimes:
        if not self.seconds:
            return RewardTimes()
        ordered = sorted(self.seconds)
        return RewardTimes(p50=round(ordered[min(len(ordered) - 1, int(0.5 * len(ordered)))], 4),
                           p99=round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
                           slowest_rows=[{"row": n, "id": row_id, "seconds": round(s, 4)}
                                         for s, n, row_id in sorted(self.slowest, key=lambda t: -t[0])[: self.SLOWEST]])


class _Tally:
    def __init__(self) -> None:
        self.verdicts = 0
        self.ok = 0
        self.score_sum = 0.0
        self.labels: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.examples: list[str] = []
        self.prompt_tokens = self.completion_tokens = self.cache_hits = self.requests = self.skipped = 0
        self.reasoning_tokens = self.cached_tokens = self.cache_write_tokens = 0
        self.flex: Counter[str] = Counter()
        self.abstained = 0
        self.decided: Counter[str] = Counter()
        self.agreement_sum = 0.0
        self.agreement_n = 0
        self.hybrid = False  # a hybrid grader's run: judge_calls_saved is reported
        self.saved = 0
        self.served = ServedTally()

    def _panel(self, decided_by: Any, agreement: Any) -> None:
        if decided_by not in (None, ""):
            self.decided[str(decided_by)] += 1
        try:
            value = float(agreement) if agreement not in (None, "") else None
        except (TypeError, ValueError):
            value = None
        if value is not None and value == value:
            self.agreement_sum += value
            self.agreement_n += 1

    def _usage(self, usage: Usage, cache_hits: int) -> None:
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.cached_tokens += usage.cached_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        for part in ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens", "reasoning_tokens"):
            if getattr(usage, f"flex_{part}"):
                self.flex[part] += getattr(usage, f"flex_{part}")
        self.requests += usage.requests
        self.cache_hits += cache_hits

    def _hybrid(self, decided_by: str) -> None:
        """A hybrid grade: the path that decided it, and the two judge calls a symbolic decision made needless."""
        self.hybrid = True
        self.decided[decided_by] += 1
        self.saved += 2 * (decided_by == "symbolic")

    def add(self, verdict: Any) -> None:
        """Count a Verdict, or a grader's Grade (its usage is its judges', a composite's summed over its parts)."""
        self.verdicts += 1
        read = getattr(verdict, "read", None)  # a Verdict's; a grader's Grade names no served judge
        self.served.add(self.verdicts, getattr(read, "served_model", None), getattr(read, "system_fingerprint", None))
        label = None
        if isinstance(verdict, Grade):
            self._usage(verdict.usage or Usage(), verdict.cache_hits)
            if verdict.columns.get("decided_by") is not None:  # a hybrid grader: symbolic or judge
                self._hybrid(str(verdict.columns["decided_by"]))
        else:
            self._usage(verdict.usage, int(verdict.cached))
            label = verdict.label
            if verdict.panel is not None:
                self._panel(verdict.panel.decided_by, verdict.panel.agreement)
        if verdict.status == "abstained":  # a row for a human: neither judged nor failed
            self.abstained += 1
            return
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
                self.examples.append(f"{kind}: {said_as_flags(verdict.error)}")

    def add_written(self, row: Mapping[str, Any]) -> None:
        """Count a row kept from an earlier output (its cells may be CSV text)."""
        self.verdicts += 1
        self.served.add_written(self.verdicts, row)
        status = row.get("status")
        self._panel(row.get("decided_by"), row.get("agreement"))
        if "metrics" in row and row.get("decided_by") in ("symbolic", "judge"):  # a hybrid grader's row (grader runs have metrics)
            self.hybrid = True
            self.saved += 2 * (row["decided_by"] == "symbolic")
        if status == "abstained":
            self.abstained += 1
            return
        if status == "ok":
            self.ok += 1
            self.score_sum += float(row.get("score") or 0.0)
            if row.get("label") not in (None, ""):
                self.labels[str(row["label"])] += 1
            return
        kind = row.get("error_kind") or (status if status not in (None, "", "error") else "unknown")
        self.kinds[kind] += 1
        skipped = status == "skipped" or kind == "budget"
        self.skipped += skipped
        if len(self.examples) < 5 and not skipped:
            self.examples.append(f"{kind}: {row.get('error')}")

    def state(self) -> dict[str, Any]:
        """The counts, for a checkpoint: a resumed run's summary covers the whole output."""
        return {**{k: v for k, v in vars(self).items() if k not in ("labels", "kinds", "decided", "served")},
                "labels": dict(self.labels), "kinds": dict(self.kinds), "decided": dict(self.decided), "served": self.served.state()}

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> _Tally:
        tally = cls()
        for key, value in state.items():
            if key == "requests":  # "requests sent" is this run's traffic; the rows and tokens are the whole output's
                continue
            if key == "served":
                tally.served = ServedTally.restore(value)
                continue
            setattr(tally, key, Counter(value) if key in ("labels", "kinds", "decided") else value)
        return tally

    def summary(self, wall: float) -> RunSummary:
        results = RunResults(
            rows=self.verdicts,
            ok=self.ok,
            errors=self.verdicts - self.ok - self.skipped - self.abstained,
            skipped=self.skipped,
            abstained=self.abstained,
            decided_by=dict(self.decided.most_common()),
            mean_agreement=self.agreement_sum / self.agreement_n if self.agreement_n else None,
            mean_score=self.score_sum / self.ok if self.ok else None,
            label_counts=dict(self.labels.most_common()),
            parse_failure_rate=self.kinds["parse_failure"] / self.verdicts if self.verdicts else 0.0,
            errors_by_kind=dict(self.kinds.most_common()),
            error_examples=self.examples,
        )
        usage = Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens, reasoning_tokens=self.reasoning_tokens,
                      cached_tokens=self.cached_tokens, cache_write_tokens=self.cache_write_tokens, requests=self.requests)
        ratio = (lambda part: round(part / self.prompt_tokens, 4)) if self.prompt_tokens else (lambda part: 0.0)
        stats = RunStats(
            usage=usage,
            flex_usage=dict(self.flex),
            cache_hits=self.cache_hits,
            wall_s=wall,
            judgements_per_s=self.verdicts / wall if wall > 0 else 0.0,
            judge_calls_saved=self.saved if self.hybrid else None,
            money=Money(cache_hit_ratio=ratio(self.cached_tokens), cache_write_ratio=ratio(self.cache_write_tokens)),
            served=Served(groups=[dict(g) for g in self.served.groups], changes=[dict(c) for c in self.served.changes],
                          changes_total=self.served.change_count),
        )
        return RunSummary(results=results, stats=stats)
