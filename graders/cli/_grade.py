"""`gradekit grade`: one rubric over a CSV/JSONL/Parquet file, one output row per input row, resumably."""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from .._flags import in_flags, said_as_flags
from ._common import fail, print_json, warnings_to_stderr
from ._judge_options import JudgeOptions, judge_options

if TYPE_CHECKING:  # the library (openai, pyarrow, ...) loads when the command runs, not for --help
    from gradekit.judge import Budget, Judge, JudgeProtocol
    from gradekit.judge._spec import JudgeSpec

    from ..calibration._pairwise import PairwiseRunSummary
    from ..runs._file import RunSummary
    from ..runs._io import RunInput


@judge_options
def grade(
    input: Path = typer.Argument(..., help="CSV, JSONL or Parquet file of rows to grade, or a folder of them (read as one input in sorted path order; see docs/file-runs.md)."),
    rubric: str = typer.Option(None, "-r", "--rubric", help="Rubric name (see `gradekit rubrics`) or path to a .yaml spec."),
    grader_file: Path = typer.Option(None, "--grader", help="Instead of a rubric: a grader config (.yaml/.json: string match, python, composite, LLM; see `gradekit validate`)."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file; .csv, .jsonl or .parquet decides the format."),
    mapping: list[str] = typer.Option([], "--map", help="VAR=COLUMN: read rubric variable VAR (with --grader: a sample path such as response or references.answer) from COLUMN (repeatable)."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON (with a version field)."),
    no_swap: bool = typer.Option(False, "--no-swap", help="Pairwise rubrics: ask only the input order, not the swapped one too."),
    on_conflict: str = typer.Option("tie", "--on-conflict", help="Pairwise rubrics: the pair rule when the two orders disagree: tie, first, third (needs --tiebreak-model), or vote (JudgeBench: +1 per order for the output it prefers; an unreadable order abstains)."),
    tiebreak_model: str = typer.Option(None, "--tiebreak-model", help="Pairwise rubrics: the model asked a third time when the orders disagree."),
    restart: bool = typer.Option(False, "--restart", help="Ignore the checkpoint of an earlier run into OUTPUT and grade every row again."),
    batch: bool = typer.Option(False, "--batch", help="Send the judge requests through the provider's Batch API (cheaper, slower); resumable from OUTPUT.batch.json."),
    batch_poll: float = typer.Option(10.0, "--batch-poll", help="With --batch: seconds before the first re-poll, doubling up to 5 minutes."),
    group_by: str = typer.Option(None, "--group-by", help="COLUMN whose rows are one prompt's responses: report the reward spread (all-equal groups, mean, variance, too easy / too hard)."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Grade every row even when the judge looks broken (no circuit breaker: every failing row becomes an error row)."),
    retry_errors: bool = typer.Option(False, "--retry-errors", help="Grade again, in place, the rows of an earlier run's OUTPUT whose status is error with a transient kind (server_error, timeout, rate_limited); every other row stays as it is."),
    progress_every: float = typer.Option(10.0, "--progress-every", metavar="S", help="When stderr is not a terminal: print a progress line every S seconds (0: none)."),
    encoding: str = typer.Option(None, "--encoding", help="Read a CSV/JSONL INPUT in this encoding (latin-1, cp1252, gbk, ...) [default: UTF-8, with or without a BOM]."),
    ray_address: str = typer.Option(None, "--ray", metavar="ADDRESS", help="Judge the rows on a Ray cluster: auto, local, HOST:PORT or ray://HOST:PORT; --rps/--tpm then hold for the whole cluster (needs gradekit[ray])."),
    ray_workers: int = typer.Option(None, "--ray-workers", metavar="N", help="With --ray: judge actors (default: one per CPU of the cluster, at most 64)."),
    jury: str = typer.Option(None, "--jury", help="With --model given several times (a jury): how the jurors' verdicts make one: majority, mean, min or unanimous [default: majority for label rubrics, mean for score rubrics]. Adds agreement and jurors columns (docs/juries.md)."),
    quorum: int = typer.Option(None, "--quorum", metavar="N", help="A jury decides a row when at least N jurors answered it (a failing juror abstains) [default: a majority of the jury]."),
    cascade: Path = typer.Option(None, "--cascade", metavar="CASCADE.JSON", help="Grade with a cascade from `gradekit cascade fit`: each row goes to the first judge confident enough, else status abstained. Adds decided_by and confidence columns (docs/juries.md)."),
    keep_reasoning: bool = typer.Option(False, "--keep-reasoning", help="Add a reasoning column: the judge's thinking (a reasoning model's reasoning field or <think> block), never read for the verdict."),
    canary: Path = typer.Option(None, "--canary", metavar="FILE", help="Rows with known verdicts (the rubric's variables and a label column), judged before the run and again as it goes; a judge whose answers changed since the start stops the run (exit 3, resumable). Adds a drift column (docs/align.md)."),
    canary_every: list[str] = typer.Option([], "--canary-every", metavar="N|TIME", help="With --canary: check again every N rows (default 500) and/or every TIME (90s, 10m, 1h), whichever comes first; repeatable."),
    on_drift: str = typer.Option("stop", "--on-drift", help="With --canary: stop (exit 3, resumable) or flag (go on; rows judged after the change get drift = true)."),
    *,
    opts: JudgeOptions,
) -> None:
    """Grade every row of INPUT with a rubric (or a grader config) and write OUTPUT with score, status and error columns.

    An interrupted run (Ctrl-C, a crash, SIGKILL) continues where it stopped when the same command
    is run again: OUTPUT.checkpoint.json says how much of OUTPUT is final, and rows judged but not
    yet written come back from the cache. A run over a finished OUTPUT does nothing and says so.

    A broken judge stops the run early: when the first 3 rows fail with the same 401/403/404 (or
    other bad request), or more than 80% of the last 50 requests fail (nothing listening, 5xx,
    timeouts), no more rows are started, OUTPUT ends before the first row that failed for it and
    the checkpoint is saved; fix the judge and run the same command again to resume. --keep-going
    turns this off. --retry-errors grades again the rows an outage left as errors.

    One run writes OUTPUT at a time (OUTPUT.lock); OUTPUT is never the INPUT, not even through a
    link. A row that cannot be read (bad bytes, a CSV cell over 128 KiB, JSON nested too deep, a
    damaged Parquet page) is an error row for that row.

    INPUT may be a folder: its CSV, JSONL or Parquet files (one format; subfolders too; names
    starting with . or _ and gradekit's own outputs skipped) are read as one input in sorted path
    order, so OUTPUT may be written into it (docs/file-runs.md).

    With --ray ADDRESS Ray Data reads INPUT, a pool of Ray actors judges the rows and this process
    writes OUTPUT: the same file, order, summary and resuming as a local run.

    Without --rps/--tpm the run paces itself to the limit the provider's replies show: its
    x-ratelimit-* headers, else its 429s (AIMD); --no-adapt turns that off. See docs/pacing.md.

    Exit status: 0 when every row was judged, 1 when some rows carry an error (the output still has
    one row per input row), 2 when the run could not start (bad file, rubric or option; INPUT not in
    its encoding; duplicate column names; OUTPUT locked by another run, the same file as INPUT, or
    not writable; --ray without Ray installed or a cluster that cannot be reached), 3 when the judge looks broken and the run stopped early (resumable),
    when the first rows all failed in this process (local_error: the message names the cause and the fix; resumable once fixed),
    or when the --canary saw the judge change (resumable once it agrees with the start again), 130 on Ctrl-C (resumable).
    """
    args = _GradeArgs(**locals())  # the command line as one value, which each step below reads
    warnings_to_stderr()
    command = _parse(args)  # the options' own rules, the rubric and the mapping (exit 2)
    source = _resolve(command)  # the input, resolved once: every later step takes this RunInput
    _check_run(command)  # the rules between the options, the rubric and the run's kind (exit 2)
    # A cassette must see every request, so record/replay bypass the cache unless --cache is explicit.
    cache = opts.open_cache()
    if ray_address is not None:
        return _run_on_ray(command, source, cache)
    judges = _judges(command, cache)  # the run's judge (a grader config builds it on first need)
    plan = _plan(command, judges, source)  # which run, its options and how it is shown
    summary = _run_plan(plan, command, judges, cache)
    _report(command, judges, summary)


@dataclass
class _GradeArgs:
    """``grade``'s parameters, by name, as typer parsed them."""

    input: Path
    rubric: str | None
    grader_file: Path | None
    output: Path
    mapping: list[str]
    json_output: bool
    no_swap: bool
    on_conflict: str
    tiebreak_model: str | None
    restart: bool
    batch: bool
    batch_poll: float
    group_by: str | None
    keep_going: bool
    retry_errors: bool
    progress_every: float
    encoding: str | None
    ray_address: str | None
    ray_workers: int | None
    jury: str | None
    quorum: int | None
    cascade: Path | None
    keep_reasoning: bool
    canary: Path | None
    canary_every: list[str]
    on_drift: str
    opts: JudgeOptions


@dataclass
class _Command:
    """What the command line asks, checked: the rubric (``spec``; None with --grader) and the mapping."""

    args: _GradeArgs
    spec: Any
    variables: dict[str, str]
    cascade_spec: Any  # a --cascade file's CascadeSpec
    panel: bool  # a jury (--model given several times) or a cascade
    model: str | None  # the one --model, else None


def _parse(args: _GradeArgs) -> _Command:
    """The options' own rules, then the rubric and the mapping: everything that fails without the input."""
    from gradekit.judge import RubricError, load_rubric

    from ..runs._file import resolve_mapping
    from ..runs._io import InputError
    from ._panel import check_panel

    opts, rubric = args.opts, args.rubric
    opts.check()
    cascade_spec = check_panel(opts, args.jury, args.quorum, args.cascade)
    if rubric is None and args.grader_file is None and cascade_spec is not None:
        rubric = cascade_spec.rubric  # the rubric the cascade was fitted with
    if (rubric is None) == (args.grader_file is None):
        raise fail("give a rubric (-r/--rubric) or a grader config (--grader), one of the two")
    panel = len(opts.model) > 1 or cascade_spec is not None
    if cascade_spec is not None and args.grader_file is not None:
        raise fail("--cascade grades with a rubric (-r): its thresholds were fitted on that rubric's verdicts")
    if len(opts.model) > 1:
        opts.per_member(len(opts.model), "jury")  # --base-url: one for every juror or one per --model (exit 2 otherwise)
    model = opts.model[0] if len(opts.model) == 1 else None
    try:
        spec = load_rubric(rubric) if rubric is not None else None
        variables = resolve_mapping(spec, args.mapping) if spec is not None else sample_mapping(args.mapping)
    except (RubricError, InputError) as e:
        raise fail(str(e)) from e
    certified = spec.alignment.judge.get("model") if spec is not None and spec.alignment is not None else None
    if certified and not panel:
        from gradekit.judge._client import DEFAULT_MODEL

        if (model or DEFAULT_MODEL) != certified:
            typer.echo(f"warning: {rubric}: its certificate holds for judge {certified}, not {model or DEFAULT_MODEL}: it says "
                       "nothing about this one; align it for this judge (gradekit align)", err=True)
    return _Command(args, spec, variables, cascade_spec, panel, model)


def _resolve(command: _Command) -> RunInput:
    """The input, once for the whole run: a folder's files are listed here, so an empty or mixed one fails before any request."""
    from ..runs._io import InputError, RunInput, codec, file_format, input_format
    from ..runs._lock import check_not_input

    input, output, encoding = command.args.input, command.args.output, command.args.encoding
    try:
        if not input.is_dir():
            input_format(input)  # a row file, or one ATIF trajectory (.json)
        file_format(output)
        if not input.exists():
            raise InputError(f"{input}: no such file")
        source = RunInput.resolve(input, encoding)
        check_not_input(source, output)
        if not _has_rows(source):  # a silent 0-row "success" hides a wrong file or a failed export upstream
            raise InputError(f"{input}: no rows to grade (the input is empty{', or only a header' if source.format == 'csv' else ''}); "
                             "nothing was sent and no output written")
        if encoding is not None:
            codec(encoding)  # an unknown name fails here, before any request
    except InputError as e:
        raise fail(str(e)) from e
    return source


def _check_run(command: _Command) -> None:
    """The rules between the options, the rubric and the kind of run (batch, pairwise, jury, Ray): exit 2 before any request."""
    from ..calibration._pairwise import CONFLICT_RULES
    from ._panel import check_cascade_rubric

    a, spec, opts, panel, cascade_spec = command.args, command.spec, command.args.opts, command.panel, command.cascade_spec
    record, replay, max_cost, max_tokens = opts.record, opts.replay, opts.max_cost, opts.max_tokens
    batch, ray_address = a.batch, a.ray_address
    if a.on_conflict not in CONFLICT_RULES or (a.on_conflict == "third") != bool(a.tiebreak_model):
        raise fail("--on-conflict is tie, first, vote, or third together with --tiebreak-model")
    if panel and (batch or ray_address is not None):
        raise fail("a jury (--model given several times) or a --cascade judges live: it excludes --batch and --ray")
    if spec is not None and spec.is_checklist and panel:
        raise fail(f"rubric {spec.name!r} is a checklist: a jury or a --cascade votes over one label, so grade it with one --model")
    if spec is not None and spec.criteria_variable is not None and batch:
        raise fail(f"rubric {spec.name!r} takes its criteria per row ({spec.criteria_variable!r}): --batch reads replies "
                   "without their rows, so grade it live (a checklist with fixed criteria takes --batch)")
    if spec is not None and spec.trajectory_variables and batch:
        raise fail(f"rubric {spec.name!r} reads a trajectory: --batch does not yet write trajectory_coverage, learn the "
                   "window or judge steps and navigation rounds, so grade it live")
    if cascade_spec is not None and spec is not None:
        if spec.pairwise is not None:
            raise fail("--cascade grades single-answer rubrics; for a pairwise rubric use a jury (--model several times)")
        check_cascade_rubric(a.cascade, cascade_spec, spec)
    if batch and a.encoding:
        raise fail("--batch reads UTF-8 input; convert the file first (iconv -f ENCODING -t UTF-8)")
    if batch and len(opts.base_url) > 1:
        raise fail("--batch submits to one endpoint's Batch API: give one --base-url (a fleet sends live requests)")
    if batch and (record or replay):
        raise fail("--batch sends no live requests: it excludes --record and --replay")
    if batch and (max_cost is not None or max_tokens is not None):
        raise fail("--max-cost and --max-tokens cap live requests; a --batch run is priced by the provider when it is submitted")
    if batch and (opts.service_tier or (opts.api or "chat") != "chat"):
        raise fail("--batch submits chat requests at the Batch API's own price: it excludes --service-tier and --api")
    if spec is None and (batch or a.tiebreak_model):
        raise fail("--batch and --tiebreak-model work with a rubric (-r), not with --grader")
    if a.retry_errors and (a.restart or batch or (spec is not None and spec.pairwise is not None)):
        raise fail("--retry-errors grades again the error rows of an earlier live run: it excludes --restart, --batch and pairwise rubrics")
    if a.progress_every < 0:
        raise fail("--progress-every takes seconds >= 0 (0: no progress lines)")
    if a.ray_workers is not None and ray_address is None:
        raise fail("--ray-workers needs --ray ADDRESS")
    if a.canary is None and (a.canary_every or a.on_drift != "stop"):
        raise fail("--canary-every and --on-drift go with --canary FILE")
    if a.on_drift not in ("stop", "flag"):
        raise fail(f"--on-drift is stop or flag, not {a.on_drift!r}")
    if a.canary is not None and (spec is None or spec.pairwise is not None or batch or ray_address is not None or a.retry_errors):
        raise fail("--canary watches a live run of a single-answer rubric (-r): it excludes --grader, pairwise rubrics, --batch, "
                   "--ray and --retry-errors")
    if a.ray_workers is not None and not 1 <= a.ray_workers <= 1024:
        raise fail("--ray-workers is a number of actors from 1 to 1024")
    if ray_address is not None:
        if batch or record or replay or max_cost is not None or max_tokens is not None or a.tiebreak_model or a.group_by:
            raise fail("--ray works without --batch, --record/--replay, --max-cost/--max-tokens, --tiebreak-model and --group-by")
        if spec is not None and spec.pairwise is not None:
            raise fail("--ray grades single-answer rubrics and graders; a pairwise rubric runs without --ray")
        from ..runs._ray import RayMissing, import_ray

        try:
            import_ray()
        except RayMissing as e:
            raise fail(str(e)) from e


def _run_on_ray(command: _Command, source: RunInput, cache) -> None:
    """``grade --ray``: the judge's options go to the actors, this process prices and reports the run."""
    from gradekit.judge._breaker import BreakerTripped

    a, opts, spec, variables, model = command.args, command.args.opts, command.spec, command.variables, command.model
    prices = opts.budget().prices  # the run is priced here, as a local run is: the actors keep no table
    try:
        return _grade_on_ray(a.ray_address, a.ray_workers, spec, a.grader_file, source, a.output, variables, judge=opts.spec(model),
                             file_judge=functools.partial(opts.file_spec, model) if a.grader_file else None,
                             layers=opts.layers(model) if a.grader_file else None,
                             cache_path=opts.resolved_cache_path(), cache=cache, json_output=a.json_output, resume=not a.restart,
                             encoding=a.encoding, prices=prices)
    except BreakerTripped as e:
        raise _breaker_exit(e, a.output, a.json_output, Console(stderr=True)) from None


@dataclass
class _Judges:
    """The run's judges, as the judge-building step leaves them."""

    limiter: Any
    budget: Budget
    made: list  # the run's judge, once built (a grader config builds it on first need)
    make_judge: Callable[..., Judge]
    judge: Judge | None  # a rubric run's judge (None with --grader)
    tiebreak: Judge | None


def _judges(command: _Command, cache) -> _Judges:
    """The run's judge from the command line (and a grader file's ``judge:`` block, on first need)."""
    from .._config import FileJudge
    from ._panel import build_panel

    a, opts, spec, cascade_spec, model = command.args, command.args.opts, command.spec, command.cascade_spec, command.model
    jury, quorum, tiebreak_model = a.jury, a.quorum, a.tiebreak_model
    limiter = opts.limiter(model)
    budget = opts.budget()

    made: list[Judge] = []  # the run's judge, once built (a grader config builds it on first need)

    def make_judge(settings=None) -> Judge:
        panel_judge = build_panel(opts, jury=jury, quorum=quorum, spec=cascade_spec, cache=cache, budget=budget)
        if panel_judge is not None:
            made.append(panel_judge)
            return made[-1]
        # A grader file's judge: (its model, endpoint or fleet, params, or its jury) holds beneath what the command line names.
        wanted = opts.spec(model) if settings is None else opts.file_spec(model, settings)
        made.append(wanted.build(limiter=limiter, cache=cache, budget=budget))
        return made[-1]

    try:
        # A grader config may need no judge at all: its LLM nodes build one on first need.
        judge = make_judge() if spec is not None else None
        tiebreak = opts.judge(tiebreak_model, limiter=limiter, cache=cache) if tiebreak_model else None
    except ValueError as e:
        raise fail(str(e)) from e
    return _Judges(limiter, budget, made, FileJudge(make_judge), judge, tiebreak)


@dataclass
class _Plan:
    """Which run the command is (grader, batch, pairwise or rubric), ready to start."""

    start: Callable[[], Any]  # the run's coroutine, made when the run starts
    traffic: Any  # --record/--replay: the cassette held open around the run
    err: Console


def _plan(command: _Command, judges: _Judges, source: RunInput) -> _Plan:
    """The run's options and how it is shown, and which of the four runs takes them."""
    from gradekit.judge._client import DEFAULT_MODEL

    from ._progress import already_written

    a, opts, spec, variables, output = command.args, command.args.opts, command.spec, command.variables, command.args.output
    judge, model, panel = judges.judge, command.model, command.panel
    traffic = opts.traffic()
    err = Console(stderr=True)
    made = judges.made
    show = _Show(err, bar=sys.stderr.isatty() and not a.json_output, every=0.0 if sys.stderr.isatty() else a.progress_every,
                 done=0 if a.retry_errors else already_written(output, a.restart), fleet=lambda: fleet_text(made[0]) if made else "")
    run_options = {"group_by": a.group_by, "resume": not a.restart, "keep_going": a.keep_going, "retry_errors": a.retry_errors,
                   "encoding": a.encoding}
    if a.keep_reasoning:
        if spec is None or spec.pairwise is not None or a.batch:
            raise fail("--keep-reasoning works with a single-answer rubric (-r), not with --grader, pairwise rubrics or --batch")
        run_options["keep_reasoning"] = True
    if a.canary is not None:
        run_options["canary"] = _canary(command, judges)
    if spec is None:
        endpoint = {"model": ", ".join(opts.model) if panel else model or DEFAULT_MODEL, "base_url": opts.first_base_url,
                    **({"jury": a.jury, "quorum": a.quorum} if panel else {})}
        # --concurrency is per endpoint: a fleet on the command line keeps each of them as busy.
        return _Plan(lambda: _run_grader(a.grader_file, judges.make_judge, endpoint, source, output, variables,
                                         opts.in_flight * max(1, len(opts.base_url)), show, run_options), traffic, err)
    if a.batch:
        return _Plan(lambda: _run_batch(judge, spec, source, output, variables, a.batch_poll, a.group_by, not a.restart,
                                        None if a.json_output else err), traffic, err)
    if spec.pairwise is not None:
        return _Plan(lambda: _run_pairwise(judge, spec, source, output, variables, not a.no_swap, a.on_conflict, judges.tiebreak,
                                           a.encoding), traffic, err)
    return _Plan(lambda: _run(judge, spec, source, output, variables, show, run_options), traffic, err)


def _run_plan(plan: _Plan, command: _Command, judges: _Judges, cache):  # -> RunSummary | PairwiseRunSummary
    """Run it; what stops a run becomes its exit status (2 bad input, 3 a broken judge, 130 Ctrl-C)."""
    import asyncio

    from gradekit.judge._breaker import BreakerTripped

    from .._config import GraderConfigError
    from ..runs._io import InputError
    from ..runs._provider_batch import BatchRunError

    output, made, err = command.args.output, judges.made, plan.err
    try:
        with plan.traffic:
            return asyncio.run(plan.start())
    except (InputError, BatchRunError, GraderConfigError) as e:
        raise fail(str(e)) from e
    except BreakerTripped as e:
        raise _breaker_exit(e, output, command.args.json_output, err, made[0] if made else None) from None
    except KeyboardInterrupt:
        # Without a cache the rows judged but not yet written have nowhere to come back from: do not promise hits.
        again = "rows already judged come back from the cache" if cache is not None else "without a cache, rows not yet written are judged again"
        err.print(f"interrupted: the rows finished so far are saved in {output}; run the same command again to resume "
                  f"({again}).", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        if cache is not None:
            cache.close()


def _report(command: _Command, judges: _Judges, summary) -> None:
    """The summary on the terminal or as --json, then the exit status: 1 when some rows carry an error."""
    from gradekit.judge._client import DEFAULT_MODEL

    from ..calibration._pairwise import PairwiseRunSummary
    from ..runs._file import RunSummary
    from ._panel import panel_summary, print_panel

    a, opts, spec, output, model = command.args, command.args.opts, command.spec, command.args.output, command.model
    made, judge, budget, limiter = judges.made, judges.judge, judges.budget, judges.limiter
    # The rate the run held at its end, learnt or told (a fleet's: the sum of its endpoints').
    stats = made[0].stats() if made else None
    pacing = stats.pacing if stats is not None and stats.pacing is not None else limiter.pacing()
    endpoints = _endpoints(stats.endpoints) if stats is not None else []
    # Hedged requests (a fleet's stragglers sent once more): sent, won, lost, over every endpoint; zeros when none hedges.
    hedges = {k: sum(getattr(e.hedges, k) for e in (stats.endpoints if stats is not None else [])) for k in ("sent", "won", "lost")}
    block = None
    if isinstance(summary, RunSummary):
        _add_money(summary, budget, judge.model if judge is not None else (model or DEFAULT_MODEL), batch=a.batch)
        summary.pacing = pacing
        if judge is not None:
            block = panel_summary(judge, summary, budget.prices)  # None for a single judge
            summary.cost_usd = block["cost_usd"] if block is not None else summary.cost_usd  # priced per member model
    name = "jury" if len(opts.model) > 1 else "cascade"
    if a.json_output:
        what = {"rubric": spec.name} if spec is not None else {"grader": str(a.grader_file)}
        print_json({"output": str(output), **what, "model": judge.model if judge is not None else model, **summary.model_dump(),
                    "pacing": pacing.model_dump(), "endpoints": endpoints, "hedges": hedges, **({name: block} if block is not None else {}),
                    # a cascade's headline figures at the top too, beside rows/ok/abstained
                    **({k: block[k] for k in ("coverage", "guarantee")} if block is not None and name == "cascade" else {})})
    elif isinstance(summary, PairwiseRunSummary):
        _print_pairwise(summary, output, Console(highlight=False))
    else:
        _print_summary(summary, output, Console(), endpoints, hedges)
        print_panel(block, Console(highlight=False))
    raise typer.Exit(1 if summary.errors or getattr(summary, "skipped", 0) else 0)

def _has_rows(source: RunInput) -> bool:
    """Whether the input holds one row (read lazily: the first row, or the first unreadable one, answers)."""
    rows = source.read()
    try:
        return next(rows, None) is not None
    finally:
        rows.close()


def _breaker_exit(e, output: Path, json_output: bool, err: Console, judge: JudgeProtocol | None = None) -> typer.Exit:
    """Exit 3: nothing is wrong with the rows; the judge is. The same command resumes once it is fixed."""
    from ..runs._file import RunSummary

    if json_output:
        partial = e.summary.model_dump() if isinstance(e.summary, RunSummary) else {}
        print_json({"output": str(output), "model": e.trip.model, "stopped": "drift" if e.trip.kind == "drift" else "breaker",
                    "message": in_flags(str(e)),
                    "base_url": e.trip.base_url, "error_kind": e.trip.kind, "example": in_flags(e.trip.example), "summary": partial,
                    "endpoints": _endpoints(judge.stats().endpoints) if judge is not None else []})
    err.print(f"error: {in_flags(str(e))}", style="red", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(3)


def _endpoints(stats) -> list[dict]:
    """A fleet's endpoints for --json, each one's reason for being out said in flags."""
    return [{**e.model_dump(), "reason": said_as_flags(e.reason)} for e in stats]


class _Show:
    """How the command shows a live run: a bar on a terminal, else a line every ``every`` seconds."""

    def __init__(self, err: Console, *, bar: bool, every: float, done: int, fleet: Callable[[], str] | None = None) -> None:
        self.err, self.bar, self.every, self.done, self.fleet = err, bar, every, done, fleet

    def progress(self, source: RunInput):  # -> RunProgress
        from ._progress import RunProgress

        # Counting is a pass over the input: a bar needs it now, the lines only once the first is due.
        return RunProgress(source.count_rows() if self.bar else source.count_rows, self.err, every=self.every, bar=self.bar, done=self.done,
                           fleet=self.fleet)


def fleet_text(judge: JudgeProtocol) -> str:
    """A progress line's part for a fleet: its rate and each endpoint's ("" for one endpoint)."""
    stats = judge.stats().endpoints
    if len(stats) < 2:
        return ""
    parts = ", ".join(f"{e.base_url} {e.rps:.1f}/s" + ("" if e.state == "up" else f" {e.state}") for e in stats)
    return f"; fleet {sum(e.rps for e in stats if e.state == 'up'):.1f} req/s ({parts})"


def _canary(command: _Command, judges: _Judges):  # -> Canary
    """The --canary: its rows (read like labelled rows, with the run's --map), and the run's judge built again without a
    cache (a check never reads one), sharing the run's limiter and budget."""
    from ..calibration._judging import read_labelled
    from ..runs._canary import Canary, parse_every
    from ..runs._io import InputError, RowError
    from ._panel import build_panel

    a, opts = command.args, command.args.opts
    try:
        every_rows, every_seconds = parse_every(a.canary_every)
        rows = read_labelled(a.canary, command.spec, command.variables, "label")
        fresh = build_panel(opts, jury=a.jury, quorum=a.quorum, spec=command.cascade_spec, cache=None, budget=judges.budget) \
            or opts.spec(command.model).build(limiter=judges.limiter, cache=None, budget=judges.budget)
    except (InputError, RowError, ValueError) as e:
        raise fail(f"--canary: {e}") from e
    return Canary(rows.rows, rows.human, command.spec, fresh, every_rows=every_rows, every_seconds=every_seconds,
                  on_drift=a.on_drift, source={"name": rows.name, "sha256": rows.sha256})  # type: ignore[arg-type]


async def _run(judge: JudgeProtocol, spec, source: Path, destination: Path, variables: dict[str, str], show: _Show,
               options: dict) -> RunSummary:
    from ..runs._file import grade_file

    canary = options.get("canary")
    async with judge:
        try:
            progress = show.progress(source)
            async with progress.showing():
                return await grade_file(judge, spec, source, destination, variables, on_row=progress.row, **options)
        finally:
            if canary is not None:
                await canary.fresh.aclose()


def _add_money(summary: RunSummary, budget: Budget, model: str, *, batch: bool = False) -> None:
    """Cost of the output's tokens at the table's prices (cache reads and writes at theirs, the flex part at the
    flex tier's, a --batch run's at the Batch API's), what the provider's prompt cache saved or cost, what the
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


def sample_mapping(pairs: list[str]) -> dict[str, str]:
    """``PATH=COLUMN`` pairs for a grader: the sample path (response, references.answer, ...) a column fills."""
    from ..runs._io import InputError

    out: dict[str, str] = {}
    for pair in pairs:
        path, sep, column = pair.partition("=")
        if not sep or not path or not column:
            raise InputError(f"--map {pair!r}: expected PATH=COLUMN, e.g. response=model_output or references.answer=gold")
        out[path] = column
    return out


async def _run_grader(config: Path, make_judge: Callable[[], Judge], endpoint: dict[str, str | None], source: Path,
                      destination: Path, mapping: dict[str, str], concurrency: int, show: _Show, options: dict) -> RunSummary:
    """A grader config over the file; its LLM nodes share the command line's judge, limiter and cache.

    The checkpoint is keyed by the config's bytes and the judge endpoint the command line names
    (``--model``, ``--base-url`` and their environment variables), so another judge starts over.
    """
    from .._config import load_grader
    from .._evals import EvalGrader, run_figures
    from ..runs._file import grade_file_with
    from ..runs._io import InputError

    if not config.exists():
        raise InputError(f"{config}: no such grader config")
    grader = load_grader(config, judge=make_judge, media_root=_media_root(source))
    settings = {"config": hashlib.sha256(config.read_bytes()).hexdigest(), **endpoint}
    try:
        progress = show.progress(source)
        async with progress.showing():
            summary = await grade_file_with(grader, source, destination, mapping, concurrency=concurrency + 2, settings=settings,
                                            on_row=progress.row, **options)
    finally:
        await grader.aclose()
    if isinstance(grader.grader, EvalGrader):  # read back from OUTPUT, so a resumed run reports every row
        from ..runs._io import written_rows

        counts, per = run_figures(written_rows(destination), grader.grader.names)
        summary.result_counts = counts.model_dump()
        summary.per_testing_criteria_results = [p.model_dump() for p in per]
    return summary


async def _run_batch(judge: Judge, spec, source: Path, destination: Path, variables: dict[str, str], poll: float,
                     group_by: str | None, resume: bool, err: Console | None) -> RunSummary:
    from ..runs._provider_batch import grade_file_batch

    def say(message: str) -> None:
        if err is not None:  # None with --json: stdout and stderr stay machine-readable
            err.print(f"batch: {message}", highlight=False, markup=False, soft_wrap=True)

    async with judge:
        return await grade_file_batch(judge, spec, source, destination, variables, poll_interval=poll, group_by=group_by,
                                      resume=resume, on_event=say)


async def _run_pairwise(judge: JudgeProtocol, spec, source: Path, destination: Path, variables: dict[str, str], swap: bool,
                        on_conflict: str, tiebreak: Judge | None, encoding: str | None = None) -> PairwiseRunSummary:
    from ..calibration._pairwise import grade_pairwise_file

    async with judge:
        try:
            return await grade_pairwise_file(judge, spec, source, destination, variables, swap=swap,
                                             on_conflict=on_conflict, tiebreak=tiebreak, encoding=encoding)  # type: ignore[arg-type]
        finally:
            if tiebreak is not None:
                await tiebreak.aclose()


def _print_pairwise(s: PairwiseRunSummary, output: Path, console: Console) -> None:
    console.print(f"pairs {s.rows} ({s.ok} judged, {s.errors} errors) -> {output}")
    console.print("winners " + (", ".join(f"{k}: {v}" for k, v in s.winners.items()) or "-")
                  + "; decided by " + (", ".join(f"{k} {v}" for k, v in s.decided_by.items()) or "-")
                  + (f"; {s.one_order} scored from one readable order" if s.one_order else ""))
    if s.agreement is not None:
        console.print(f"orders agree on {s.agreement:.1%} of pairs")
    r = s.report
    if r is not None and r.acc is not None and r.agr is not None:
        console.print(f"Acc {r.acc * 100:.1f} / Agr {r.agr * 100:.1f}  (against column {s.label_column!r}, LLMBar's convention)")
    console.print(f"parse failures {s.parse_failure_rate:.1%}; requests {s.requests} sent, {s.cache_hits} cache hits; "
                  f"tokens {s.prompt_tokens} prompt + {s.completion_tokens} completion"
                  + (f" ({s.reasoning_tokens} reasoning)" if s.reasoning_tokens else "") + f"; {s.wall_s:.2f} s")
    for example in s.error_examples:
        console.print(f"  {example}", style="red", markup=False)


def _print_summary(s: RunSummary, output: Path, console: Console, endpoints: list[dict] | None = None,
                   hedges: dict | None = None) -> None:
    if s.already_complete:
        console.print(f"{output} is already complete ({s.rows} rows); nothing to do. Use --restart to grade again.", highlight=False)
    elif s.resumed_from:
        console.print(f"resumed: {s.resumed_from} rows were already in {output} from an interrupted run", highlight=False)
    table = Table(show_header=False, box=None, pad_edge=False)
    skipped = f", {s.skipped} skipped" if s.skipped else ""
    skipped += f", {s.abstained} abstained" if s.abstained else ""
    table.add_row("rows", f"{s.rows} ({s.ok} judged, {s.errors} errors{skipped}) -> {output}")
    table.add_row("mean score", "n/a" if s.mean_score is None else f"{s.mean_score:.4f}")
    table.add_row("labels", ", ".join(f"{k}: {v}" for k, v in s.label_counts.items()) or "-")
    table.add_row("parse failures", f"{s.parse_failure_rate:.1%}")
    table.add_row("errors by kind", ", ".join(f"{k}: {v}" for k, v in s.errors_by_kind.items()) or "-")
    table.add_row("tokens", f"{s.prompt_tokens} prompt + {s.completion_tokens} completion"
                  + (f" ({s.reasoning_tokens} reasoning)" if s.reasoning_tokens else "")
                  + (f"; {s.cached_tokens} prompt tokens from the provider's cache" if s.cached_tokens else ""))
    if s.cached_tokens or s.cache_write_tokens:
        money = "" if s.cache_saved_usd is None else \
            (f", saved ${s.cache_saved_usd:.4f}" if s.cache_saved_usd >= 0 else f", cost ${-s.cache_saved_usd:.4f} more")
        table.add_row("prompt cache", f"{s.cache_hit_ratio:.1%} of prompt tokens read, {s.cache_write_ratio:.1%} written{money}")
    cost = "n/a (no price for the model: --prices FILE)" if s.cost_usd is None else f"${s.cost_usd:.4f} estimated"
    if s.cost_by_tier:
        cost += " (" + ", ".join(f"{tier} ${usd:.4f}" for tier, usd in s.cost_by_tier.items()) + ")"
    if s.cost_basis and s.cost_usd is not None:
        cost += f" ({s.cost_basis})"
    saved = f"; cache hits saved {s.saved_tokens} tokens" + (f", ${s.saved_usd:.4f}" if s.saved_usd is not None else "") if s.saved_tokens else ""
    table.add_row("cost", cost + saved)
    table.add_row("requests", f"{s.requests} sent, {s.cache_hits} cache hits")
    if s.judge_calls_saved is not None:  # a hybrid grader (math_equivalence with judge_fallback)
        table.add_row("decided by", ", ".join(f"{k} {v}" for k, v in s.decided_by.items()) or "-")
        table.add_row("judge calls saved", f"{s.judge_calls_saved} (two per row the symbolic check decided)")
    table.add_row("wall time", f"{s.wall_s:.2f} s ({s.judgements_per_s:.1f} judgements/s)")
    if s.reward_seconds_p50 is not None:
        slow = ", ".join(f"{r['id'] if r['id'] is not None else 'row ' + str(r['row'])} {r['seconds']:.2f} s" for r in s.slowest_rows[:3])
        table.add_row("reward time", f"p50 {s.reward_seconds_p50:.3f} s, p99 {s.reward_seconds_p99:.3f} s; slowest: {slow}")
    if s.pacing is not None:
        held = "no limit" if s.pacing.rps is None else f"{s.pacing.rps:g} requests/s at the end"
        table.add_row("pacing", f"{s.pacing.mode}: {held}")
    if endpoints and len(endpoints) > 1:  # a fleet: each endpoint's part (one endpoint is the run itself)
        table.add_row("endpoints", "; ".join(
            f"{e['base_url']} {e['state']}: {e['requests']} requests ({e['ok']} ok, {e['rate_limited']} rate limited, "
            f"{e['errors']} errors), {e['rps']:g}/s" for e in endpoints))
    if hedges and hedges.get("sent"):
        table.add_row("hedges", f"{hedges['sent']} sent ({hedges['sent'] / max(1, s.requests):.1%} of {s.requests} requests), "
                      f"{hedges['won']} answered first")
    if s.spread is not None and s.spread.rewards:
        sp = s.spread
        equal = "n/a" if sp.all_equal_share is None else f"{sp.all_equal_share:.1%}"
        table.add_row("reward spread", f"{sp.groups} groups; all-equal {equal} ({sp.all_equal_groups}); mean {sp.mean:.4f}, "
                      f"variance {sp.variance:.4f}; pass rate {sp.pass_rate:.1%}")
        table.add_row("", f"too easy (all max): {sp.too_easy_groups} groups; too hard (all min): {sp.too_hard_groups} groups")
        for advice in sp.advice:
            table.add_row("", f"[yellow]{advice}[/yellow]")
    if s.served:
        table.add_row("served", served_text(s))
    if s.canary is not None:
        table.add_row("canary", canary_text(s.canary))
    if s.result_counts is not None:
        c = s.result_counts
        table.add_row("eval results", f"{c['passed']} passed, {c['failed']} failed, {c['errored']} errored of {c['total']}")
        for r in s.per_testing_criteria_results or []:
            table.add_row("", f"{r['testing_criteria']}: {r['passed']} passed, {r['failed']} failed")
    console.print(table)
    if s.served_note:
        console.print(s.served_note, style="yellow", highlight=False, markup=False, soft_wrap=True)
    if s.budget:
        console.print(f"[yellow]{s.skipped} rows skipped: {s.budget}. Run the same command with a larger cap to grade them;"
                      " the rows already judged come from the cache.[/yellow]", highlight=False)
    for example in s.error_examples:
        console.print(f"  [red]{example}[/red]", markup=True, highlight=False)


def served_text(s: RunSummary) -> str:
    """Who answered the rows (model and system_fingerprint, as the provider says), and where that changed mid-run."""
    def who(model: str | None, fingerprint: str | None) -> str:
        return f"{model or '?'}" + (f" {fingerprint}" if fingerprint else "")

    groups = "; ".join(f"{who(g['model'], g['system_fingerprint'])}: {g['rows']} rows ({g['first_row']}-{g['last_row']})"
                       for g in s.served)
    if not s.served_changes_total:
        return groups
    first = s.served_changes[0]
    was = first["was"]
    return (f"{groups}; changed mid-run {s.served_changes_total} time{'s' if s.served_changes_total > 1 else ''}, first at row "
            f"{first['row']} ({who(was['model'], was['system_fingerprint'])} -> {who(first['model'], first['system_fingerprint'])})")


def canary_text(c: dict) -> str:
    """The canary's part of the summary: its checks, its agreement at the start and last, and the drift it saw."""
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.0%}"

    text = (f"{c['rows']} rows, {c['checks']} checks after the start; agreement with its verdicts {pct(c['agreement_start'])} at "
            f"the start, {pct(c['agreement_last'])} at the last check")
    d = c.get("drift")
    if d:
        text += (f"; the judge changed at check {d['check']} ({pct(d['agreement_start'])} -> {pct(d['agreement_now'])}, "
                 f"p = {d['p']:.2g})" + (f", {c['flagged_rows']} rows flagged drift" if c["on_drift"] == "flag" else ""))
    if c.get("cached_other_judge"):
        text += f"; {c['cached_other_judge']} cached rows were served by another model or fingerprint than the canary's"
    return text


def _grade_on_ray(address: str, workers: int | None, spec, grader_file: Path | None, source: Path, destination: Path,
                  variables: dict[str, str], *, judge: JudgeSpec, cache_path: str | None, cache, json_output: bool, resume: bool,
                  encoding: str | None = None, prices: dict | None = None, file_judge: Callable[[Any], Any] | None = None,
                  layers: tuple[JudgeSpec, JudgeSpec] | None = None) -> None:
    """``grade --ray``: actors judge, this process reads, writes and checkpoints (graders/runs/_ray.py).

    ``file_judge``: a grader file's judge block -> the judge it makes with the command line and the environment
    (JudgeOptions.file_spec, which says which endpoint is used); ``layers``: (beneath, over) the file's block, as
    JudgeOptions.layers gives them, for the actors (WorkerSpec.judge_defaults).
    """
    import asyncio
    from dataclasses import replace

    from gradekit.judge._client import DEFAULT_MODEL
    from gradekit.judge._spec import Limits

    from .._config import GraderConfigError
    from ..runs._file import rubric_settings
    from ..runs._io import InputError
    from ..runs._ray import RayInfo, alive_nodes, connect, default_workers, grade_file_ray, worker_spec

    import ray

    no_cache = cache is None
    if cache is not None:
        cache.close()  # the actors open their own; this process sends no request
    model, first_url = judge.model, judge.first_base_url  # a fleet is named by its first endpoint
    try:
        gcs = connect(address)
    except Exception as e:  # noqa: BLE001 -- Ray raises ConnectionError, RuntimeError, ValueError... for a bad address
        if address == "auto" and isinstance(e, ConnectionError):
            # Ray's own text suggests an --address flag, which gradekit does not have.
            raise fail("--ray auto: no running Ray cluster found (none on this machine, and RAY_ADDRESS is not set); "
                       "start one with `ray start --head`, or use --ray local to start one for this run") from e
        raise fail(f"--ray {address}: cannot reach the Ray cluster: {e}") from e
    try:
        count = workers or default_workers()
        # Without --limiter, --rps/--tpm and Retry-After holds are the cluster's one limiter actor.
        judge = replace(judge, limits=replace(judge.limits, url=judge.limits.url or "ray"))
        if judge.limits.url == "ray" and (judge.limits.rps or judge.limits.tpm):
            try:
                judge.limiter()  # the actor exists before the first row
            except (ValueError, ConnectionError) as e:
                raise fail(str(e)) from e
        # The checkpoint's settings are a local run's, so a run killed with or without --ray resumes either way.
        if spec is not None:
            probe = replace(judge, api_key=judge.api_key or ("unused",), limits=Limits()).build()
            settings = rubric_settings(probe, spec, variables, **({"encoding": encoding} if encoding else {}))
        else:
            if not grader_file.exists():
                raise fail(f"{grader_file}: no such grader config")
            from .._config import FileJudge, load_grader
            from .._sample import aclose_grader

            try:  # built here too, only for its name (part of the checkpoint) and to fail before any actor starts
                def layered(settings: Any = None) -> None:  # the file's judge is the actors' to build; said here
                    if settings is not None and file_judge is not None:
                        file_judge(settings)

                local = load_grader(grader_file, judge=FileJudge(layered))  # type: ignore[arg-type]
            except GraderConfigError as e:
                raise fail(str(e)) from e
            asyncio.run(aclose_grader(local))
            settings = {"grader": getattr(local, "__name__", type(local).__name__), "mapping": dict(variables or {}),
                        "config": hashlib.sha256(grader_file.read_bytes()).hexdigest(), "model": model or DEFAULT_MODEL, "base_url": first_url,
                        **({"encoding": encoding} if encoding else {})}
        beneath = None
        if grader_file is not None and layers is not None:
            # A grader file's judge goes between the environment and the command line, on every actor too.
            beneath, over = layers
            judge = replace(over, limits=judge.limits)
        ws = worker_spec(rubric=spec, grader_config=grader_file, judge=judge, judge_defaults=beneath, cache=cache_path, no_cache=no_cache)
        try:
            summary = asyncio.run(grade_file_ray(ws, source, destination, variables, workers=count, settings=settings, resume=resume,
                                                 encoding=encoding))
        except (InputError, GraderConfigError) as e:
            raise fail(str(e)) from e
        except ray.exceptions.RayError as e:  # an actor that cannot build its judge or grader, a cluster gone
            raise fail(f"--ray {address}: {type(e).__name__}: {e}") from e
        info = RayInfo(address=gcs, nodes=alive_nodes(), workers=count)
    finally:
        ray.shutdown()
    if prices is not None:  # the output's tokens at the table's prices, as _add_money prices a local run
        from gradekit.judge import cost_usd
        from gradekit.judge._budget import price_of

        priced = model or DEFAULT_MODEL
        if price_of(prices, priced) is not None:
            summary.cost_usd = cost_usd(prices, priced, summary.prompt_tokens, summary.completion_tokens)
    if json_output:
        what = {"rubric": spec.name} if spec is not None else {"grader": str(grader_file)}
        print_json({"output": str(destination), **what, "model": model or DEFAULT_MODEL, **summary.model_dump(),
                    "ray": info.model_dump()})
    else:
        _print_summary(summary, destination, Console())
        Console(highlight=False).print(f"ray: {info.workers} workers on {info.nodes} nodes of {info.address}")
    raise typer.Exit(1 if summary.errors or summary.skipped else 0)


def _media_root(source) -> Path:
    """The folder local media paths must stay inside: the input folder, or the input file's folder."""
    path = Path(getattr(source, "source", source))
    return path if path.is_dir() else path.parent
