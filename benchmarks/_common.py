"""What more than one benchmark reads: LLMBar's recorded judges on its human-labelled sets, pooled.

Import it beside the benchmark (``sys.path.insert(0, <benchmarks>)``): benchmarks are scripts, not a package.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np

from gradekit.graders.calibration._llmbar import LLMBarRun, rescore_llmbar

SETS = ["Processed__MT-Bench", "Processed__LLMEval2", "Processed__FairEval"]
JUDGES = [("GPT-4", "Vanilla_NoRules"), ("GPT-4", "Metrics_Reference"), ("ChatGPT", "Vanilla_NoRules"),
          ("ChatGPT", "Metrics_Reference")]
VOTE = {"1": 1.0, "2": -1.0}


def draws_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of a study that draws labelled subsets of the pooled sets: --draws, --alpha, --seed."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def start_study(parser: argparse.ArgumentParser, study: str, per: str,
                columns: list[str]) -> tuple[argparse.Namespace, np.random.Generator]:
    """Parse a study's options (``draws_parser``) and print its heading and its table's header: what it measures on the
    pooled sets (MT-Bench + LLMEval2 + FairEval), how many draws ``per`` what, at which alpha. The generator is --seed's."""
    args = parser.parse_args()
    print(f"{study} on LLMBar's human-labelled sets pooled ({' + '.join(s.split('__')[1] for s in SETS)}), "
          f"{args.draws} {per}, alpha {args.alpha}")
    print()
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    return args, np.random.default_rng(args.seed)


def recorded_pairs(judge: str, strategy: str) -> Iterator[tuple[float, bool, float]]:
    """(judge score, the two orders agree, human score) per pair over the pooled sets; a score is the mean vote of
    the two orders, +1 for output 1, -1 for output 2, 0 for an order with no verdict."""
    for subset in SETS:
        run = rescore_llmbar(LLMBarRun(subset, judge, strategy))
        for a, b, label in zip(run.winner_ab, run.winner_ba, run.labels):
            yield (VOTE.get(a or "", 0.0) + VOTE.get(b or "", 0.0)) / 2, a is not None and a == b, VOTE[label]
