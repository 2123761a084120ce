"""Judge-core throughput and overhead: gradekit vs a bare AsyncOpenAI + semaphore loop.

Both run in this process, one after the other, against the same fake provider started as a
separate process (so its CPU is not counted). Figures are ratios against the bare loop of the
same run, because this machine is shared and absolute numbers drift.

    python benchmarks/throughput.py            # all three scenarios
    python benchmarks/throughput.py --n 300    # more judgements per scenario
    python benchmarks/throughput.py --rounds 5 # (a) and (c) alternate gradekit and bare 5 times: the median ratio

On a loaded machine one pair of runs can differ by 2x either way; the contenders alternate
round by round and the median of the per-round ratios is reported, with the spread.

(a) 200 ms latency, no rate limit: judgements/s, gradekit / bare.
(b) 200 ms latency, the server enforcing 20 req/s, gradekit configured to 20 req/s:
    judgements/s as a share of the limit, failed rows (target >= 0.97 of the limit, 0 failed).
(c) 0 ms latency: client CPU seconds per judgement, gradekit / bare (target <= 1.15).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

from openai import AsyncOpenAI

from judge import Judge, Limiter, RetryPolicy, load_rubric

RUBRIC = load_rubric("semantic_equivalence_zh")


def rows(n: int) -> list[dict]:
    return [{"question": f"问题 {i}：长江有多长？", "references": ["约6300公里"], "prediction": f"回答 {i}：6300 千米"} for i in range(n)]


@contextmanager
def fake_provider(*args: str):
    proc = subprocess.Popen([sys.executable, "-m", "judge.testing", "--port", "0", *args], stdout=subprocess.PIPE, text=True)
    try:
        base_url = proc.stdout.readline().strip()
        yield base_url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def run_gradekit(base_url: str, data: list[dict], concurrency: int, rps: float | None) -> tuple[int, int]:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", limiter=Limiter(rps=rps, concurrency=concurrency),
                  retry=RetryPolicy(max_attempts=6), cache=None)
    async with judge:
        verdicts = await asyncio.gather(*(judge.judge(RUBRIC, row) for row in data))
    return sum(v.ok for v in verdicts), sum(not v.ok for v in verdicts)


async def run_bare(base_url: str, data: list[dict], concurrency: int) -> tuple[int, int]:
    """What a user writes by hand: send the prompt, json.loads the verdict.

    It sends the very messages gradekit sends, rendered before the clock starts, so the two put
    the same load on the server and the comparison charges gradekit for its rendering too.
    """
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    semaphore = asyncio.Semaphore(concurrency)
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": RUBRIC.output.json_schema, "strict": True}}

    async def one(messages: list[dict]) -> bool:
        async with semaphore:
            try:
                reply = await client.chat.completions.create(model="fake-judge", temperature=0, response_format=schema,
                                                             messages=messages)
                return json.loads(reply.choices[0].message.content)["judgement"] in ("正确", "错误")
            except Exception:
                return False

    async with client:
        results = await asyncio.gather(*(one(messages) for messages in data))
    return sum(results), sum(not r for r in results)


def measure(coro_factory) -> tuple[float, float, tuple[int, int]]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = asyncio.run(coro_factory())
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="judgements per scenario and contender")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternating gradekit/bare rounds for (a) and (c)")
    args = parser.parse_args()
    n, c = args.n, args.concurrency
    data = rows(n)
    rendered = [RUBRIC.render(row) for row in data]
    print(f"N={n} judgements per run, concurrency {c}, {args.rounds} alternating rounds\n")

    ratios, g_rates, b_rates, g_bad = [], [], [], 0
    with fake_provider("--latency", "0.2") as url:
        measure(lambda: run_bare(url, rendered[:20], c))  # warm up imports and the server
        for _ in range(args.rounds):
            # A new process-wide dialect per round would be a new process: each round's Judge is new, and
            # its learning gate (one round trip per endpoint and process) is paid in the first round only.
            g_wall, _, (_, bad) = measure(lambda: run_gradekit(url, data, c, None))
            b_wall, _, _ = measure(lambda: run_bare(url, rendered, c))
            g_bad += bad
            g_rates.append(n / g_wall)
            b_rates.append(n / b_wall)
            ratios.append(b_wall / g_wall)
    print("(a) 200 ms latency, no limit")
    print(f"    gradekit {statistics.median(g_rates):7.1f} judgements/s (median)  failed {g_bad}")
    print(f"    bare     {statistics.median(b_rates):7.1f} judgements/s (median)")
    print(f"    ratio gradekit/bare = {statistics.median(ratios):.3f} median, first round {ratios[0]:.3f} "
          f"(with the learning gate), range {min(ratios):.3f}-{max(ratios):.3f}\n")

    limit = 20.0
    with fake_provider("--latency", "0.2", "--rps", str(limit)) as url:
        g_wall, _, (g_ok, g_bad) = measure(lambda: run_gradekit(url, data, c, limit))
        b_wall, _, (b_ok, b_bad) = measure(lambda: run_bare(url, rendered, c))
    g_rate = n / g_wall  # plain judgements per wall second, start-up and the last reply's latency included
    print(f"(b) 200 ms latency, server limit {limit:g} req/s, gradekit --rps {limit:g}")
    print(f"    gradekit {g_rate:7.2f} judgements/s = {g_rate / limit:.3f} of the limit  failed {g_bad}  (target >= 0.97, 0 failed)")
    print(f"    bare     {n / b_wall:7.2f} judgements/s  failed {b_bad} (no limiter, no retries: 429s are lost rows)\n")

    with fake_provider("--latency", "0") as url:
        measure(lambda: run_gradekit(url, data[:20], c, None))
        cpu_g, cpu_b = [], []
        for _ in range(max(3, args.rounds)):
            cpu_g.append(measure(lambda: run_gradekit(url, data, c, None))[1] / n)
            cpu_b.append(measure(lambda: run_bare(url, rendered, c))[1] / n)
    print(f"(c) 0 ms latency, client CPU per judgement (best of {len(cpu_g)}, alternating)")
    print(f"    gradekit {min(cpu_g) * 1e3:6.3f} ms   bare {min(cpu_b) * 1e3:6.3f} ms   ratio = {min(cpu_g) / min(cpu_b):.3f} "
          "(target <= 1.15)")


if __name__ == "__main__":
    main()
