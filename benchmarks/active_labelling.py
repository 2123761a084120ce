"""Active vs uniform labelling for `calibrate --ppi`: LLMBar's human-labelled sets with the recorded judges.

The viewer's `/api/next?strategy=active` offers the row where the judge is least sure with a
higher, recorded probability; `calibrate --ppi` weights each label by it (IPW PPI, Des Raj's
sequential form). This replays that policy: for each recorded judge on the pooled human-labelled
sets (MT-Bench 200 + LLMEval2 200 + FairEval 66 = 466 pairs), label rows one at a time, either
drawn by the viewer's active rule (`gradekit.graders.calibration._labels.draw_probabilities` over
`uncertainty`) or uniformly, and estimate the mean human score (+1 output_1 better, -1 output_2)
with `ppi_mean_active` after n = 50, 100, 200 labels. The judge's score is the mean of its two
orders' votes, so a pair whose orders disagree scores 0 (the most unsure). Reported per judge and
n: coverage of both intervals (goal >= 94% at alpha 0.05) and the mean width of the active
interval over the uniform one (< 1: active labelling bought precision), beside the best ratio any
rule drawing by the judge's uncertainty could reach on that data. Then the four recorded judges
as a jury (their mean vote: a graded uncertainty), and a synthetic judge on the same human labels
whose score is a calibrated probability (right with probability c = 1 - U^3 / 2, U uniform: mostly
sure, sometimes a coin; score +-(2c - 1)):
the case where a judge's uncertainty does predict its error, which the recorded judges' does not.

    python benchmarks/active_labelling.py [--draws 2000] [--alpha 0.05] [--seed 0]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import JUDGES, draws_parser, recorded_pairs, start_study  # noqa: E402

from gradekit.graders.calibration._labels import BINS, UNIFORM_SHARE, draw_probabilities, level, level_weights, uncertainty  # noqa: E402
from gradekit.graders.calibration._ppi import ppi_mean_active  # noqa: E402

SIZES = (50, 100, 200)


def rows(judge: str, strategy: str) -> tuple[list[dict], np.ndarray]:
    """Graded rows as the viewer sees them (score, agree) and the human score per pair. ``jury``: the four recorded
    judges' mean vote as the score (eight votes a pair, so the score's distance from 0 grades the uncertainty)."""
    if judge == "synthetic":  # a judge whose score is a calibrated probability: its uncertainty predicts its error
        y = rows(*JUDGES[0])[1]
        rng = np.random.default_rng(7)
        sure = 1 - 0.5 * rng.uniform(size=len(y)) ** 3  # P(the judge's call is right): mostly sure, sometimes a coin
        call = np.where(rng.uniform(size=len(y)) < sure, y, -y)
        return [{"status": "ok", "score": float(c * (2 * p - 1))} for c, p in zip(call, sure)], y
    if judge == "jury":
        members = [rows(j, s) for j, s in JUDGES]
        y = members[0][1]
        return [{"status": "ok", "score": float(np.mean([m[0][i]["score"] for m in members]))} for i in range(len(y))], y
    pairs = list(recorded_pairs(judge, strategy))
    return [{"status": "ok", "score": score, "agree": agree} for score, agree, _ in pairs], np.array([h for _, _, h in pairs])


def sequence(levels: np.ndarray, f: list[float], y: np.ndarray, n: int, active: bool,
             rng: np.random.Generator) -> list[tuple[int, float]]:
    """n rows drawn one at a time without replacement as the viewer draws them, each with the probability it had
    when drawn. The active rule is `draw_probabilities`' (sqrt of each uncertainty level's squared correction,
    learnt from the labels so far, mixed with uniform), vectorised here; `check` confirms they agree."""
    left = np.ones(len(levels), dtype=bool)
    sums, counts = [0.0] * (BINS + 1), [0] * (BINS + 1)
    drawn = []
    for _ in range(n):
        where = np.flatnonzero(left)
        m = len(where)
        if active:
            w = np.array(level_weights(sums, counts))[levels[where]]
            q = (1 - UNIFORM_SHARE) * w / w.sum() + UNIFORM_SHARE / m
        else:
            q = np.full(m, 1.0 / m)
        pick = int(rng.choice(m, p=q / q.sum()))
        i = int(where[pick])
        left[i] = False
        drawn.append((i, float(q[pick])))
        sums[levels[i]] += ((y[i] - f[i]) / 2) ** 2
        counts[levels[i]] += 1
    return drawn


def check(uncertainties: list[float], levels: np.ndarray, f: list[float], y: np.ndarray) -> None:
    """The vectorised rule gives the viewer's probabilities (after a few labels, on the remaining rows)."""
    seen = [(uncertainties[i], ((y[i] - f[i]) / 2) ** 2) for i in range(10)]
    expected = draw_probabilities(uncertainties[10:], "active", seen)
    sums, counts = [0.0] * (BINS + 1), [0] * (BINS + 1)
    for u, r in seen:
        sums[level(u)] += r
        counts[level(u)] += 1
    w = np.array(level_weights(sums, counts))[levels[10:]]
    got = (1 - UNIFORM_SHARE) * w / w.sum() + UNIFORM_SHARE / len(w)
    assert np.allclose(got, expected), "the benchmark's sampler differs from the viewer's"


