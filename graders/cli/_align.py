"""`gradekit align`: align a rubric to human labels, certified on held-out rows (docs/align.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from gradekit._extras import require

from ._common import fail, human_column_option, json_option, map_option, print_json, run_judging, warnings_to_stderr
from ._judge_options import JudgeOptions, judge_options


@judge_options
def align(
    labelled: Path = typer.Argument(..., help="CSV, JSONL or Parquet rows with the rubric's variables and a human label."),
    rubric: str = typer.Option(..., "-r", "--rubric", help="The rubric to align: a name (see `gradekit rubrics`) or a path to a .yaml spec."),
    output: Path = typer.Option(..., "-o", "--output", help="The aligned rubric to write (.yaml; its template is written beside it as .j2)."),
    human_column: str = human_column_option(),
    on: str = typer.Option(None, "--on", metavar="KEY", help="Column naming each row in the report and the recorded splits [default: the row number]."),
    mapping: list[str] = map_option(),
    optimiser_model: str = typer.Option(None, "--optimiser-model", help="The model that writes guidelines from the judge's disagreements [default: the judge's model]."),
    optimiser_base_url: str = typer.Option(None, "--optimiser-base-url", help="The optimiser's API root [default: the judge's]."),
    optimiser_api_key: str = typer.Option(None, "--optimiser-api-key", help="The optimiser's API key [default: the judge's]."),
    splits: str = typer.Option("0.4,0.2,0.4", "--splits", metavar="TRAIN,DEV,TEST", help="Shares of each label's rows for train (the optimiser and examples), dev (choosing) and test (the certificate)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the split and of the examples drawn; recorded in the aligned rubric."),
    rounds: int = typer.Option(3, "--rounds", help="Rounds of optimiser + candidates at most (they stop early when no candidate beats the last on dev)."),
    examples: int = typer.Option(2, "--examples", metavar="K", help="Few-shot examples per label a candidate may show (0: none)."),
    guidelines: int = typer.Option(6, "--guidelines", metavar="N", help="New guidelines the optimiser may write per round."),
    margin: float = typer.Option(0.0, "--margin", help="Write the aligned rubric only when the lower end of the accuracy difference's interval on test is above this (0.05: at least 5 points better)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the certificate's intervals."),
    label_policy: str = typer.Option(None, "--label-policy", metavar="NAME[@VERSION]", help="The labelling guide the labels follow, recorded in the certificate [default: the labels file's name and hash]."),
    json_output: bool = json_option("report"),
    progress_every: float = typer.Option(10.0, "--progress-every", metavar="S", help="When stderr is not a terminal: a progress line every S seconds (0: none)."),
    *,
    opts: JudgeOptions,
) -> None:
    """Make RUBRIC agree better with the human labels of LABELLED, and prove it on labels it never saw.

    The rows are split once, stratified by label and seeded: train (the judge's disagreements go to
    the optimiser, which writes guidelines and label definitions; few-shot examples are drawn from
    it), dev (each round's candidates are judged and the best kept) and test (judged only at the
    end, with the original rubric and the chosen one). Only the instructions, the examples and the
    label definitions change: the output schema, the labels and the score map stay. OUTPUT is
    written only when the paired interval of the accuracy difference on test is above --margin;
    it carries a digest of what it was certified on, so `grade` and `serve` refuse it once edited.

    Exit status: 0 the aligned rubric was written; 1 it was not better on test (or no candidate beat
    the original on dev): nothing written, the report says why; 2 bad input or option; 3 the judge
    looks broken or the budget (--max-cost) ran out before the test rows were judged: nothing
    written, and the same command resumes from the cache; 130 on Ctrl-C.
    """
    require("calibration", "gradekit align")  # its intervals and kappa: before any request

    from gradekit.judge import BreakerTripped, RubricError, load_rubric

    from ..calibration._align import AlignError, Stopped
    from ..calibration._align import align as run_align
    from ..calibration._judging import read_labelled
    from ..runs._file import resolve_mapping
    from ..runs._io import InputError, RowError

    warnings_to_stderr()
    opts.check()
    model = opts.one_model("align")
    try:
        fractions = tuple(float(x) for x in splits.split(","))
    except ValueError:
        raise fail(f"--splits {splits!r}: three numbers TRAIN,DEV,TEST, e.g. 0.4,0.2,0.4") from None
    if len(fractions) != 3 or any(not 0 < f < 1 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise fail(f"--splits {splits!r}: three shares between 0 and 1 that add up to 1, e.g. 0.4,0.2,0.4")
    if rounds < 1 or examples < 0 or guidelines < 1:
        raise fail("--rounds and --guidelines are at least 1, --examples at least 0")
    if not 0 < confidence < 1 or not -1 < margin < 1:
        raise fail("--confidence is between 0 and 1 and --margin between -1 and 1")
    if progress_every < 0:
        raise fail("--progress-every takes seconds >= 0 (0: no progress lines)")
    name, _, version = (label_policy or "").partition("@")
    try:
        spec = load_rubric(rubric)
        variables = resolve_mapping(spec, mapping)
        labelled_set = read_labelled(labelled, spec, variables, human_column, on)
    except (RubricError, InputError, RowError) as e:
        raise fail(str(e)) from e
    if spec.alignment is not None:
        typer.echo(f"note: {rubric} is an aligned rubric already: aligning it again certifies the new one against it", err=True)
    cache = opts.open_cache()
    budget = opts.budget()
    try:
        judge = opts.spec(model).build(cache=cache, budget=budget)
        if optimiser_model is None and optimiser_base_url is None and optimiser_api_key is None:
            optimiser = judge
        else:
            optimiser = opts.spec(optimiser_model or model, base_url=optimiser_base_url, api_key=optimiser_api_key).build(
                cache=cache, budget=budget)
    except ValueError as e:
        raise fail(str(e)) from e
    err = Console(stderr=True, highlight=False)
    show = _Progress(err, bar=sys.stderr.isatty() and not json_output, every=progress_every)

    def on_round(r: Any) -> None:
        show.clear()
        if not json_output:
            err.print(round_line(r), markup=False, soft_wrap=True)

    async def run() -> Any:
        try:
            return await run_align(judge, optimiser, spec, labelled_set, output, rubric_name=rubric,
                                   label_policy=(name or None, version or None), fractions=fractions, seed=seed,  # type: ignore[arg-type]
                                   rounds=rounds, examples=examples, guidelines=guidelines, margin=margin, confidence=confidence,
                                   concurrency=opts.in_flight * 4, budget=budget, on_round=on_round, on_judged=show.judged)
        finally:
            await judge.aclose()
            if optimiser is not judge:
                await optimiser.aclose()

    try:
        report = run_judging(run, cache, opts.traffic(), show, errors=(AlignError,), interrupted=lambda: err.print(
            "interrupted: nothing written; the judgements made so far come back from the cache", markup=False))
    except (BreakerTripped, Stopped) as e:  # the judge or the budget, not the input: nothing written, resumable
        raise fail(str(e) if isinstance(e, BreakerTripped) else f"{e}; nothing written: run the same command with a larger "
                   "--max-cost (the judgements made so far come back from the cache)", 3) from None
    if json_output:
        print_json({"output": str(output) if report.written else None, **report.model_dump(mode="json")})
    else:
        print_report(report, output, Console(highlight=False))
    raise typer.Exit(0 if report.written else 1)


def round_line(r: Any) -> str:
    """One round as a line: what the optimiser saw and wrote, each candidate on dev, what was chosen, what it cost."""
    cost = "" if r.cost_usd is None else f", ${r.cost_usd:.4f}"
    if not r.candidates and not r.shown_to_optimiser:
        return f"round {r.round}: {r.note}"
    head = f"round {r.round}: {r.train_disagreements} disagreements on train, {r.shown_to_optimiser} shown to the optimiser"
    if r.new_guidelines:
        head += f", {len(r.new_guidelines)} new guideline{'s' if len(r.new_guidelines) != 1 else ''}"
    if r.optimiser_error:
        head += f" ({r.optimiser_error})"
    candidates = "; ".join(f"{c.name} {c.dev_accuracy:.1%}" + (f" kappa {c.dev_kappa:.2f}" if c.dev_kappa is not None else "")
                           for c in r.candidates)
    line = f"{head}; dev: {candidates or '-'}"
    line += f"; chosen: {r.chosen}" if r.chosen else ""
    line += f" ({r.requests} requests{cost})"
    return line + (f"; {r.note}" if r.note else "")


def print_report(report: Any, output: Path, console: Console) -> None:
    console.print(f"align {report.rubric} to {report.labels_file['name']} ({report.labels_file['rows']} labelled rows; "
                  f"train {len(report.splits.get('train', []))}, dev {len(report.splits.get('dev', []))}, "
                  f"test {len(report.splits.get('test', []))}; seed {report.seed}) with judge {report.judge['model']}, "
                  f"optimiser {report.optimiser['model']}")
    if report.original_dev_accuracy is not None:
        console.print(f"original on dev: {report.original_dev_accuracy:.1%}")
    for r in report.rounds:
        console.print(round_line(r), soft_wrap=True)
    c = report.certificate
    if c is not None:
        def agreement(a: Any) -> str:
            ci = "" if a.accuracy_ci is None else f" [{a.accuracy_ci[0]:.1%}, {a.accuracy_ci[1]:.1%}]"
            kappa = "n/a" if a.kappa is None else f"{a.kappa:.2f}"
            kappa_ci = "" if not a.kappa_ci or a.kappa_ci[0] is None else f" [{a.kappa_ci[0]:.2f}, {a.kappa_ci[1]:.2f}]"
            return f"accuracy {a.accuracy:.1%}{ci}, kappa {kappa}{kappa_ci}" + (f", {a.failures} without a verdict" if a.failures else "")

        console.print(f"test ({c.n} rows never seen before): aligned {agreement(c.aligned)}")
        console.print(f"                             original {agreement(c.original)}")
        console.print(f"difference {c.difference:+.1%} [{c.difference_ci[0]:+.1%}, {c.difference_ci[1]:+.1%}] "
                      f"({c.confidence:.0%}, {c.method}); margin {c.margin:+.1%}")
    for warning in report.warnings:
        console.print(f"warning: {warning}", style="yellow", markup=False)
    cost = "" if report.cost_usd is None else f", ${report.cost_usd:.4f}"
    console.print(f"{report.requests} requests{cost}")
    if report.written:
        console.print(f"{report.reason} -> {output} and {output.with_suffix('.j2')}", soft_wrap=True, markup=False)
    else:
        console.print(report.reason, style="yellow", soft_wrap=True, markup=False)


class _Progress:
    """A bar on a terminal, else a line at most every ``every`` seconds: which phase, how many judgements of it are done."""

    def __init__(self, err: Console, *, bar: bool, every: float) -> None:
        self.err, self.bar, self.every = err, bar, every
        self._progress: Any = None
        self._task: Any = None
        self._phase: str | None = None
        self._last = time.monotonic()

    def __enter__(self) -> _Progress:
        if self.bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=self.err,
                                      transient=True)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)

    def clear(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task, self._phase = None, None

    def judged(self, phase: str, done: int, total: int) -> None:
        if self._progress is not None:
            if phase != self._phase:
                self.clear()
                self._task, self._phase = self._progress.add_task(phase, total=total), phase
            self._progress.update(self._task, completed=done)
            return
        now = time.monotonic()
        if self.every > 0 and (now - self._last >= self.every or done == total and now - self._last >= self.every / 2):
            self._last = now
            print(f"align: {phase}: {done}/{total} judged", file=sys.stderr, flush=True)
