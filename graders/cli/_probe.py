"""`gradekit probe`: does the judge reward content-free openers, padding, or the position of an output?"""

from __future__ import annotations

from pathlib import Path

import typer

from ._common import fail, json_option, map_option, print_json, run_judging, warnings_to_stderr
from ._judge_options import JudgeOptions, judge_options

RESPONSE_NAMES = ("prediction", "response", "answer", "output", "completion")


@judge_options
def probe(
    rubric: str = typer.Option(..., "-r", "--rubric", help="Rubric name (see `gradekit rubrics`) or path to a .yaml spec."),
    data: Path = typer.Option(..., "--data", help="CSV, JSONL or Parquet rows the rubric can grade (their real responses)."),
    field: str = typer.Option(None, "--field", help="The rubric variable holding the graded response [default: prediction/response/answer/output, or the first output of a pairwise rubric]."),
    mapping: list[str] = map_option(),
    limit: int = typer.Option(None, "--limit", help="Probe only the first N rows."),
    tolerance: float = typer.Option(0.0, "--tolerance", help="A probe fails when its weakness rate is above this share (0-1)."),
    json_output: bool = json_option("reports"),
    *,
    opts: JudgeOptions,
) -> None:
    """Judge every row as given and perturbed: the response replaced by content-free "master key" openers
    (":", "Thought process:", "Let's solve this problem step by step.", "Solution", "解：", ...), padded
    with irrelevant text, and (pairwise rubrics) with its two outputs swapped. Reports per probe how often
    the judge was fooled: for a master key, the rate of top scores (false positives).

    Exit status: 0 every probe passed, 3 the judge failed at least one probe, 1 no probe failed but some
    judge requests did (the report counts them), 2 the run could not start (bad file, rubric or option),
    130 interrupted.
    """

    from gradekit.judge import RubricError, load_rubric

    from ..calibration._probes import master_keys, position_swap, run_probes, verbosity
    from ..runs._file import resolve_mapping
    from ..runs._io import InputError, read_rows

    warnings_to_stderr()
    opts.check()
    model = opts.one_model("probe")
    if not 0 <= tolerance <= 1:
        raise fail(f"--tolerance is a share between 0 and 1, not {tolerance}")
    if limit is not None and limit < 1:
        raise fail(f"--limit must be at least 1, not {limit}")
    try:
        spec = load_rubric(rubric)
        columns = resolve_mapping(spec, mapping)
        target = field or (spec.pairwise.first if spec.pairwise is not None
                           else next((v for v in RESPONSE_NAMES if v in spec.variables), None))
        if target is None or target not in spec.variables:
            raise RubricError(f"rubric {spec.name!r}: name the graded response with --field (variables: {', '.join(spec.variables)})")
        if not data.exists():
            raise InputError(f"{data}: no such file")
        rows = []
        for row in read_rows(data):
            if isinstance(row, Exception):
                raise InputError(f"data {row}")
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
        if not rows:
            raise InputError(f"{data}: no rows")
    except (RubricError, InputError, ValueError) as e:
        raise fail(str(e)) from e
    limiter = opts.limiter(model)
    budget = opts.budget()
    probes = master_keys(target) + [verbosity(target)] + ([position_swap(spec)] if spec.pairwise is not None else [])
    cache = opts.open_cache()

    async def run():
        async with opts.judge(model, limiter=limiter, cache=cache, budget=budget) as judge:
            return judge.model, await run_probes(judge, spec, rows, probes, mapping=columns)

    used, reports = run_judging(run, cache, opts.traffic(),
                                interrupted="interrupted; run the same command again: verdicts already given come from the cache")
    passed = [r.weakness_rate is None or r.weakness_rate <= tolerance for r in reports]
    failed = [r for r, ok in zip(reports, passed) if not ok]
    errors = sum(r.errors for r in reports)
    if json_output:
        print_json({"rubric": spec.name, "model": used, "field": target, "rows": len(rows), "tolerance": tolerance,
                    "probes": [{**r.model_dump(), "passed": ok} for r, ok in zip(reports, passed)],
                    "failed": len(failed), "passed": len(reports) - len(failed)})
    else:
        _print(spec.name, used, target, len(rows), reports, passed)
    raise typer.Exit(3 if failed else 1 if errors else 0)


def _print(rubric: str, model: str, field: str, rows: int, reports, passed: list[bool]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    table = Table(title=f"probes of judge {model} with rubric {rubric}: {rows} rows, response variable {field!r}")
    for heading in ("probe", "variant", "judged", "errors", "fooled", "what fooled means", "result"):
        table.add_column(heading, justify="right" if heading in ("judged", "errors", "fooled") else "left")
    meaning = {"not_top": "top score for no answer", "same": "verdict changed", "lowest": "above the lowest label"}
    failed = [r for r, ok in zip(reports, passed) if not ok]
    for r, ok in zip(reports, passed):
        rate = "n/a" if r.weakness_rate is None else f"{r.weakness_rate:.1%}"
        table.add_row(r.probe, r.variant or "", str(r.judged), str(r.errors), rate, meaning[r.expect],
                      "[red]FAIL[/red]" if not ok else "[green]pass[/green]" if r.judged else "n/a")
    console.print(table)
    if failed and len(failed) == len(reports):
        console.print(f"[bold red]the judge failed every probe ({len(reports)}): its top scores cannot be trusted as rewards[/bold red]")
    elif failed:
        console.print(f"[yellow]the judge failed {len(failed)} of {len(reports)} probes[/yellow]")
    else:
        console.print(f"[green]the judge passed all {len(reports)} probes[/green]")
