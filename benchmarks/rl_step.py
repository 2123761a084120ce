"""One RL step's reward stage: 2,048 samples (256 groups of 8) against a heavy-tailed judge.

The fake judge runs as a separate process and answers each sample after a lognormal delay
(median 200 ms, p99 about 3 s: sigma = ln(15) / 2.326), drawn once per sample from a seeded
generator, so every contender meets the very same latencies. Contenders, one after the other:

- ``bare``: a hand-written asyncio loop (AsyncOpenAI + a semaphore at the same concurrency) that
  sends every sample's rendered messages; the step ends when the last answer is in;
- ``gradekit``: 256 ``group_grader`` groups gathered, the judge's limiter at the same concurrency;
- ``gradekit + deadline``: the same with ``group_deadline_s`` and ``on_member_error: renormalize``
  (``min_members``): members still waiting at the deadline are failed as timeout and their groups
  decided on the others; the share of placeholder members and of groups failed is reported;
- ``ideal``: the step's slowest single latency (what infinite concurrency and no overhead would take).

Hedged requests (issue 32) are not built yet, so there is no hedging contender.

    python benchmarks/rl_step.py                       # defaults: 2,048 samples, concurrency 512
    python benchmarks/rl_step.py --concurrency 256 --deadline 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import subprocess
import sys
import time
from contextlib import contextmanager

from openai import AsyncOpenAI

from graders._group import group_grader
from graders._llm import llm_grader
from graders._sample import Sample, Trajectory
from judge import Judge, Limiter, RetryPolicy, load_rubric

MEDIAN, P99 = 0.2, 3.0
SIGMA = math.log(P99 / MEDIAN) / 2.326
RUBRIC = load_rubric("semantic_equivalence_en")
ADAPT = "--no-adapt" not in sys.argv

SERVER = r'''
import json, math, random, re, sys, signal, threading
from judge.testing import FakeProvider, Reply
MU, SIGMA, SEED = math.log(%(median)r), %(sigma)r, %(seed)r
def respond(body):
    text = body["messages"][-1]["content"]
    n = int(re.search(r"sample-(\d+)", text).group(1))
    delay = random.Random(SEED * 1_000_003 + n).lognormvariate(MU, SIGMA)
    return Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}), delay=delay)
fake = FakeProvider(responder=respond)
fake.start()
print(fake.base_url, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
stop.wait()
fake.stop()
'''


def latency(n: int, seed: int) -> float:
    return random.Random(seed * 1_000_003 + n).lognormvariate(math.log(MEDIAN), SIGMA)


@contextmanager
def fake_judge(seed: int):
    # stderr dropped: a member cancelled at its deadline disconnects, which the fake logs as a traceback.
    proc = subprocess.Popen([sys.executable, "-c", SERVER % {"median": MEDIAN, "sigma": SIGMA, "seed": seed}],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def groups(n_groups: int, size: int) -> list[tuple[Sample, list[Trajectory]]]:
    out = []
    for g in range(n_groups):
        sample = Sample(messages=[{"role": "user", "content": f"Question {g}: what is the capital of France?"}], references={"answer": "Paris"})
        trajectories = [Trajectory(messages=[{"role": "assistant", "content": f"Paris (sample-{g * size + k})"}], finish_reason="stop")
                        for k in range(size)]
        out.append((sample, trajectories))
    return out


async def run_bare(base_url: str, data: list[tuple[Sample, list[Trajectory]]], concurrency: int) -> float:
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=2, timeout=600)  # the SDK's own retries on a dropped connection
    semaphore = asyncio.Semaphore(concurrency)
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": RUBRIC.output.json_schema, "strict": True}}
    jobs = [RUBRIC.render({"question": s.prompt_text, "references": ["Paris"], "prediction": t.messages[-1].text})
            for s, ts in data for t in ts]

    async def one(messages: list[dict]) -> bool:
        async with semaphore:
            reply = await client.chat.completions.create(model="fake-judge", temperature=0, response_format=schema, messages=messages)
            return json.loads(reply.choices[0].message.content)["judgement"] == "correct"

    started = time.perf_counter()
    async with client:
        results = await asyncio.gather(*(one(m) for m in jobs))
    assert all(results)
    return time.perf_counter() - started


async def run_gradekit(base_url: str, data: list[tuple[Sample, list[Trajectory]]], concurrency: int,
                       deadline: float | None, min_members: int) -> tuple[float, int, int]:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", timeout=600, cache=None,
                  limiter=Limiter(concurrency=concurrency, adapt=ADAPT), retry=RetryPolicy(max_attempts=1, parse_retries=0))
    grader = group_grader(llm_grader(judge, "semantic_equivalence_en"), group_deadline_s=deadline, min_members=min_members)
    started = time.perf_counter()
    async with judge:
        results = await asyncio.gather(*(grader(s, ts) for s, ts in data))
    wall = time.perf_counter() - started
    placeholders = sum(len(r.failed_members) for r in results)
    failed_groups = sum(r.status != "SUCCESS" for r in results)
    return wall, placeholders, failed_groups


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--deadline", type=float, default=2.5, help="group_deadline_s of the deadline contender")
    parser.add_argument("--min-members", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-adapt", action="store_true", help="the judge's limiter does not learn a pace from rate headers")
    args = parser.parse_args()
    data = groups(args.groups, args.size)
    n = args.groups * args.size
    delays = sorted(latency(i, args.seed) for i in range(n))
    ideal = delays[-1]
    print(f"{n} samples ({args.groups} groups of {args.size}); latency median {delays[n // 2]:.3f} s, "
          f"p99 {delays[int(0.99 * n)]:.2f} s, max {ideal:.2f} s; concurrency {args.concurrency}")
    with fake_judge(args.seed) as base_url:
        bare = await run_bare(base_url, data, args.concurrency)
        plain, _, _ = await run_gradekit(base_url, data, args.concurrency, None, args.min_members)
        cut, placeholders, failed = await run_gradekit(base_url, data, args.concurrency, args.deadline, args.min_members)
    print(f"ideal (slowest single latency)   {ideal:6.2f} s")
    print(f"bare asyncio loop                {bare:6.2f} s   1.00x bare")
    print(f"gradekit                         {plain:6.2f} s   {plain / bare:.2f}x bare")
    print(f"gradekit, group_deadline_s={args.deadline:g}   {cut:6.2f} s   {cut / bare:.2f}x bare; "
          f"{placeholders} placeholder members ({placeholders / n:.1%}), {failed} groups failed ({failed / args.groups:.1%})")


if __name__ == "__main__":
    asyncio.run(main())
