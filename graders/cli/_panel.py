"""Juries and cascades on the command line: building them from the judge options, and their summary.

``--model A --model B`` is a jury (``--jury``, ``--quorum``); ``--cascade cascade.json`` a cascade
from ``gradekit cascade fit``. Every member gets its own limiter (its own pacing) and shares the
run's cache and budget. One --base-url / --api-key is every juror's, or one per --model in order
(the i-th juror's); judge parameters apply to every juror. A cascade's judges keep the endpoint and
parameters they were fitted with unless --base-url (one for all, or one per judge) or a judge
parameter is given on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import fail
from ._judge_options import JudgeOptions

if TYPE_CHECKING:
    from gradekit.judge import Budget, CascadeSpec
    from gradekit.judge._spec import JudgeSpec


def check_cascade_rubric(path: Path, cascade: CascadeSpec, spec: Any) -> None:
    """A cascade is used with the rubric it was fitted on: another rubric is exit 2 (its thresholds say
    nothing about it), another version of the same rubric a warning (the guarantee was measured on the old one)."""
    import typer

    from gradekit.judge._rubric import rubric_fingerprint

    if not cascade.rubric_fingerprint or rubric_fingerprint(spec) == cascade.rubric_fingerprint:
        return
    fitted = cascade.rubric
    if fitted.endswith((".yaml", ".yml")):  # fitted with a path: the spec's own name, where the file is still there
        from gradekit.judge import load_rubric

        try:
            fitted = load_rubric(fitted).name
        except Exception:  # noqa: BLE001 - moved or broken since: its file name is the best guess
            fitted = Path(fitted).stem
    if fitted != spec.name:
        raise fail(f"{path}: fitted on rubric {fitted!r}, not {spec.name!r}: its thresholds say nothing about this rubric; "
                   f"fit a cascade for it (gradekit cascade fit ... -r {spec.name})")
    typer.echo(f"warning: {path}: fitted on another version of rubric {spec.name!r}: its guarantee was measured on that one; "
               "fit the cascade again", err=True)


def check_panel(opts: JudgeOptions, jury: str | None, quorum: int | None, cascade: Path | None) -> CascadeSpec | None:
    """The panel options that exclude each other (exit 2), and the cascade file read."""
    from gradekit.judge._jury import AGGREGATES

    if jury is not None and jury not in AGGREGATES:
        raise fail(f"--jury is one of {', '.join(AGGREGATES)}, not {jury!r}")
    if cascade is not None:
        if opts.model:
            raise fail("--cascade takes its judges from the cascade file: drop --model (or fit another cascade)")
        if jury is not None or quorum is not None:
            raise fail("--jury and --quorum make a jury; --cascade is a cascade: give one of the two")
        from gradekit.judge import CascadeSpec

        try:
            return CascadeSpec.read(cascade)
        except ValueError as e:
            raise fail(str(e)) from e
    if (jury is not None or quorum is not None) and len(opts.model) < 2:
        raise fail("--jury and --quorum need a jury: give --model at least twice")
    if quorum is not None and not 1 <= quorum <= len(opts.model):
        raise fail(f"--quorum must be between 1 and the jury's size ({len(opts.model)}), not {quorum}")
    return None


def panel_spec(opts: JudgeOptions, *, jury: str | None, quorum: int | None, spec: CascadeSpec | None) -> Any:
    """A JurySpec (several --model), a cascade's judges as a spec (a --cascade file), or None (one judge)."""
    if spec is not None:
        return CascadeJudges(spec, tuple(spec.judge_spec(i, opts.spec(fitted.model, base_url=url, api_key=key)) for i, (fitted, (url, key))
                                         in enumerate(zip(spec.judges, opts.per_member(len(spec.judges), "cascade")))))
    if len(opts.model) > 1:
        from gradekit.judge._spec import JurySpec

        jurors = tuple(opts.spec(model, base_url=url, api_key=key) for model, (url, key) in zip(opts.model, opts.per_member(len(opts.model), "jury")))
        return JurySpec(jurors, aggregate=jury, quorum=quorum)
    return None


@dataclass(frozen=True)
class CascadeJudges:
    """A cascade as a spec: the fitted file and each judge's spec; ``build`` makes the Cascade, as JudgeSpec.build a Judge."""

    spec: CascadeSpec
    judges: tuple[JudgeSpec, ...]

    def build(self, *, cache: Any = None, budget: Budget | None = None, limiter: Any = None) -> Any:
        from gradekit.judge import Cascade

        return Cascade([j.build(cache=cache, budget=budget) for j in self.judges], self.spec)  # each judge paces itself


def build_panel(opts: JudgeOptions, *, jury: str | None, quorum: int | None, spec: CascadeSpec | None,
                cache: Any, budget: Budget | None) -> Any:
    """A Jury (several --model), a Cascade (a spec), or None (one judge: the caller builds it)."""
    panel = panel_spec(opts, jury=jury, quorum=quorum, spec=spec)
    return panel.build(cache=cache, budget=budget) if panel is not None else None


def print_panel(block: dict[str, Any] | None, console: Any) -> None:
    if block is None:
        return
    if "jurors" in block:
        mean = block["mean_agreement"]
        console.print(f"jury      {', '.join(block['jurors'])} ({block['aggregate'] or 'default'} rule, quorum {block['quorum']}); "
                      f"jurors agree with the decision on {'n/a' if mean is None else f'{mean:.1%}'} on average", highlight=False)
        for m in block["members"]:  # what each juror cost, as --json has it
            cost = "cost n/a (no price: --prices FILE)" if m["cost_usd"] is None else f"${m['cost_usd']:.4f}"
            name = m["model"] + (f" ({m['juror']})" if "juror" in m else "")
            console.print(f"          {name}: {m['requests']} requests, "
                          f"{m['prompt_tokens']} prompt + {m['completion_tokens']} completion tokens, {cost}", highlight=False)
        return
    g = block["guarantee"]
    coverage = "n/a" if block["coverage"] is None else f"{block['coverage']:.1%}"
    console.print(f"cascade   {' -> '.join(block['judges'])}: coverage {coverage}, {block['abstained']} rows abstained "
                  "(for a human; `gradekit view OUTPUT` filters them by status)", highlight=False)
    shares = ", ".join(f"{m} {'n/a' if s is None else f'{s:.1%}'}" for m, s in block["share"].items())
    console.print(f"          decided by: {shares}", highlight=False)
    alone = block["strongest_alone"]
    ratio = "" if alone["requests_ratio"] is None else f" ({alone['requests_ratio']:.0%})"
    cost = "" if block["cost_usd"] is None or alone["cost_usd"] is None else f"; ${block['cost_usd']:.4f} vs ${alone['cost_usd']:.4f}"
    console.print(f"          requests {block['requests']} vs {alone['requests']} for {alone['model']} alone{ratio}{cost}", highlight=False)
    console.print(f"          guarantee: trusted rows agree with humans >= {g['target']:g} with probability >= {1 - g['delta']:g} "
                  f"per judge test at delta {g['delta_per_judge']:g} (calibration n = {g['calibration_n']}; "
                  "holds for rows from the calibration rows' population)", highlight=False)
