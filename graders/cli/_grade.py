"""`gradekit grade`: one rubric over a CSV/JSONL/Parquet file, one output row per input row, resumably."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from ._common import fail, json_option, map_option, warnings_to_stderr
from ._grade_plan import Command, GradeArgs, check, parse, plan_of, resolve
from ._judge_options import JudgeOptions, judge_options

if TYPE_CHECKING:  # the library (openai, pyarrow, ...) loads when the command runs, not for --help
    from ..grading._grade import GradePlan, GradeRun
    from ..runs._io import RunInput


@judge_options
def grade(
    input: Path = typer.Argument(..., help="CSV, JSONL or Parquet file of rows to grade, or a folder of them (read as one input in sorted path order; see docs/file-runs.md)."),
    rubric: str = typer.Option(None, "-r", "--rubric", help="Rubric name (see `gradekit rubrics`) or path to a .yaml spec."),
    grader_file: Path = typer.Option(None, "--grader", help="Instead of a rubric: a grader config (.yaml/.json: string match, python, composite, LLM; see `gradekit validate`)."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file; .csv, .jsonl or .parquet decides the format."),
    mapping: list[str] = map_option("VAR=COLUMN: read rubric variable VAR (with --grader: a sample path such as response or references.answer) from COLUMN (repeatable)."),
    json_output: bool = json_option("summary"),
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
    args = GradeArgs(**locals())  # the command line as one value, which each step below reads
    warnings_to_stderr()
    command = parse(args)  # the options' own rules, the rubric and the mapping (exit 2)
    source = resolve(command)  # the input, resolved once (exit 2)
    check(command)  # the rules between the options, the rubric and the run's kind (exit 2)
    plan = plan_of(command)  # the run as the library takes it
    run = _call(command, plan, source)  # the library picks the run and fills its record
    _print(command, run)


def _call(command: Command, plan: GradePlan, source: RunInput) -> GradeRun:
    """``runs.grade`` with the judge options' parts; what stops a run becomes its exit status (2 bad input or option,
    3 a broken judge, 130 Ctrl-C)."""
    from gradekit.judge._breaker import BreakerTripped

    from .._config import GraderConfigError
    from ..grading._grade import GradeError, grade
    from ..runs._io import InputError
    from ..runs._provider_batch import BatchRunError
    from ._grade_print import Show, breaker_exit
    from ._progress import already_written

    a, opts, model = command.args, command.args.opts, command.model
    err = Console(stderr=True)
    show = Show(err, bar=sys.stderr.isatty() and not a.json_output, every=0.0 if sys.stderr.isatty() else a.progress_every,
                done=0 if a.retry_errors else already_written(a.output, a.restart))

    def say(message: str) -> None:  # a Batch API run's steps; none with --json: stdout and stderr stay machine-readable
        err.print(f"batch: {message}", highlight=False, markup=False, soft_wrap=True)

    try:
        with opts.traffic():  # --record/--replay: the cassette held open around the run
            return grade(source, a.output, plan, budget=opts.budget(), limiter=functools.partial(opts.limiter, model),
                         file_judge=functools.partial(opts.file_spec, model), progress=show.progress,
                         on_event=None if a.json_output else say)
    except (InputError, BatchRunError, GraderConfigError, GradeError) as e:
        raise fail(str(e)) from e
    except BreakerTripped as e:
        raise breaker_exit(e, a.output, a.json_output, err) from None
    except KeyboardInterrupt:
        # Without a cache the rows judged but not yet written have nowhere to come back from: do not promise hits.
        again = "rows already judged come back from the cache" if plan.cache is not False else \
            "without a cache, rows not yet written are judged again"
        err.print(f"interrupted: the rows finished so far are saved in {a.output}; run the same command again to resume "
                  f"({again}).", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None


def _print(command: Command, run: GradeRun) -> None:
    """The record on the terminal or as --json, then the exit status: 1 when some rows carry an error."""
    from ._grade_print import report

    a = command.args
    what = {"rubric": command.spec.name} if command.spec is not None else {"grader": str(a.grader_file)}
    raise report(run, a.output, what, a.json_output, "jury" if len(a.opts.model) > 1 else "cascade")