def bound(levels: np.ndarray, f: np.ndarray, y: np.ndarray) -> float:
    """The narrowest width ratio any rule drawing by uncertainty level can reach (with-replacement approximation):
    sqrt((mean of sqrt(e))^2 / mean of e), e a row's level's true mean squared correction (known here: every pair
    is labelled). Near 1: the judge's uncertainty hardly predicts how wrong it is, and no order can help much."""
    d2 = (y - f) ** 2
    e = np.array([d2[levels == b].mean() for b in levels])
    return float(np.sqrt(np.mean(np.sqrt(e)) ** 2 / np.mean(e)))


def main() -> None:
    parser = draws_parser(__doc__)
    parser.add_argument("--judges", type=int, default=len(JUDGES) + 2, help="the first N judges only (a quick look)")
    started = time.perf_counter()
    args, rng = start_study(parser, "Active vs uniform labelling, IPW PPI", "labelling runs per strategy",
                            ["judge (recorded)", "n", "active coverage", "uniform coverage", "active width", "uniform width",
                             "width active / uniform", "best possible"])
    worst, ratios = 100.0, []
    for judge, strategy in [*JUDGES, ("jury", "4 recorded judges"), ("synthetic", "calibrated")][:args.judges]:
        graded, y = rows(judge, strategy)
        f = [r["score"] for r in graded]
        weights = [uncertainty(r, (-1.0, 1.0)) for r in graded]
        levels = np.array([level(u) for u in weights])
        check(weights, levels, f, y)
        target = float(y.mean())
        best = bound(levels, np.array(f), y)
        stats = {(n, a): {"covered": 0, "widths": []} for n in SIZES for a in (True, False)}
        for _ in range(args.draws):
            for active in (True, False):
                drawn = sequence(levels, f, y, max(SIZES), active, rng)
                for n in SIZES:
                    r = ppi_mean_active(f, [(i, float(y[i]), p) for i, p in drawn[:n]], alpha=args.alpha, bounds=(-1.0, 1.0))
                    s = stats[(n, active)]
                    s["covered"] += r.ci_low <= target <= r.ci_high
                    s["widths"].append(r.ci_high - r.ci_low)
        for n in SIZES:
            a, u = stats[(n, True)], stats[(n, False)]
            ca, cu = a["covered"] / args.draws * 100, u["covered"] / args.draws * 100
            wa, wu = float(np.mean(a["widths"])), float(np.mean(u["widths"]))
            worst = min(worst, ca)
            ratios.append(wa / wu)
            print(f"| {judge}/{strategy} | {n} | {ca:.1f}% | {cu:.1f}% | {wa:.3f} | {wu:.3f} | {wa / wu:.2f}x | {best:.2f}x |")
    print()
    print(f"lowest active coverage {worst:.1f}% (goal >= 94%); width ratio {min(ratios):.2f}x to {max(ratios):.2f}x; "
          f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
