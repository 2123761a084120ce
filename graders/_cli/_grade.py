"""`gradekit grade`: one rubric over a CSV/JSONL file, one output row per input row."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from judge import Judge, JudgeCache, Limiter, RubricError, load_rubric

from .._batch import RunSummary, grade_file, resolve_mapping
from .._pairwise import PairwiseRunSummary, grade_pairwise_file
from .._cassette import cassette
from .._io import InputError, count_rows, file_format
from ._common import fail, print_json


def grade(
    input: Path = typer.Argument(..., help="CSV or JSONL file of rows to grade."),
    rubric: str = typer.Option(..., "-r", "--rubric", help="Rubric name (see `gradekit rubrics`) or path to a .yaml spec."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file; .csv or .jsonl decides the format."),
    model: str = typer.Option(None, "--model", envvar="GRADEKIT_MODEL", help="Judge model [default: gpt-4o-mini]."),
    base_url: str = typer.Option(None, "--base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible API root, e.g. http://localhost:8000/v1."),
    api_key: str = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="API key (read from OPENAI_API_KEY by default).", show_default=False),
    rps: float = typer.Option(None, "--rps", envvar="GRADEKIT_RPS", help="Requests per second for the whole process."),
    tpm: float = typer.Option(None, "--tpm", envvar="GRADEKIT_TPM", help="Tokens per minute for the whole process."),
    concurrency: int = typer.Option(16, "--concurrency", envvar="GRADEKIT_CONCURRENCY", help="Requests in flight at once."),
    timeout: float = typer.Option(60.0, "--timeout", envvar="GRADEKIT_TIMEOUT", help="Seconds per judge request."),
    cache_path: Path = typer.Option(None, "--cache", envvar="GRADEKIT_CACHE", help="SQLite response cache [default: the user cache dir]."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the response cache."),
    mapping: list[str] = typer.Option([], "--map", help="VAR=COLUMN: read rubric variable VAR from column COLUMN (repeatable)."),
    record: Path = typer.Option(None, "--record", help="Record the run's judge traffic to this vcrpy cassette (no cache)."),
    replay: Path = typer.Option(None, "--replay", help="Answer every judge request from this cassette, with no network (no cache)."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON (with a version field)."),
    no_swap: bool = typer.Option(False, "--no-swap", help="Pairwise rubrics: ask only the input order, not the swapped one too."),
    on_conflict: str = typer.Option("tie", "--on-conflict", help="Pairwise rubrics: when the two orders disagree: tie, first, or third (needs --tiebreak-model)."),
    tiebreak_model: str = typer.Option(None, "--tiebreak-model", help="Pairwise rubrics: the model asked a third time when the orders disagree."),
    group_by: str = typer.Option(None, "--group-by", help="COLUMN whose rows are one prompt's responses: report the reward spread (all-equal groups, mean, variance, too easy / too hard)."),
) -> None:
    """Grade every row of INPUT with a rubric and write OUTPUT with score, label, status and error columns.

    Exit status: 0 when every row was judged, 1 when some rows carry an error (the output still has
    one row per input row), 2 when the run could not start (bad file, rubric or option).
    """
    if record and replay:
        raise fail("--record and --replay exclude each other")
    if cache_path and no_cache:
        raise fail("--cache and --no-cache exclude each other")
    try:
        spec = load_rubric(rubric)
        variables = resolve_mapping(spec, mapping)
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

    # A cassette must see every request, so record/replay bypass the cache unless --cache is explicit.
    cache = None if no_cache or ((record or replay) and cache_path is None) else JudgeCache(cache_path)
    limiter = Limiter(rps=rps, tpm=tpm, concurrency=concurrency)
    try:
        judge = Judge(model, base_url=base_url, api_key=api_key or ("replay" if replay else None),
                      timeout=timeout, limiter=limiter, cache=cache)
        tiebreak = Judge(tiebreak_model, base_url=base_url, api_key=api_key or ("replay" if replay else None),
                         timeout=timeout, limiter=limiter, cache=cache) if tiebreak_model else None
    except ValueError as e:
        raise fail(str(e)) from e

    traffic = cassette(record or replay, "record" if record else "replay") if (record or replay) else contextlib.nullcontext()
    err = Console(stderr=True)
    show_progress = sys.stderr.isatty() and not json_output
    try:
        with traffic:
            if spec.pairwise is not None:
                summary = asyncio.run(_run_pairwise(judge, spec, input, output, variables, not no_swap, on_conflict, tiebreak))
            else:
                summary = asyncio.run(_run(judge, spec, input, output, variables, show_progress, err, group_by))
    except InputError as e:
        raise fail(str(e)) from e
    finally:
        if cache is not None:
            cache.close()
    if json_output:
        print_json({"output": str(output), "rubric": spec.name, "model": judge.model, **summary.model_dump()})
    elif isinstance(summary, PairwiseRunSummary):
        _print_pairwise(summary, output, Console(highlight=False))
    else:
        _print_summary(summary, output, Console())
    raise typer.Exit(1 if summary.errors else 0)


async def _run(judge: Judge, spec, source: Path, destination: Path, variables: dict[str, str], show_progress: bool, err: Console,
               group_by: str | None = None) -> RunSummary:
    async with judge:
        if not show_progress:
            return await grade_file(judge, spec, source, destination, variables, group_by=group_by)
        total = count_rows(source)
        columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=err, transient=True) as progress:
            task = progress.add_task("grade", total=total)
            return await grade_file(judge, spec, source, destination, variables, on_row=lambda _: progress.advance(task), group_by=group_by)


async def _run_pairwise(judge: Judge, spec, source: Path, destination: Path, variables: dict[str, str], swap: bool,
                        on_conflict: str, tiebreak: Judge | None) -> PairwiseRunSummary:
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
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("rows", f"{s.rows} ({s.ok} judged, {s.errors} errors) -> {output}")
    table.add_row("mean score", "n/a" if s.mean_score is None else f"{s.mean_score:.4f}")
    table.add_row("labels", ", ".join(f"{k}: {v}" for k, v in s.label_counts.items()) or "-")
    table.add_row("parse failures", f"{s.parse_failure_rate:.1%}")
    table.add_row("errors by kind", ", ".join(f"{k}: {v}" for k, v in s.errors_by_kind.items()) or "-")
    table.add_row("tokens", f"{s.prompt_tokens} prompt + {s.completion_tokens} completion")
    table.add_row("requests", f"{s.requests} sent, {s.cache_hits} cache hits")
    table.add_row("wall time", f"{s.wall_s:.2f} s ({s.judgements_per_s:.1f} judgements/s)")
    if s.spread is not None and s.spread.rewards:
        sp = s.spread
        equal = "n/a" if sp.all_equal_share is None else f"{sp.all_equal_share:.1%}"
        table.add_row("reward spread", f"{sp.groups} groups; all-equal {equal} ({sp.all_equal_groups}); mean {sp.mean:.4f}, "
                      f"variance {sp.variance:.4f}; pass rate {sp.pass_rate:.1%}")
        for advice in sp.advice:
            table.add_row("", f"[yellow]{advice}[/yellow]")
    console.print(table)
    for example in s.error_examples:
        console.print(f"  [red]{example}[/red]", markup=True, highlight=False)
