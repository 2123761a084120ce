"""Cascade ChatGPT -> GPT-4 against GPT-4 alone on LLMBar's human-labelled sets, from recorded completions.

LLMBar ships GPT-4's and ChatGPT's real replies on MT-Bench, LLMEval2 and FairEval (human
preference labels) for two prompts each (Vanilla_NoRules and Metrics_Reference), in both orders.
Those four judgements per pair are a judge's K = 4 samples: its decision is their majority winner
and its confidence the share agreeing with it (gradekit's ``agreement`` confidence, with prompts
and orders standing in for temperature-1 samples, since the recordings are deterministic). The
replies are re-read with gradekit's parse layer (``rescore_llmbar``) and the thresholds are fitted
by gradekit's own fixed-sequence test (``gradekit.graders.calibration._cascade.fixed_sequence``).

Over many random splits of each set (half to calibrate, half to evaluate) it reports, per target:
the cascade's agreement with humans on the rows it trusts, its coverage, the share of GPT-4 calls
against GPT-4 alone (which judges every row with its four judgements), GPT-4 alone's agreement,
and how often the guarantee held (trusted-row agreement on the held-out half >= target; a split
that trusts nothing holds it vacuously, so the last column shows the rate among the others).

    PYTHONPATH=. python benchmarks/cascade_llmbar.py [--splits 200] [--delta 0.05]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter

from gradekit.graders.calibration._cascade import fixed_sequence
from gradekit.graders.calibration._llmbar import LLMBarRun, rescore_llmbar

SETS = ("Processed__MT-Bench", "Processed__LLMEval2", "Processed__FairEval")
STRATEGIES = ("Vanilla_NoRules", "Metrics_Reference")


def opinions(subset: str, judge: str) -> tuple[list[tuple[str | None, float]], list[str]]:
    """Per pair: (majority winner of the judge's 4 judgements, share agreeing), and the human labels."""
    runs = [rescore_llmbar(LLMBarRun(subset, judge, s)) for s in STRATEGIES]
    labels = runs[0].labels
    out = []
    for i in range(len(labels)):
        votes = [w for r in runs for w in (r.winner_ab[i], r.winner_ba[i])]
        counts = Counter(v for v in votes if v is not None)
        if not counts:
            out.append((None, 0.0))
            continue
        winner, top = counts.most_common(1)[0]
        out.append((winner, top / len(votes)))
    return out, labels


def split_run(weak, strong, labels, order: list[int], target: float, delta: float) -> dict[str, float] | None:
    half = len(order) // 2
    cal, test = order[:half], order[half:]
    thresholds = []
    reaching = cal
    for judge in (weak, strong):
        confs = [judge[i][1] for i in reaching]
        right = [judge[i][0] == labels[i] for i in reaching]
        t, _ = fixed_sequence(confs, right, target=target, delta=delta)
        thresholds.append(t)
        if t is not None:
            reaching = [i for i in reaching if judge[i][1] < t]
    trusted, by_strong, asked_strong = [], 0, 0
    for i in test:
        for k, judge in enumerate((weak, strong)):
            if thresholds[k] is None:
                continue
            asked_strong += k == 1
            if judge[i][1] >= thresholds[k]:
                trusted.append(judge[i][0] == labels[i])
                by_strong += k == 1
                break
    if not trusted:  # nothing trusted: the guarantee holds vacuously; left out of the "held" rate
        return {"coverage": 0.0, "agreement": float("nan"), "strong_calls": asked_strong / len(test), "held": float("nan"),
                "by_weak": 0.0}
    agreement = sum(trusted) / len(trusted)
    return {"coverage": len(trusted) / len(test), "agreement": agreement, "strong_calls": asked_strong / len(test),
            "by_weak": (len(trusted) - by_strong) / len(test), "held": float(agreement >= target)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--targets", default="0.75,0.8,0.85")
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    print("| set | n | GPT-4 alone | target | cascade agreement | coverage | by ChatGPT | GPT-4 calls vs alone | guarantee held | held where something was trusted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    data = {}
    for subset in SETS:
        data[subset.split("__")[1]] = (*opinions(subset, "ChatGPT"), opinions(subset, "GPT-4")[0])
    pooled = [[x for w, _, _ in data.values() for x in w], [x for _, h, _ in data.values() for x in h],
              [x for _, _, g in data.values() for x in g]]
    data["all three"] = tuple(pooled)  # type: ignore[assignment]
    for name, (weak, labels, strong) in data.items():
        alone = sum(w == h for (w, _), h in zip(strong, labels)) / len(labels)
        for target in targets:
            runs = []
            for seed in range(args.splits):
                order = list(range(len(labels)))
                random.Random(seed).shuffle(order)
                runs.append(split_run(weak, strong, labels, order, target, args.delta))
            agree = [r["agreement"] for r in runs if r["agreement"] == r["agreement"]]
            held = [r["held"] for r in runs if r["held"] == r["held"]]
            mean = lambda key: statistics.fmean(r[key] for r in runs)  # noqa: E731
            print(f"| {name} | {len(labels)} | {alone:.3f} | {target:g} | "
                  f"{statistics.fmean(agree) if agree else float('nan'):.3f} | {mean('coverage'):.3f} | {mean('by_weak'):.3f} | "
                  f"{mean('strong_calls'):.3f} | {(sum(held) + len(runs) - len(held)) / len(runs):.3f} | "
                  f"{statistics.fmean(held) if held else float('nan'):.3f} ({len(held)} splits) |")


if __name__ == "__main__":
    main()
