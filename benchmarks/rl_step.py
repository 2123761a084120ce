"""One RL step's reward stage: 2,048 samples (256 groups of 8) against a heavy-tailed judge on a fleet of two.

The fake judge runs as a separate process serving two endpoints (two ``gradekit.judge.testing.FakeProvider``)
that answer each request after a lognormal delay (median 200 ms, p99 3 s: ``gradekit.judge.testing.Lognormal``).
The delay of a sample's first request is fixed by the sample (and the seed), whichever endpoint
gets it, so every contender meets the very same first latencies; a second request for the same
sample in the same round (a hedge) gets a fresh draw, as a replica would. Contenders, alternated
``--rounds`` times (each round in a new order):

- ``bare``: a hand-written asyncio loop (one AsyncOpenAI per endpoint, samples alternating between
  them, a semaphore at the same concurrency) sending every sample's rendered messages;
- ``no hedge``: 256 ``group_grader`` groups gathered over ``Judge(base_url=[a, b], hedge=False)``,
  the fleet's limiters at the same concurrency in all;
- ``hedged``: the same with hedging on (the default for a fleet): a request unanswered after
  max(p95, 2 x median) of its endpoint's recent latencies goes once more to the other endpoint;
- ``ideal``: the step's slowest single (first) latency: infinite concurrency and no overhead.

Printed: each contender's median step time, the median of the per-round ratios to the bare loop
(wall time; and throughput for ``no hedge``), and the hedged runs' extra requests. ``--deadline S``
adds a ``group_deadline_s`` contender (renormalize, ``min_members``), run once after the rounds.

    python benchmarks/rl_step.py                       # 2,048 samples, concurrency 256, 3 rounds
    python benchmarks/rl_step.py --concurrency 512 --rounds 5 --deadline 10
    python benchmarks/rl_step.py --scale 5             # median 1 s, p99 15 s: the tail, not the CPU, decides
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

from openai import AsyncOpenAI

from gradekit.graders._group import group_grader
from gradekit.graders._llm import llm_grader
from gradekit.graders._sample import Sample, Trajectory
from gradekit.judge import Judge, Limiter, RetryPolicy, load_rubric
from gradekit.judge.testing import Lognormal

MEDIAN, P99 = 0.2, 3.0
RUBRIC = load_rubric("semantic_equivalence_en")

SERVER = r'''
import json, re, signal, threading
from gradekit.judge.testing import FakeProvider, Lognormal, Reply
LAT = Lognormal(%(median)r, %(p99)r, seed=%(seed)r)  # the name a sample's draw is keyed by: "sample-N"
seen, lock = {}, threading.Lock()
def latency(body):
    text = body["messages"][-1]["content"]
    key = re.search(r"round-\d+ sample-\d+", text).group(0)
    with lock:
        nth = seen.get(key, 0)
        seen[key] = nth + 1
    return LAT.draw(key.split(" ")[1], nth)   # the first request of a sample: the same delay in every round
fakes = [FakeProvider(latency=latency).start() for _ in range(2)]
print(" ".join(f.base_url for f in fakes), flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
stop.wait()
counts = [len(f.chat_requests()) for f in fakes]
for f in fakes:
    f.stop()
'''


@contextmanager
def fake_fleet(seed: int, scale: float = 1.0):
    # stderr dropped: a cancelled request disconnects, which the fake may log.
    proc = subprocess.Popen([sys.executable, "-c", SERVER % {"median": MEDIAN * scale, "p99": P99 * scale, "seed": seed}],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield proc.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def groups(n_groups: int, size: int, round_: int) -> list[tuple[Sample, list[Trajectory]]]:
    out = []
    for g in range(n_groups):
        sample = Sample(messages=[{"role": "user", "content": f"Question {g}: what is the capital of France?"}], references={"answer": "Paris"})
        trajectories = [Trajectory(messages=[{"role": "assistant", "content": f"Paris (round-{round_} sample-{g * size + k})"}],
                                   finish_reason="stop") for k in range(size)]
        out.append((sample, trajectories))
    return out


async def run_bare(urls: list[str], data: list[tuple[Sample, list[Trajectory]]], concurrency: int) -> tuple[float, int]:
    clients = [AsyncOpenAI(base_url=u, api_key="k", max_retries=2, timeout=600) for u in urls]
    semaphore = asyncio.Semaphore(concurrency)
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": RUBRIC.output.json_schema, "strict": True}}
    jobs = [RUBRIC.render({"question": s.prompt_text, "references": ["Paris"], "prediction": t.messages[-1].text})
            for s, ts in data for t in ts]

    async def one(i: int, messages: list[dict]) -> bool:
        async with semaphore:
            reply = await clients[i % len(clients)].chat.completions.create(model="fake-judge", temperature=0,
                                                                            response_format=schema, messages=messages)
            return json.loads(reply.choices[0].message.content)["judgement"] == "correct"

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i, m) for i, m in enumerate(jobs)))
    wall = time.perf_counter() - started
    for client in clients:
        await client.close()
    assert all(results)
    return wall, len(jobs)


async def run_gradekit(urls: list[str], data: list[tuple[Sample, list[Trajectory]]], concurrency: int, hedge: bool,
                       deadline: float | None = None, min_members: int = 4) -> dict:
    # Each endpoint's limiter is modelled on this one: half the concurrency each, the same in all as the bare loop.
    judge = Judge("fake-judge", base_url=urls, api_key="k", timeout=600, cache=None, hedge=hedge,
                  limiter=Limiter(concurrency=max(1, concurrency // len(urls))), retry=RetryPolicy(max_attempts=1, parse_retries=0))
    grader = group_grader(llm_grader(judge, "semantic_equivalence_en"), group_deadline_s=deadline, min_members=min_members)
    started = time.perf_counter()
    async with judge:
        results = await asyncio.gather(*(grader(s, ts) for s, ts in data))
    wall = time.perf_counter() - started
    sent = sum(e.requests for e in judge.endpoints)
    return {"wall": wall, "requests": sent, "hedges": judge.hedges, "failed_groups": sum(r.status != "SUCCESS" for r in results),
            "placeholders": sum(len(r.failed_members) for r in results)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=256, help="requests in flight, over both endpoints")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the three contenders")
    parser.add_argument("--deadline", type=float, default=None, help="also run a group_deadline_s contender once (seconds)")
    parser.add_argument("--min-members", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every latency (median, p99): 5 keeps a loaded machine's CPU from being the bottleneck")
    args = parser.parse_args()
    n = args.groups * args.size
    lat = Lognormal(MEDIAN * args.scale, P99 * args.scale, seed=args.seed)
    delays = sorted(lat.draw(f"sample-{i}") for i in range(n))
    ideal = delays[-1]
    print(f"{n} samples ({args.groups} groups of {args.size}) on a fleet of two; latency median {delays[n // 2]:.3f} s, "
          f"p99 {delays[int(0.99 * n)]:.2f} s, max {ideal:.2f} s; concurrency {args.concurrency}; {args.rounds} rounds", flush=True)
    walls: dict[str, list[float]] = {"bare": [], "no hedge": [], "hedged": []}
    ratios: dict[str, list[float]] = {"no hedge": [], "hedged": []}
    extra: list[float] = []
    won: list[int] = []
    order = ["bare", "no hedge", "hedged"]
    with fake_fleet(args.seed, args.scale) as urls:
        round_ = 0
        for r in range(args.rounds):
            this = {}
            for name in order[r % 3:] + order[:r % 3]:  # each round starts with another contender
                round_ += 1
                data = groups(args.groups, args.size, round_)
                if name == "bare":
                    this[name], _ = await run_bare(urls, data, args.concurrency)
                else:
                    result = await run_gradekit(urls, data, args.concurrency, hedge=name == "hedged")
                    this[name] = result["wall"]
                    if name == "hedged":
                        hedges = result["hedges"]
                        extra.append(hedges.sent / max(1, result["requests"] - hedges.sent))
                        won.append(hedges.won)
                walls[name].append(this[name])
            for name in ratios:
                ratios[name].append(this[name] / this["bare"])
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in this.items())
                  + f"; hedges {extra[-1]:.1%} extra ({won[-1]} won)", flush=True)
        cut = None
        if args.deadline is not None:
            round_ += 1
            cut = await run_gradekit(urls, groups(args.groups, args.size, round_), args.concurrency, hedge=True,
                                     deadline=args.deadline, min_members=args.min_members)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\nideal (slowest single latency)   {ideal:6.2f} s")
    print(f"bare asyncio loop                {med['bare']:6.2f} s   1.00x (median step time)")
    r_plain, r_hedge = statistics.median(ratios["no hedge"]), statistics.median(ratios["hedged"])
    print(f"gradekit, no hedging             {med['no hedge']:6.2f} s   {r_plain:.2f}x bare wall time (median ratio), "
          f"throughput {1 / r_plain:.2f}x bare (target >= 0.95x)")
    print(f"gradekit, hedged                 {med['hedged']:6.2f} s   {r_hedge:.2f}x bare wall time (median ratio; target <= 0.60x), "
          f"{statistics.median(extra):.1%} extra requests (median; max {max(extra):.1%}; target <= 10%)")
    print(f"ratios per round: no hedge {', '.join(f'{x:.2f}' for x in ratios['no hedge'])}; "
          f"hedged {', '.join(f'{x:.2f}' for x in ratios['hedged'])}")
    if cut is not None:
        print(f"gradekit, hedged, group_deadline_s={args.deadline:g}: {cut['wall']:.2f} s; {cut['placeholders']} placeholder members "
              f"({cut['placeholders'] / n:.1%}), {cut['failed_groups']} groups failed ({cut['failed_groups'] / args.groups:.1%})")
    assert not math.isnan(ideal)


if __name__ == "__main__":
    asyncio.run(main())
