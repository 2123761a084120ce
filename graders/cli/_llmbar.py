"""`gradekit llmbar`: grade an LLMBar subset against a replay of GPT-4's or ChatGPT's recorded replies.

The zero-setup demo: no key, no network. The recorded completions are served by the loopback fake
provider on 127.0.0.1 and the normal pairwise grading path (Judge client, cache, parse, swap,
calibration) runs against them, ending with LLMBar's Acc / Agr next to the published figures.
"""

from __future__ import annotations

import json
import math
import signal
import threading
from pathlib import Path

import typer
from rich.console import Console

from ._common import fail, json_option, print_json


def llmbar(
    subset: str = typer.Option("Natural", "--subset", help="Natural, Neighbor, GPTInst, GPTOut, Manual, MT-Bench, FairEval or LLMEval2; with --serve also all (every subset that recorded the strategy, for `gradekit meta-eval`)."),
    judge: str = typer.Option("GPT-4", "--judge", help="Recorded judge: GPT-4 or ChatGPT."),
    strategy: str = typer.Option("Vanilla_NoRules", "--strategy", help="Recorded strategy whose replies are a bare verdict: Vanilla, Vanilla_NoRules, Vanilla_1shot, Vanilla_2shot, Metrics, Reference, Metrics_Reference."),
    rubric: str = typer.Option("llmbar_pairwise", "-r", "--rubric", help="Pairwise rubric to grade with."),
    output: Path = typer.Option(None, "-o", "--output", help="Write the graded rows here (.jsonl or .csv) [default: not kept]."),
    data: Path = typer.Option(None, "--data", help="The LLMBar folder [default: the copy shipped with gradekit]."),
    cache_path: Path = typer.Option(None, "--cache", help="SQLite response cache [default: none; replies are local]."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight at once."),
    export_rows: Path = typer.Option(None, "--export-rows", help="Only write the subset as grading rows (JSONL) and exit."),
    serve: bool = typer.Option(False, "--serve", help="Only serve the replay on 127.0.0.1 (prints the base URL) until Ctrl-C."),
    json_output: bool = json_option("result"),
) -> None:
    """Reproduce LLMBar's published Acc / Agr offline from the paper's recorded judge outputs.

    Serve-only mode lets `gradekit grade` itself run against the replay:
    `gradekit llmbar --serve` in one terminal, then `gradekit grade ROWS -r llmbar_pairwise
    --base-url URL --model gpt-4 -o out.jsonl` in another (ROWS from `--export-rows`).
    """
    import asyncio

    from gradekit.judge import JudgeCache, RubricError, load_rubric

    from ..calibration._llmbar import LLMBarError, grading_rows, replay_grade, resolve_run

    try:
        if serve and subset == "all":
            _serve_all(judge, strategy, data)
            return
        run = resolve_run(subset, judge, strategy, data)
        if export_rows is not None:
            export_rows.parent.mkdir(parents=True, exist_ok=True)
            with export_rows.open("w", encoding="utf-8") as handle:
                for row in grading_rows(run.subset, data):
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            typer.echo(f"wrote {export_rows}")
            return
        if serve:
            _serve(run, data)
            return
        if run.kind != "comparison" or run.strategy == "CoT":
            # CoT/Swap replies explain first and Swap's published figures come from a synthesis step;
            # Rating scores one output at a time. None of them answers a verdict-only pairwise rubric.
            raise LLMBarError(f"{run.judge}/{run.strategy}: its recorded replies do not answer a verdict-only pairwise rubric; "
                              "use Vanilla, Vanilla_NoRules, Vanilla_1shot, Vanilla_2shot, Metrics, Reference or Metrics_Reference "
                              "(`gradekit llmbar --serve` still replays any comparison strategy)")
        spec = load_rubric(rubric)
        if spec.pairwise is None:
            raise RubricError(f"rubric {spec.name!r} is not pairwise; use llmbar_pairwise or arena_hard_pairwise")
        cache = JudgeCache(cache_path) if cache_path is not None else None
        try:
            result = asyncio.run(replay_grade(run, rubric=spec, output=output, root=data, cache=cache, concurrency=concurrency))
        finally:
            if cache is not None:
                cache.close()
    except (LLMBarError, RubricError, ValueError) as e:
        raise fail(str(e)) from e
    results, stats = result.summary.results, result.summary.stats
    report = results.report
    if json_output:
        print_json(result.model_dump())
        raise typer.Exit(1 if results.errors else 0)
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"{run.subset.replace('__', '/')}: {results.rows} pairs, judge {run.judge} ({result.model}) "
                  f"replayed from its recorded {run.strategy} outputs, rubric {result.rubric}, both orders")
    console.print(f"{stats.usage.requests} requests, {stats.cache_hits} cache hits, {results.errors} errors, "
                  f"{stats.wall_s:.2f} s" + (f" -> {output}" if output else ""))
    examples = results.error_examples
    for example in examples[:3]:  # what failed, as grade's summary shows it
        console.print(f"  {example}")
    if report is not None and report.n and report.both_judged == 0:
        console.print(f"Acc n/a / Agr n/a: no pair was judged in both orders ({results.errors} of {results.rows} pairs failed"
                      + (f"; e.g. {examples[0]}" if examples else "") + ")")
        raise typer.Exit(1)
    if report is None or report.acc is None or report.agr is None:
        console.print("no Acc / Agr: the rows carry no gold label")
        raise typer.Exit(1)
    acc, agr = report.acc * 100, report.agr * 100
    console.print(f"Acc {acc:.1f} / Agr {agr:.1f}")
    same = math.isclose(acc, result.published_acc, abs_tol=1e-9) and math.isclose(agr, result.published_agr, abs_tol=1e-9)
    console.print(f"published (Zeng et al., ICLR 2024): Acc {result.published_acc:.1f} / Agr {result.published_agr:.1f}"
                  f" -> {'reproduced' if same else 'differs'}")
    if report.first_position_win_rate is not None:
        console.print(f"position bias: the first-shown output won {report.first_position_win_rate:.1%} of "
                      f"{report.decisive_verdicts} verdicts; {report.conflicts} pairs flipped with the order")
    raise typer.Exit(1 if results.errors else 0)


def _serve_all(judge: str, strategy: str, data: Path | None) -> None:
    from ..calibration._llmbar import judge_model, suite_replay_responder

    responder = suite_replay_responder(judge, strategy, None, data)  # LLMBarError before the server starts
    _serve_until_stopped(responder, judge_model(judge, strategy, data), f"{judge}/{strategy} on every subset that recorded it")


def _serve(run, data: Path | None) -> None:
    from ..calibration._llmbar import judge_model, replay_responder

    _serve_until_stopped(replay_responder(run, data), judge_model(run.judge, run.strategy, data),
                         f"{run.judge}/{run.strategy} on {run.subset}")


def _serve_until_stopped(responder, model: str, what: str) -> None:
    from gradekit.judge.testing import FakeProvider

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeProvider(responder=responder, model=model) as server:
        typer.echo(server.base_url)
        typer.echo(f"replaying {what}; Ctrl-C stops", err=True)
        while not stop.wait(0.2):
            pass
