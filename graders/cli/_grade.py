"""`gradekit grade`: one rubric over a CSV/JSONL/Parquet file, one output row per input row, resumably."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from ._common import fail, print_json

if TYPE_CHECKING:  # the library (openai, pyarrow, ...) loads when the command runs, not for --help
    from judge import Budget, Judge

    from ..calibration._pairwise import PairwiseRunSummary
    from ..runs._file import RunSummary


def grade(
    input: Path = typer.Argument(..., help="CSV, JSONL or Parquet file of rows to grade."),
    rubric: str = typer.Option(None, "-r", "--rubric", help="Rubric name (see `gradekit rubrics`) or path to a .yaml spec."),
    grader_file: Path = typer.Option(None, "--grader", help="Instead of a rubric: a grader config (.yaml/.json: string match, python, composite, LLM; see `gradekit validate`)."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file; .csv, .jsonl or .parquet decides the format."),
    model: str = typer.Option(None, "--model", envvar="GRADEKIT_MODEL", help="Judge model [default: gpt-4o-mini]."),
    base_url: str = typer.Option(None, "--base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible API root, e.g. http://localhost:8000/v1."),
    api_key: str = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="API key (read from OPENAI_API_KEY by default).", show_default=False),
    rps: float = typer.Option(None, "--rps", envvar="GRADEKIT_RPS", help="Requests per second for the whole process."),
    tpm: float = typer.Option(None, "--tpm", envvar="GRADEKIT_TPM", help="Tokens per minute for the whole process."),
    concurrency: int = typer.Option(16, "--concurrency", envvar="GRADEKIT_CONCURRENCY", help="Requests in flight at once."),
    limiter_url: str = typer.Option(None, "--limiter", envvar="GRADEKIT_LIMITER", help="Share --rps/--tpm and Retry-After pauses with other processes through Redis: redis://host:port/db [default: this process only]."),
    no_adapt: bool = typer.Option(False, "--no-adapt", envvar="GRADEKIT_NO_ADAPT", help="Do not pace to the limit the provider's replies show (x-ratelimit-* headers, 429s); pace only to --rps/--tpm, if given."),
    limiter_key: str = typer.Option(None, "--limiter-key", envvar="GRADEKIT_LIMITER_KEY", help="Name of the shared budget in Redis [default: --base-url|--model as given]."),
    timeout: float = typer.Option(60.0, "--timeout", envvar="GRADEKIT_TIMEOUT", help="Seconds per judge request."),
    cache_path: Path = typer.Option(None, "--cache", help="SQLite response cache [default: $GRADEKIT_CACHE, else the user cache dir]."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the response cache."),
    mapping: list[str] = typer.Option([], "--map", help="VAR=COLUMN: read rubric variable VAR (with --grader: a sample path such as response or references.answer) from COLUMN (repeatable)."),
    record: Path = typer.Option(None, "--record", help="Record the run's judge traffic to this vcrpy cassette (no cache)."),
    replay: Path = typer.Option(None, "--replay", help="Answer every judge request from this cassette, with no network (no cache)."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON (with a version field)."),
    no_swap: bool = typer.Option(False, "--no-swap", help="Pairwise rubrics: ask only the input order, not the swapped one too."),
    on_conflict: str = typer.Option("tie", "--on-conflict", help="Pairwise rubrics: when the two orders disagree: tie, first, or third (needs --tiebreak-model)."),
    tiebreak_model: str = typer.Option(None, "--tiebreak-model", help="Pairwise rubrics: the model asked a third time when the orders disagree."),
    max_cost: float = typer.Option(None, "--max-cost", help="Stop sending requests once this many USD are spent (needs a price for --model; see --prices)."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Stop sending requests once this many prompt + completion tokens are spent."),
    prices_path: Path = typer.Option(None, "--prices", envvar="GRADEKIT_PRICES", help="YAML/JSON {model: {input: USD per 1M tokens, output: ...}} merged over the built-in price table."),
    restart: bool = typer.Option(False, "--restart", help="Ignore the checkpoint of an earlier run into OUTPUT and grade every row again."),
    batch: bool = typer.Option(False, "--batch", help="Send the judge requests through the provider's Batch API (cheaper, slower); resumable from OUTPUT.batch.json."),
    batch_poll: float = typer.Option(10.0, "--batch-poll", help="With --batch: seconds before the first re-poll, doubling up to 5 minutes."),
    group_by: str = typer.Option(None, "--group-by", help="COLUMN whose rows are one prompt's responses: report the reward spread (all-equal groups, mean, variance, too easy / too hard)."),
) -> None:
    """Grade every row of INPUT with a rubric (or a grader config) and write OUTPUT with score, status and error columns.

    An interrupted run (Ctrl-C, a crash, SIGKILL) continues where it stopped when the same command
    is run again: OUTPUT.checkpoint.json says how much of OUTPUT is final, and rows judged but not
    yet written come back from the cache. A run over a finished OUTPUT does nothing and says so.

    Without --rps/--tpm the run paces itself to the limit the provider's replies show: its
    x-ratelimit-* headers, else its 429s (AIMD); --no-adapt turns that off. See docs/pacing.md.

    Exit status: 0 when every row was judged, 1 when some rows carry an error (the output still has
    one row per input row), 2 when the run could not start (bad file, rubric or option).
    """
    import asyncio

    from judge import Budget, Judge, JudgeCache, RubricError, limiter_from_url, load_prices, load_rubric
    from judge._client import DEFAULT_MODEL

    from .._config import GraderConfigError
    from ..calibration._pairwise import PairwiseRunSummary
    from ..runs._cassette import cassette
    from ..runs._file import RunSummary, resolve_mapping
    from ..runs._io import InputError, file_format
    from ..runs._provider_batch import BatchRunError

    if (rubric is None) == (grader_file is None):
        raise fail("give a rubric (-r/--rubric) or a grader config (--grader), one of the two")
    if record and replay:
        raise fail("--record and --replay exclude each other")
    if cache_path and no_cache:
        raise fail("--cache and --no-cache exclude each other")
    # Read here rather than as the option's envvar: --no-cache must win over a GRADEKIT_CACHE in the shell.
    env_cache = os.environ.get("GRADEKIT_CACHE")
    if cache_path is None and env_cache and not no_cache and not (record or replay):
        cache_path = Path(env_cache)
    try:
        spec = load_rubric(rubric) if rubric is not None else None
        variables = resolve_mapping(spec, mapping) if spec is not None else sample_mapping(mapping)
        file_format(input)
        file_format(output)
        if not input.exists():
            raise InputError(f"{input}: no such file")
        if output.resolve() == input.resolve():
            raise InputError(f"{output}: the output would overwrite the input")
    except (RubricError, InputError) as e:
        raise fail(str(e)) from e
    if on_conflict not in ("tie", "first", "third") or (on_conflict == "third") != bool(tiebreak_model):
        raise fail("--on-conflict is tie, first, or third together with --tiebreak-model")
    if replay and not replay.exists():
        raise fail(f"{replay}: no such cassette to replay")
    if batch and (record or replay):
        raise fail("--batch sends no live requests: it excludes --record and --replay")
    if batch and (max_cost is not None or max_tokens is not None):
        raise fail("--max-cost and --max-tokens cap live requests; a --batch run is priced by the provider when it is submitted")
    if spec is None and (batch or tiebreak_model):
        raise fail("--batch and --tiebreak-model work with a rubric (-r), not with --grader")

    # A cassette must see every request, so record/replay bypass the cache unless --cache is explicit.
    cache = None if no_cache or ((record or replay) and cache_path is None) else JudgeCache(cache_path)
    try:
        # The budget is named by the endpoint, so runs against another provider or model never share one by accident.
        limiter = limiter_from_url(limiter_url, rps=rps, tpm=tpm, concurrency=concurrency, adapt=not no_adapt,
                                   key=limiter_key or f"{base_url or 'default'}|{model or 'default'}")
    except (ValueError, ConnectionError) as e:  # a bad URL, or a Redis that does not answer: before any request
        raise fail(str(e)) from e
    try:
        # Always a Budget: without caps it only counts, so every summary shows what was spent and saved.
        budget = Budget(max_cost_usd=max_cost, max_tokens=max_tokens, prices=load_prices(prices_path))
    except ValueError as e:
        raise fail(str(e)) from e

    def make_judge() -> Judge:
        return Judge(model, base_url=base_url, api_key=api_key or ("replay" if replay else None), timeout=timeout, limiter=limiter,
                     cache=cache, budget=budget)

    try:
        # A grader config may need no judge at all: its LLM nodes build one on first need.
        judge = make_judge() if spec is not None else None
        tiebreak = Judge(tiebreak_model, base_url=base_url, api_key=api_key or ("replay" if replay else None),
                         timeout=timeout, limiter=limiter, cache=cache) if tiebreak_model else None
    except ValueError as e:
        raise fail(str(e)) from e

    traffic = cassette(record or replay, "record" if record else "replay") if (record or replay) else contextlib.nullcontext()
    err = Console(stderr=True)
    show_progress = sys.stderr.isatty() and not json_output
    try:
        with traffic:
            if spec is None:
                endpoint = {"model": model or DEFAULT_MODEL, "base_url": base_url}
                summary = asyncio.run(_run_grader(grader_file, make_judge, endpoint, input, output, variables, concurrency,
                                                  show_progress, err, group_by, not restart))
            elif batch:
                summary = asyncio.run(_run_batch(judge, spec, input, output, variables, batch_poll, group_by, not restart,
                                                 None if json_output else err))
            elif spec.pairwise is not None:
                summary = asyncio.run(_run_pairwise(judge, spec, input, output, variables, not no_swap, on_conflict, tiebreak))
            else:
                summary = asyncio.run(_run(judge, spec, input, output, variables, show_progress, err, group_by, not restart))
    except (InputError, BatchRunError, GraderConfigError) as e:
        raise fail(str(e)) from e
    finally:
        if cache is not None:
            cache.close()
    pacing = limiter.pacing()  # the rate the run held at its end, learnt or told
    if isinstance(summary, RunSummary):
        _add_money(summary, budget, judge.model if judge is not None else (model or DEFAULT_MODEL))
        summary.pacing = pacing
    if json_output:
        what = {"rubric": spec.name} if spec is not None else {"grader": str(grader_file)}
        print_json({"output": str(output), **what, "model": judge.model if judge is not None else model, **summary.model_dump(),
                    "pacing": pacing.model_dump()})
    elif isinstance(summary, PairwiseRunSummary):
        _print_pairwise(summary, output, Console(highlight=False))
    else:
        _print_summary(summary, output, Console())
    raise typer.Exit(1 if summary.errors or getattr(summary, "skipped", 0) else 0)


async def _run(judge: Judge, spec, source: Path, destination: Path, variables: dict[str, str], show_progress: bool, err: Console,
               group_by: str | None = None, resume: bool = True) -> RunSummary:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..runs._file import grade_file
    from ..runs._io import count_rows

    async with judge:
        if not show_progress:
            return await grade_file(judge, spec, source, destination, variables, group_by=group_by, resume=resume)
        total = count_rows(source)
        columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task("grade", total=total)
            return await grade_file(judge, spec, source, destination, variables, on_row=lambda _: progress.advance(task),
                                    group_by=group_by, resume=resume)


def _add_money(summary: RunSummary, budget: Budget, model: str) -> None:
    """Cost of the output's tokens at the table's prices, what the cache saved, and why rows were skipped."""
    from judge import cost_usd
    from judge._budget import price_of

    price = price_of(budget.prices, model)
    if price is not None:
        summary.cost_usd = cost_usd(budget.prices, model, summary.prompt_tokens, summary.completion_tokens)
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
                      destination: Path, mapping: dict[str, str], concurrency: int, show_progress: bool, err: Console,
                      group_by: str | None, resume: bool) -> RunSummary:
    """A grader config over the file; its LLM nodes share the command line's judge, limiter and cache.

    The checkpoint is keyed by the config's bytes and the judge endpoint the command line names
    (``--model``, ``--base-url`` and their environment variables), so another judge starts over.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .._config import load_grader
    from ..runs._file import grade_file_with
    from ..runs._io import InputError, count_rows

    if not config.exists():
        raise InputError(f"{config}: no such grader config")
    grader = load_grader(config, judge=make_judge)
    settings = {"config": hashlib.sha256(config.read_bytes()).hexdigest(), **endpoint}
    try:
        run = functools.partial(grade_file_with, grader, source, destination, mapping, concurrency=concurrency + 2,
                                settings=settings, group_by=group_by, resume=resume)
        if not show_progress:
            return await run()
        columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task("grade", total=count_rows(source))
            return await run(on_row=lambda _: progress.advance(task))
    finally:
        await grader.aclose()


