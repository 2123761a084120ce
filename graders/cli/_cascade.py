"""`gradekit cascade fit`: calibrate a cascade of judges on human labels (Trust or Escalate)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gradekit._extras import require

from ._common import fail, human_column_option, json_option, map_option, print_json, run_judging, warnings_to_stderr
from ._judge_options import JudgeOptions, judge_options


@judge_options
def fit(
    labelled: Path = typer.Argument(..., help="CSV, JSONL or Parquet rows with the rubric's variables and a human label."),
    rubric: str = typer.Option(..., "-r", "--rubric", help="Rubric name (see `gradekit rubrics`) or path to a .yaml spec."),
    output: Path = typer.Option(..., "-o", "--output", help="The cascade file to write (JSON), for `gradekit grade --cascade`."),
    samples: int = typer.Option(5, "--samples", metavar="K", help="Samples (or simulated annotators) per row and judge."),
    target: float = typer.Option(0.9, "--target", help="Agreement with humans the trusted rows must reach."),
    delta: float = typer.Option(0.05, "--delta", help="The guarantee holds with probability at least 1 - delta."),
    confidence: str = typer.Option("agreement", "--confidence", help="How sure a judge is: agreement (the share of K samples at temperature 1 agreeing with their majority), simulated-annotators (K in-context annotators with human-labelled demonstrations), or logprobs (the label's probability at the verdict token)."),
    split_delta: bool = typer.Option(False, "--split-delta", help="Test each judge at delta / judges, so the guarantee covers all trusted rows together (union bound) rather than each judge's."),
    human_column: str = human_column_option(),
    mapping: list[str] = map_option(),
    demonstrations: int = typer.Option(3, "--demonstrations", metavar="N", help="With --confidence simulated-annotators: labelled rows each annotator sees (taken out of the calibration rows)."),
    seed: int = typer.Option(0, "--seed", help="Seed for picking the simulated annotators' demonstrations."),
    json_output: bool = json_option("fitted cascade"),
    *,
    opts: JudgeOptions,
) -> None:
    """Fit per-judge confidence thresholds on LABELLED so that the rows a judge is trusted with agree with
    the human label at >= --target with probability >= 1 - --delta (fixed-sequence testing with an exact
    binomial bound, Jung et al. 2024). Give the judges cheapest first: --model CHEAP --model STRONG.

    Each judge sees the rows no earlier judge was trusted with; a judge no threshold passes for is
    never trusted (and never asked by `grade --cascade`). The guarantee holds for rows drawn from
    the same population as LABELLED (docs/juries.md). Exit status: 0 fitted, 2 bad input or option, 3 a judge
    looks broken (the breaker every run has stopped the fit early; nothing written).
    """
    require("calibration", "gradekit cascade fit")

    from gradekit.judge import RubricError, load_rubric
    from gradekit.judge._cascade import CONFIDENCE_METHODS

    from ..calibration._cascade import fit_cascade
    from ..calibration._judging import read_labelled
    from ..runs._file import resolve_mapping
    from ..runs._io import InputError, RowError

    warnings_to_stderr()
    opts.check()
    if confidence not in CONFIDENCE_METHODS:
        raise fail(f"--confidence is one of {', '.join(CONFIDENCE_METHODS)}, not {confidence!r}")
    if not opts.model:
        raise fail("give the cascade's judges, cheapest first: --model CHEAP --model STRONG")
    if len(set(opts.model)) != len(opts.model):
        raise fail("--model names a judge twice: each judge of a cascade is a different model")
    if samples < 1 or (confidence == "agreement" and samples < 2):
        raise fail("--samples must be at least 2 for --confidence agreement (1 sample agrees with itself)")
    if not 0 < target < 1 or not 0 < delta < 1:
        raise fail("--target and --delta are probabilities strictly between 0 and 1")
    if confidence == "agreement" and opts.temperature == 0:
        raise fail("--confidence agreement samples at temperature 1; --temperature 0 would make the K samples one answer")
    if demonstrations < 1:
        raise fail("--demonstrations must be at least 1")
    if output.suffix.lower() != ".json":
        raise fail(f"{output}: the cascade file is JSON: name it .json")
    try:
        spec = load_rubric(rubric)
        variables = resolve_mapping(spec, mapping)
        labelled_set = read_labelled(labelled, spec, variables, human_column)
    except (RubricError, InputError, RowError) as e:
        raise fail(str(e)) from e
    rows, human = labelled_set.rows, labelled_set.human
    from gradekit.judge._cascade import LOGPROBS_TOP

    cache = opts.open_cache()
    budget = opts.budget()
    try:
        from dataclasses import replace

        # As in `grade --cascade`: one --base-url for every judge, or one per --model in order (never one judge on all of them).
        judges = [replace(opts.spec(m, base_url=url, api_key=key), logprobs=LOGPROBS_TOP if confidence == "logprobs" else None)
                  .build(cache=cache, budget=budget)
                  for m, (url, key) in zip(opts.model, opts.per_member(len(opts.model), "cascade"))]
    except ValueError as e:
        raise fail(str(e)) from e
    err = Console(stderr=True)

    async def run():
        try:
            return await fit_cascade(judges, spec, rows, human, samples=samples, confidence=confidence,  # type: ignore[arg-type]
                                     target=target, delta=delta, split_delta=split_delta, rubric_name=rubric,
                                     human_column=human_column, demonstrations=demonstrations, seed=seed,
                                     concurrency=opts.in_flight * 4)
        finally:
            for j in judges:
                await j.aclose()

    fitted = run_judging(run, cache, opts.traffic(), broken_exit=True, interrupted=lambda: err.print(
        "interrupted: nothing written; the judgements made so far come back from the cache", highlight=False))
    try:
        output.write_text(fitted.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise fail(f"cannot write {output}: {e.strerror or e}") from e
    if json_output:
        print_json({"output": str(output), **fitted.model_dump(exclude={"demonstrations"})})
        return
    out = Console(highlight=False)
    out.print(f"cascade {' -> '.join(j.model for j in fitted.judges)} on {fitted.calibration_n} labelled rows "
              f"(target {target:g}, delta {delta:g}, {confidence}, K={samples}) -> {output}")
    for j in fitted.judges:
        if j.threshold is None:
            first = j.tests[0] if j.tests else None
            why = f"the most confident rows agree at {first.agree}/{first.n}, bound {first.lower_bound:.3f}" if first and first.n else "no rows"
            out.print(f"  {j.model}: never trusted ({j.calibration_rows} rows reached it; {why})")
        else:
            out.print(f"  {j.model}: trusted at confidence >= {j.threshold:g}: {j.trusted_rows} of {j.calibration_rows} rows, "
                      f"agreement {j.trusted_agreement:.3f} (lower bound {j.lower_bound:.3f})")
    coverage = fitted.calibration_coverage or 0.0
    agreement = "n/a" if fitted.calibration_agreement is None else f"{fitted.calibration_agreement:.3f}"
    out.print(f"calibration coverage {coverage:.1%}, agreement of trusted rows {agreement}")
