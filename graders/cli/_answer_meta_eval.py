"""`gradekit meta-eval --suite answer-verification`: the rules, a judge and the hybrid on human verdicts, per kind of answer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from ._common import fail, print_json, run_judging
from ._judge_options import JudgeOptions

MODES = ("symbolic", "judge", "hybrid")
ALIASES = {"rules": "symbolic"}  # the rules check every kind of answer (choice and string too), not only symbols
DEFAULT_RUBRIC = "answer_verification_3way"


def answer_meta_eval_command(suites: list[str], rubric: str | None, modes: list[str], require: str, check_timeout: float,
                             limit: int | None, json_output: bool, cascade: Path | None, opts: JudgeOptions) -> None:
    """Run and print the report. Exit status: 0, or 1 when a judge request failed on some row (the report
    counts them; a gold the symbolic check cannot parse, or a row the judge calls invalid, is not a failure),
    2 when the run cannot start, 130 when interrupted (the same command continues from the cache)."""

    from gradekit.judge import RubricError, load_rubric

    from .._answer_judge import REQUIRE, check_answer_rubric
    from ..calibration._answer_eval import answer_meta_eval, load_answer_suite
    from ..calibration._suites import SuiteError

    chosen = list(dict.fromkeys(ALIASES.get(m, m) for m in modes)) or list(MODES)
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise fail(f"--mode is symbolic (also: rules), judge or hybrid, not {', '.join(unknown)}")
    if require not in REQUIRE:
        raise fail(f"--require is both or either, not {require!r}")
    if not check_timeout > 0:
        raise fail("--check-timeout must be a positive number of seconds")
    wants_judge = "judge" in chosen or "hybrid" in chosen
    if len(set(opts.model)) != len(opts.model):
        raise fail(f"--model names a judge twice: {', '.join(opts.model)}")
    try:
        spec = load_rubric(rubric or DEFAULT_RUBRIC) if wants_judge else None
        if spec is not None:
            check_answer_rubric(spec)
        loaded = [load_answer_suite(s, limit=limit) for s in suites]
        if len({name for name, _ in loaded}) != len(loaded):
            raise SuiteError(f"--suite names a suite twice: {', '.join(suites)}")
        cascade_spec = None
        if cascade is not None and wants_judge:
            from gradekit.judge import CascadeSpec

            cascade_spec = CascadeSpec.read(cascade)
            if spec is not None:
                from ._panel import check_cascade_rubric

                check_cascade_rubric(cascade, cascade_spec, spec)
    except (RubricError, SuiteError, ValueError) as e:
        raise fail(str(e)) from e
    budget = opts.budget() if wants_judge else None
    limiter = opts.limiter(None) if wants_judge else None
    cache = opts.open_cache() if wants_judge else None

    async def run() -> list[Any]:
        from .._math_hybrid import symbolic_checker

        judges: list[Any] = []
        if wants_judge:
            judges = [opts.judge(m, limiter=limiter, cache=cache, budget=budget) for m in (opts.model or ([] if cascade_spec else [None]))]
            if cascade_spec is not None:
                from ._panel import build_panel

                judges.append(build_panel(JudgeOptions(**{**vars(opts), "model": []}), jury=None, quorum=None, spec=cascade_spec,
                                          cache=cache, budget=budget))
        symbolic, close_symbolic = symbolic_checker(check_timeout) if "symbolic" in chosen or "hybrid" in chosen else (None, None)
        try:
            reports = []
            for name, rows in loaded:
                report = await answer_meta_eval(name, rows, symbolic=symbolic, rubric=spec, judges=judges, require=require,  # type: ignore[arg-type]
                                                concurrency=max(1, opts.in_flight // 2) + 2)
                keep = {m for m in chosen}
                report.results = [r for r in report.results if r.mode in keep]
                reports.append(report)
            return reports
        finally:
            for j in judges:
                await j.aclose()
            if close_symbolic is not None:
                await close_symbolic()

    reports = run_judging(run, cache, opts.traffic(), errors=(ValueError, FileNotFoundError, RuntimeError), broken_exit=True,
                          interrupted="interrupted; run the same command again: rows already judged come from the cache")
    failed = sum(n for report in reports for row in report.results if row.mode == "judge"
                 for kind, n in row.undecided_by_kind.items() if kind != "judged_invalid")
    if json_output:
        print_json({"suites": [r.model_dump() for r in reports]})
    else:
        for report in reports:
            _print(report)
    raise typer.Exit(1 if failed else 0)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def _rate(interval: Any) -> str:
    if interval.rate is None:
        return "n/a (no rows)"
    return f"{_pct(interval.rate)}% [{_pct(interval.low)}, {_pct(interval.high)}] ({interval.count}/{interval.n})"


def _print(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 170)
    rubric = f", judge rubric {report.rubric} asked in both orders (require {report.require})" if report.rubric else ""
    console.print(f"{report.suite}: {report.n} rows (human: correct {report.human.get('correct', 0)}, incorrect "
                  f"{report.human.get('incorrect', 0)}){rubric}; {report.wall_s:.1f} s")
    table = Table(title="false positives: said correct, human incorrect; false negatives: said incorrect, human correct "
                        "(rates over decided rows, 95% Wilson interval)")
    for heading in ("mode", "judge", "decided", "accuracy %", "false positives", "false negatives", "undecided", "judge rows",
                    "requests", "judge calls saved"):
        table.add_column(heading, justify="left" if heading in ("mode", "judge") else "right")
    for r in report.results:
        undecided = str(r.undecided) + (f" ({', '.join(f'{k} {v}' for k, v in r.undecided_by_kind.items())})" if r.undecided else "")
        table.add_row(r.mode, r.judge or "-", f"{r.decided}/{r.n}", _pct(r.accuracy), _rate(r.false_positives), _rate(r.false_negatives),
                      undecided, str(r.judge_rows), str(r.requests), str(r.judge_calls_saved) if r.mode == "hybrid" else "-")
    console.print(table)
    for r in report.results:
        if r.mode == "hybrid":
            console.print(f"hybrid ({r.judge}): decided_by symbolic {r.decided_by.get('symbolic', 0)}, judge {r.decided_by.get('judge', 0)}; "
                          f"{r.judge_calls_saved} judge calls saved")
    kinds = Table(title="per kind of answer: recall (said correct / human correct) and false positives (said correct / human "
                        "incorrect), over every row of the kind, 95% Wilson interval; symbolic is the rules")
    for heading in ("mode", "judge", "kind", "rows", "recall", "false positives", "undecided"):
        kinds.add_column(heading, justify="left" if heading in ("mode", "judge", "kind") else "right")
    for r in report.results:
        for figures in r.by_kind.values():
            kinds.add_row(r.mode, r.judge or "-", figures.kind, str(figures.n), _rate(figures.recall), _rate(figures.false_positives),
                          str(figures.undecided))
    console.print(kinds)