async def _run_batch(judge: Judge, spec, source: Path, destination: Path, variables: dict[str, str], poll: float,
                     group_by: str | None, resume: bool, err: Console | None) -> RunSummary:
    from ..runs._provider_batch import grade_file_batch

    def say(message: str) -> None:
        if err is not None:  # None with --json: stdout and stderr stay machine-readable
            err.print(f"batch: {message}", highlight=False, markup=False, soft_wrap=True)

    async with judge:
        return await grade_file_batch(judge, spec, source, destination, variables, poll_interval=poll, group_by=group_by,
                                      resume=resume, on_event=say)


async def _run_pairwise(judge: Judge, spec, source: Path, destination: Path, variables: dict[str, str], swap: bool,
                        on_conflict: str, tiebreak: Judge | None) -> PairwiseRunSummary:
    from ..calibration._pairwise import grade_pairwise_file

    async with judge:
        try:
            return await grade_pairwise_file(judge, spec, source, destination, variables, swap=swap,
                                             on_conflict=on_conflict, tiebreak=tiebreak)  # type: ignore[arg-type]
        finally:
            if tiebreak is not None:
                await tiebreak.aclose()


def _print_pairwise(s: PairwiseRunSummary, output: Path, console: Console) -> None:
    console.print(f"pairs {s.rows} ({s.ok} judged, {s.errors} errors) -> {output}")
    console.print("winners " + (", ".join(f"{k}: {v}" for k, v in s.winners.items()) or "-")
                  + "; decided by " + (", ".join(f"{k} {v}" for k, v in s.decided_by.items()) or "-"))
    if s.agreement is not None:
        console.print(f"orders agree on {s.agreement:.1%} of pairs")
    r = s.report
    if r is not None and r.acc is not None and r.agr is not None:
        console.print(f"Acc {r.acc * 100:.1f} / Agr {r.agr * 100:.1f}  (against column {s.label_column!r}, LLMBar's convention)")
    console.print(f"parse failures {s.parse_failure_rate:.1%}; requests {s.requests} sent, {s.cache_hits} cache hits; "
                  f"tokens {s.prompt_tokens} prompt + {s.completion_tokens} completion; {s.wall_s:.2f} s")
    for example in s.error_examples:
        console.print(f"  {example}", style="red", markup=False)


