"""Juries and cascades on the command line: building them from the judge options, and their summary.

``--model A --model B`` is a jury (``--jury``, ``--quorum``); ``--cascade cascade.json`` a cascade
from ``gradekit cascade fit``. Every member gets its own limiter (its own pacing) and shares the
run's cache and budget. One --base-url / --api-key is every juror's, or one per --model in order
(the i-th juror's); judge parameters apply to every juror. A cascade's judges keep the endpoint and
parameters they were fitted with unless --base-url (one for all, or one per judge) or a judge
parameter is given on the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import fail
from ._judge_options import JudgeOptions

if TYPE_CHECKING:
    from gradekit.judge import Budget, CascadeSpec, JudgeProtocol


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


def build_panel(opts: JudgeOptions, *, jury: str | None, quorum: int | None, spec: CascadeSpec | None,
                cache: Any, budget: Budget | None) -> Any:
    """A Jury (several --model), a Cascade (a spec), or None (one judge: the caller builds it)."""
    if spec is not None:
        from gradekit.judge import Cascade

        judges = [spec.judge_spec(i, opts.spec(fitted.model, base_url=url, api_key=key)).build(cache=cache, budget=budget)
                  for i, (fitted, (url, key)) in enumerate(zip(spec.judges, opts.per_member(len(spec.judges), "cascade")))]
        return Cascade(judges, spec)
    if len(opts.model) > 1:
        from gradekit.judge._spec import JurySpec

        jurors = tuple(opts.spec(model, base_url=url, api_key=key) for model, (url, key) in zip(opts.model, opts.per_member(len(opts.model), "jury")))
        return JurySpec(jurors, aggregate=jury, quorum=quorum).build(cache=cache, budget=budget)
    return None


def panel_summary(panel: JudgeProtocol, summary: Any, prices: Any) -> dict[str, Any] | None:
    """The ``jury`` / ``cascade`` block of the run's summary (None for a single judge)."""
    from gradekit.judge import Cascade, Jury, cost_usd
    from gradekit.judge._budget import price_of

    def priced(model: str, prompt: int, completion: int, cached: int = 0, written: int = 0) -> float | None:
        return cost_usd(prices, model, prompt, completion, cached, cache_write_tokens=written) if price_of(prices, model) is not None else None

    usage = panel.stats().members
    if usage is None:  # a single judge
        return None
    members = []
    for member, figures in usage.by_model.items():
        model = usage.models.get(member, member)
        members.append({"model": model, **({"juror": member} if member != model else {}), **figures,
                        "cost_usd": priced(model, figures["prompt_tokens"], figures["completion_tokens"], figures["cached_tokens"],
                                           figures["cache_write_tokens"])})
    costs = [m["cost_usd"] for m in members]
    total = sum(c for c in costs if c is not None) if costs and all(c is not None for c in costs) else None
    if isinstance(panel, Jury):
        return {"jurors": [j.model for j in panel.jurors], "aggregate": panel.aggregate, "quorum": panel.quorum,
                "mean_agreement": summary.mean_agreement, "members": members, "cost_usd": total}
    if not isinstance(panel, Cascade):
        return None
    spec = panel.spec
    judged = summary.ok + summary.abstained
    strongest = spec.judges[-1].model
    # The baseline: the strongest judge alone, asked every row the same way (K samples per row).
    per_row = 1 if spec.confidence == "logprobs" else spec.samples
    rows_asked = summary.rows - summary.resumed_from if not summary.already_complete else 0
    seen = next((m for m in members if m["model"] == strongest and m["requests"]), None) or next((m for m in members if m["requests"]), None)
    alone_requests = rows_asked * per_row
    alone_cost = None
    if seen is not None:
        mean_prompt, mean_completion = seen["prompt_tokens"] / seen["requests"], seen["completion_tokens"] / seen["requests"]
        alone_cost = priced(strongest, round(mean_prompt * alone_requests), round(mean_completion * alone_requests))
    requests = sum(m["requests"] for m in members)
    return {
        "judges": [j.model for j in spec.judges],
        "thresholds": [j.threshold for j in spec.judges],
        "coverage": summary.ok / judged if judged else None,
        "abstained": summary.abstained,
        "decided_by": summary.decided_by,
        "share": {j.model: (summary.decided_by.get(j.model, 0) / judged if judged else None) for j in spec.judges},
        "members": members,
        "requests": requests,
        "cost_usd": total,
        "strongest_alone": {"model": strongest, "requests": alone_requests, "cost_usd": alone_cost,
                            "requests_ratio": requests / alone_requests if alone_requests else None},
        "guarantee": {"target": spec.target, "delta": spec.delta, "delta_per_judge": spec.delta_per_judge,
                      "calibration_n": spec.calibration_n, "confidence": spec.confidence, "samples": spec.samples},
    }


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
