"""Coverage of `gradekit calibrate --ppi` on LLMBar's human-labelled sets with the recorded judges.

For each recorded judge (GPT-4 / ChatGPT, strategies Vanilla_NoRules and Metrics_Reference) on the
pooled human-labelled sets (MT-Bench 200 + LLMEval2 200 + FairEval 66 = 466 pairs), draw many
random labelled subsets of 50 / 100 / 200 pairs; the rest are the unlabelled rows. The target is
the all-labels mean human score (+1 when output_1 is better, -1 when output_2 is), the judge's
score is the mean of its two orders' votes (+1 / -1 / 0 for a failed order). Reported: how often
the PPI interval covers the target (goal >= 94% at alpha 0.05), its width as a ratio of the
human-only interval from the same labelled subset (the baseline), and the judge-only mean's bias.

    python benchmarks/ppi_coverage.py [--draws 2000] [--alpha 0.05] [--seed 0]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import JUDGES, draws_parser, recorded_pairs, start_study  # noqa: E402

from gradekit.graders.calibration._ppi import ppi_mean  # noqa: E402


def scores(judge: str, strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """(judge score, human score) per pair over the pooled sets."""
    pairs = list(recorded_pairs(judge, strategy))
    return np.array([f for f, _, _ in pairs]), np.array([y for _, _, y in pairs])


def study(f: np.ndarray, y: np.ndarray, n: int, draws: int, alpha: float, rng: np.random.Generator) -> dict[str, float]:
    target = y.mean()
    covered = human_covered = 0
    ratios, widths = [], []
    for _ in range(draws):
        mask = np.zeros(len(y), dtype=bool)
        mask[rng.choice(len(y), n, replace=False)] = True
        r = ppi_mean(f[~mask], f[mask], y[mask], alpha=alpha)
        covered += r.ci_low <= target <= r.ci_high
        human_covered += r.human_only.ci_low <= target <= r.human_only.ci_high
        widths.append(r.ci_high - r.ci_low)
        ratios.append((r.ci_high - r.ci_low) / (r.human_only.ci_high - r.human_only.ci_low))
    return {"coverage": covered / draws * 100, "human_coverage": human_covered / draws * 100,
            "width": float(np.mean(widths)), "ratio": float(np.mean(ratios)), "bias": float(f.mean() - target)}


def main() -> None:
    started = time.perf_counter()
    args, rng = start_study(draws_parser(__doc__), "PPI coverage", "random labelled subsets per row",
                            ["judge (recorded)", "labelled n", "unlabelled N", "PPI coverage", "human-only coverage", "PPI width",
                             "width vs human-only", "judge-only bias"])
    worst = 100.0
    for judge, strategy in JUDGES:
        f, y = scores(judge, strategy)
        for n in (50, 100, 200):
            s = study(f, y, n, args.draws, args.alpha, rng)
            worst = min(worst, s["coverage"])
            print(f"| {judge}/{strategy} | {n} | {len(y) - n} | {s['coverage']:.1f}% | {s['human_coverage']:.1f}% | "
                  f"{s['width']:.3f} | {s['ratio']:.2f}x | {s['bias']:+.3f} |")
    print()
    print(f"lowest PPI coverage {worst:.1f}% (goal >= 94%); {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
