"""Pairwise group rewards against the pointwise group grader: requests and wall time per group of 8.

The fake judge (``gradekit.judge.testing.FakeProvider``, in this process) answers every request after
``--latency`` seconds: a pointwise rubric (``semantic_equivalence_en``) from the reference judge, the
pairwise rubric (``arena_hard_pairwise``) from the members' hidden qualities. Contenders, each over
the same ``--groups`` groups of 8 gathered at once (``--concurrency`` requests in flight), alternated
``--rounds`` times in a new order each round, no cache:

- ``pointwise``: ``type: group`` with ``grader: {type: llm}``: one request per member (8 per group);
- ``circular``: ``type: group`` with ``pairwise: {pairing: circular}``: 8 requests per group;
- ``all_pairs``: ``pairwise: {pairing: all_pairs}``: every pair in both orders, 56 requests per group.

Printed per contender: requests per group, the median wall time per round and per group, the ratio
to the pointwise round (median over rounds), and how often the fit put the best member first.

    python benchmarks/pairwise_group.py                 # 32 groups, 50 ms per reply, 64 in flight, 3 rounds
    python benchmarks/pairwise_group.py --groups 64 --latency 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import time

from gradekit.graders import Sample, Trajectory, load_group_grader
from gradekit.judge import Judge, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

N = 8


def quality(text: str) -> int:
    return int(re.search(r"quality (\d+)", text).group(1))  # type: ignore[union-attr]


def respond(body: dict) -> Reply:
    text = body["messages"][-1]["content"]
    pair = re.search(r"<assistant_a>\s*(.*?)\s*</assistant_a>.*?<assistant_b>\s*(.*?)\s*</assistant_b>", text, re.S)
    if pair:
        diff = quality(pair.group(1)) - quality(pair.group(2))
        tag = "A>>B" if diff >= 2 else "A>B" if diff == 1 else "A=B" if diff == 0 else "B>A" if diff == -1 else "B>>A"
        return Reply(content=f"My final verdict is: [[{tag}]]")
    good = int(re.search(r"member \d+ of group \d+, quality (\d+)", text).group(1)) >= 6  # type: ignore[union-attr]
    return Reply(content='{"rationale": "compared", "judgement": "%s"}' % ("correct" if good else "incorrect"))


def groups(count: int, seed: int) -> list[tuple[Sample, list[Trajectory]]]:
    rng = random.Random(seed)
    out = []
    for g in range(count):
        qualities = rng.sample(range(N), N)
        sample = Sample(messages=[{"role": "user", "content": f"group {g}: answer well"}], references={"answer": "quality 7"})
        out.append((sample, [Trajectory(messages=[{"role": "assistant", "content": f"member {k} of group {g}, quality {q}"}])
                             for k, q in enumerate(qualities)]))
    return out


CONFIGS = {
    "pointwise": {"type": "group", "grader": {"type": "llm", "rubric": "semantic_equivalence_en"}},
    "circular": {"type": "group", "pairwise": {"rubric": "arena_hard_pairwise", "pairing": "circular"}},
    "all_pairs": {"type": "group", "pairwise": {"rubric": "arena_hard_pairwise", "pairing": "all_pairs"}},
}


async def run(name: str, fake: FakeProvider, batch: list[tuple[Sample, list[Trajectory]]], concurrency: int) -> tuple[float, float, float]:
    judge = Judge("fake-judge", base_url=fake.base_url, api_key="k", timeout=60, cache=None,
                  limiter=Limiter(concurrency=concurrency), retry=RetryPolicy(max_attempts=2))
    try:
        grader = load_group_grader(CONFIGS[name], judge=judge)
        before = len(fake.requests)
        started = time.perf_counter()
        results = await asyncio.gather(*(grader(sample, members) for sample, members in batch))
        seconds = time.perf_counter() - started
    finally:
        await judge.aclose()
    requests = (len(fake.requests) - before) / len(batch)
    best_first = statistics.fmean(
        r.rewards.index(max(r.rewards)) == max(range(N), key=lambda k: quality(m[k].messages[0].text))
        for r, (_, m) in zip(results, batch) if r.rewards)
    return seconds, requests, best_first


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    ratios: dict[str, list[float]] = {name: [] for name in CONFIGS}
    per_group: dict[str, float] = {}
    best: dict[str, float] = {}
    with FakeProvider(responder=respond, latency=args.latency) as fake:
        for r in range(args.rounds):
            batch = groups(args.groups, seed=r)
            order = list(CONFIGS)
            random.Random(r).shuffle(order)
            this_round = {}
            for name in order:
                seconds, requests, best_first = await run(name, fake, batch, args.concurrency)
                this_round[name] = seconds
                times[name].append(seconds)
                per_group[name], best[name] = requests, best_first
            for name in CONFIGS:
                ratios[name].append(this_round[name] / this_round["pointwise"])
    print(f"{args.groups} groups of {N}, {args.latency * 1000:g} ms per reply, {args.concurrency} in flight, {args.rounds} rounds")
    print(f"{'contender':<10} {'requests/group':>15} {'round s':>9} {'ms/group':>9} {'x pointwise':>12} {'best member top':>16}")
    for name in CONFIGS:
        median = statistics.median(times[name])
        print(f"{name:<10} {per_group[name]:>15.1f} {median:>9.2f} {median / args.groups * 1000:>9.1f} "
              f"{statistics.median(ratios[name]):>12.2f} {best[name]:>16.2f}")


if __name__ == "__main__":
    asyncio.run(main())