def _print_summary(s: RunSummary, output: Path, console: Console) -> None:
    if s.already_complete:
        console.print(f"{output} is already complete ({s.rows} rows); nothing to do. Use --restart to grade again.", highlight=False)
    elif s.resumed_from:
        console.print(f"resumed: {s.resumed_from} rows were already in {output} from an interrupted run", highlight=False)
    table = Table(show_header=False, box=None, pad_edge=False)
    skipped = f", {s.skipped} skipped" if s.skipped else ""
    table.add_row("rows", f"{s.rows} ({s.ok} judged, {s.errors} errors{skipped}) -> {output}")
    table.add_row("mean score", "n/a" if s.mean_score is None else f"{s.mean_score:.4f}")
    table.add_row("labels", ", ".join(f"{k}: {v}" for k, v in s.label_counts.items()) or "-")
    table.add_row("parse failures", f"{s.parse_failure_rate:.1%}")
    table.add_row("errors by kind", ", ".join(f"{k}: {v}" for k, v in s.errors_by_kind.items()) or "-")
    table.add_row("tokens", f"{s.prompt_tokens} prompt + {s.completion_tokens} completion")
    cost = "n/a (no price for the model: --prices FILE)" if s.cost_usd is None else f"${s.cost_usd:.4f} estimated"
    saved = f"; cache hits saved {s.saved_tokens} tokens" + (f", ${s.saved_usd:.4f}" if s.saved_usd is not None else "") if s.saved_tokens else ""
    table.add_row("cost", cost + saved)
    table.add_row("requests", f"{s.requests} sent, {s.cache_hits} cache hits")
    table.add_row("wall time", f"{s.wall_s:.2f} s ({s.judgements_per_s:.1f} judgements/s)")
    if s.pacing is not None:
        held = "no limit" if s.pacing.rps is None else f"{s.pacing.rps:g} requests/s at the end"
        table.add_row("pacing", f"{s.pacing.mode}: {held}")
    if s.spread is not None and s.spread.rewards:
        sp = s.spread
        equal = "n/a" if sp.all_equal_share is None else f"{sp.all_equal_share:.1%}"
        table.add_row("reward spread", f"{sp.groups} groups; all-equal {equal} ({sp.all_equal_groups}); mean {sp.mean:.4f}, "
                      f"variance {sp.variance:.4f}; pass rate {sp.pass_rate:.1%}")
        for advice in sp.advice:
            table.add_row("", f"[yellow]{advice}[/yellow]")
    console.print(table)
    if s.budget:
        console.print(f"[yellow]{s.skipped} rows skipped: {s.budget}. Run the same command with a larger cap to grade them;"
                      " the rows already judged come from the cache.[/yellow]", highlight=False)
    for example in s.error_examples:
        console.print(f"  [red]{example}[/red]", markup=True, highlight=False)
