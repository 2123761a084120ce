"""`gradekit meta-eval`: how a judge does on published pairwise judge benchmarks, beside the published judges."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gradekit._extras import require as require_extra

from ._common import fail, json_option, print_json, run_judging, warnings_to_stderr
from ._judge_options import JudgeOptions, judge_options


@judge_options
def meta_eval(
    suites: list[str] = typer.Option(..., "--suite", help="Shipped suite (llmbar, mtbench-human, llmeval2, faireval, answer-verification) or a JSONL file of pairs (instruction, output_1, output_2, label 1|2, optional category, id) or of answers (question, gold, response, verdict correct|incorrect); repeatable."),
    rubric: str = typer.Option(None, "-r", "--rubric", help="Pairwise rubric: llmbar_pairwise, arena_hard_pairwise, or a .yaml spec with variables instruction, output_1, output_2. With --suite answer-verification: an answer-equivalence rubric [default: answer_verification_3way]."),
    on_conflict: str = typer.Option(None, "--on-conflict", help="Pair rule: vote, tie, first or third (needs --tiebreak-model) [default: vote for arena_hard_pairwise, else tie]."),
    tiebreak_model: str = typer.Option(None, "--tiebreak-model", help="With --on-conflict third: the model asked a third time."),
    limit: int = typer.Option(None, "--limit", help="Judge only the first N pairs of each subset."),
    plots: Path = typer.Option(None, "--plots", help="Write accuracy.png (per subset) and position_bias.png into this folder."),
    json_output: bool = json_option("results"),
    cascade: Path = typer.Option(None, "--cascade", metavar="CASCADE.JSON", help="Also evaluate a cascade from `gradekit cascade fit` (fitted on this pairwise rubric): each order goes to its first confident judge; an order it abstains on is an unreadable order under the pair rule (docs/juries.md)."),
    modes: list[str] = typer.Option([], "--mode", help="--suite answer-verification: the verifiers to score, symbolic (the rules; also: rules), judge or hybrid (repeatable) [default: all three]; symbolic alone needs no judge."),
    require: str = typer.Option("both", "--require", help="--suite answer-verification: the judge, asked in both orders, says correct when both orders do (both) or one does (either)."),
    check_timeout: float = typer.Option(5.0, "--check-timeout", help="--suite answer-verification: seconds per check by the rules (a check past it is a timeout, no decision)."),
    *,
    opts: JudgeOptions,
) -> None:
    """Judge every pair of each suite in both orders and report, per suite and subset (plus overall): n,
    accuracy, order agreement, first-position win rate, parse failures, errors, requests, tokens and cost,
    with the published GPT-4 / ChatGPT rows beside the shipped suites.

    Exit status: 0 when every pair got a verdict, 1 when some pairs are errors (the report counts them),
    2 when the run could not start (unknown suite, bad file, rubric or option), 130 when interrupted (the same
    command continues from the cache).
    """

    from gradekit.judge import RubricError, load_rubric

    from ..calibration._llmbar import LLMBarError
    from ..calibration._meta_eval import default_rule, meta_eval as run_meta_eval, plot_meta_eval
    from .._pairwise import CONFLICT_RULES
    from ..calibration._suites import SuiteError, load_suite

    warnings_to_stderr()
    opts.check()
    if plots is not None:
        require_extra("calibration", "--plots")  # before any pair is judged, not after
    from ..calibration._answer_eval import is_answer_suite

    unknown = [s for s in suites if not _known_suite(s)]
    if unknown:  # before any rubric or judge question: a misspelt suite is what is wrong
        raise fail(f"--suite {unknown[0]!r} is neither a shipped suite ({', '.join(_suite_names())}) nor a JSONL file")
    answers = [is_answer_suite(s) for s in suites]
    if any(answers):
        if not all(answers):
            raise fail("--suite answer-verification (answer rows) cannot be mixed with pairwise suites in one run")
        from ._answer_meta_eval import answer_meta_eval_command

        answer_meta_eval_command(suites, rubric, modes, require, check_timeout, limit, json_output, cascade, opts)
        return
    if rubric is None:
        raise fail("give a pairwise rubric with -r (llmbar_pairwise, arena_hard_pairwise or a .yaml spec)")
    models, concurrency = opts.model, opts.in_flight
    cascade_spec = None
    if cascade is not None:
        from gradekit.judge import CascadeSpec

        try:
            cascade_spec = CascadeSpec.read(cascade)
        except ValueError as e:
            raise fail(str(e)) from e
    if on_conflict is not None and (on_conflict not in CONFLICT_RULES or (on_conflict == "third") != bool(tiebreak_model)):
        raise fail("--on-conflict is vote, tie, first, or third together with --tiebreak-model")
    if len(set(models)) != len(models):
        raise fail(f"--model names a judge twice: {', '.join(models)}")
    try:
        spec = load_rubric(rubric)
        if spec.pairwise is None:
            raise RubricError(f"rubric {spec.name!r} is not pairwise; use llmbar_pairwise or arena_hard_pairwise")
        if cascade_spec is not None:
            from ._panel import check_cascade_rubric

            check_cascade_rubric(cascade, cascade_spec, spec)
        loaded = [load_suite(s, limit=limit) for s in suites]
        if len({s.name for s in loaded}) != len(loaded):
            raise SuiteError(f"--suite names a suite twice: {', '.join(suites)}")
    except (RubricError, SuiteError, LLMBarError, ValueError) as e:
        raise fail(str(e)) from e
    budget = opts.budget()
    prices = budget.prices
    limiter = opts.limiter(None)
    rule = on_conflict or default_rule(spec)
    cache = opts.open_cache()

    async def run():
        judges = [opts.judge(m, limiter=limiter, cache=cache, budget=budget) for m in (models or ([] if cascade_spec else [None]))]
        if cascade_spec is not None:
            from ._judge_options import JudgeOptions
            from ._panel import build_panel

            # The cascade's judges keep their fitted endpoints; --model names plain judges to compare it with.
            judges.append(build_panel(JudgeOptions(**{**vars(opts), "model": []}), jury=None, quorum=None, spec=cascade_spec,
                                      cache=cache, budget=budget))
        tiebreak = opts.judge(tiebreak_model, limiter=limiter, cache=cache, budget=budget) if tiebreak_model else None
        try:
            return await run_meta_eval(loaded, spec, judges, on_conflict=rule, prices=prices,  # type: ignore[arg-type]
                                       concurrency=max(1, concurrency // 2) + 2, tiebreak=tiebreak)
        finally:
            for j in judges + ([tiebreak] if tiebreak else []):
                await j.aclose()

    # Judged pairs are in the cache: the same command continues from there.
    report = run_judging(run, cache, opts.traffic(), errors=(ValueError, FileNotFoundError, RuntimeError),
                         interrupted="interrupted; run the same command again: pairs already judged come from the cache")
    written = plot_meta_eval(report, plots) if plots is not None else []
    errors = sum(r.errors for r in report.results if r.judge != "jury" and r.subset in _leaf_subsets(report, r.suite))
    if json_output:
        print_json({**report.model_dump(), "plots": written})
    else:
        _print(report, written)
    raise typer.Exit(1 if errors else 0)


def _suite_names() -> list[str]:
    from ..calibration._answer_eval import ANSWER_SUITE
    from ..calibration._suites import SHIPPED_SUITES

    return [*SHIPPED_SUITES, ANSWER_SUITE]


def _known_suite(suite: str) -> bool:
    from pathlib import Path

    return suite in _suite_names() or Path(suite).is_file()


def _leaf_subsets(report, suite: str) -> set[str]:
    """Subsets whose rows count each pair once (``overall`` repeats them when a suite has several)."""
    names = {r.subset for r in report.results if r.suite == suite}
    return names - {"overall"} if len(names) > 1 else names


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def _print(report, written: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Wide enough for the tables when piped to a file; a terminal keeps its own width.
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 150)
    console.print(f"rubric {report.rubric}, pair rule {report.on_conflict}, judges {', '.join(report.judges)}; "
                  f"{report.wall_s:.1f} s")
    for suite in dict.fromkeys(r.suite for r in report.results):
        rows = [r for r in report.results if r.suite == suite]
        accuracy_by = rows[0].accuracy_by if rows else "pair"
        what = "mean over the two orders (LLMBar's Acc)" if accuracy_by == "order_mean" else "pair winner (a tie counts wrong)"
        table = Table(title=f"{suite}: accuracy = {what}; rates in %")
        for heading in ("subset", "judge", "n", "acc", "agree", "1st wins", "parse fail", "errors", "requests", "tokens", "cost $"):
            table.add_column(heading, justify="left" if heading in ("subset", "judge") else "right")
        for r in rows:
            table.add_row(r.subset, r.judge, str(r.n), _fmt(r.accuracy), _fmt(r.agreement), _fmt(r.first_position_win_rate),
                          str(r.parse_failures), str(r.errors) + (f" ({r.one_order} one order)" if r.one_order else ""),
                          str(r.requests), str(r.prompt_tokens + r.completion_tokens), _fmt(r.cost_usd, ".4f"))
        console.print(table)
        for r in rows:
            if r.errors_by_kind and (r.subset != "overall" or len(rows) == 1):
                console.print(f"  {r.subset} / {r.judge}: {r.errors} pairs without a verdict ("
                              + ", ".join(f"{k} {v}" for k, v in r.errors_by_kind.items()) + ")")
        published = [p for p in report.published if p.suite == suite]
        if published:
            order = list(dict.fromkeys(r.subset for r in rows))
            subsets = sorted(dict.fromkeys(p.subset for p in published), key=lambda x: order.index(x) if x in order else len(order))
            cells = {(p.judge, p.subset): p for p in published}
            pub = Table(title=f"{suite}: published (Zeng et al., ICLR 2024, full subsets), Acc / Agr in %")
            pub.add_column("judge/strategy")
            for x in subsets:
                pub.add_column(x, justify="right")
            for judge in sorted(dict.fromkeys(p.judge for p in published), key=lambda j: (not j.startswith("GPT-4"), j)):
                pub.add_row(judge, *[f"{cells[(judge, x)].accuracy:.1f} / {cells[(judge, x)].agreement:.1f}"
                                     if (judge, x) in cells else "-" for x in subsets])
            console.print(pub)
    for j in report.jury:
        if j.beats_best is not None:
            console.print(f"jury on {j.suite}/{j.subset}: {_fmt(j.accuracy)}% vs best member {j.best_member} "
                          f"{_fmt(j.best_member_accuracy)}% (pair accuracy) -> "
                          f"{'the panel beats its best member' if j.beats_best else 'the panel does not beat its best member'}")
    for path in written:
        console.print(f"plot: {path}")
    if sys.stdout.isatty():
        console.print("--json prints every figure (order and pair accuracy, cache hits, one-order pairs)")
