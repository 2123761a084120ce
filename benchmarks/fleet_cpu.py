"""A fleet's client CPU per judgement against one endpoint's, limits told to nobody.

Three fake providers (separate processes, so their CPU is not counted) enforce 10, 20 and 30
req/s with OpenAI's rate-limit headers and 200 ms latency; one Judge takes the three as its fleet
(``base_url=[...]``), no rps told, 64 requests in flight per endpoint. Beside it, one fake
enforcing the summed 60 req/s through a single-endpoint Judge at the same concurrency (192).
The two alternate ``--rounds`` times; printed: client CPU seconds per judgement (process CPU time
/ judgements) of each, their median ratio (target <= 1.1), throughput, 429s, and how often the
fleet's waiting requests woke (``Router.wakeups`` per judgement).

    python benchmarks/fleet_cpu.py                 # 600 judgements per run, 3 rounds
    python benchmarks/fleet_cpu.py --n 900 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import ExitStack

from gradekit.judge import Judge, Limiter, RetryPolicy, load_rubric

from throughput import fake_provider

RUBRIC = load_rubric("semantic_equivalence_en")


async def run(urls: list[str], rows: list[dict], per_endpoint: int) -> dict:
    judge = Judge("fake-judge", base_url=urls if len(urls) > 1 else urls[0], api_key="k", cache=None,
                  limiter=Limiter(concurrency=per_endpoint * (1 if len(urls) > 1 else 3)), retry=RetryPolicy(max_attempts=8))
    wall, cpu = time.perf_counter(), time.process_time()
    async with judge:
        verdicts = await asyncio.gather(*(judge.judge(RUBRIC, row) for row in rows))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    router = judge._fleet.router
    return {"cpu": cpu / len(rows), "rate": len(rows) / wall, "failed": sum(not v.ok for v in verdicts),
            "429": sum(e.rate_limited for e in judge.endpoints), "wakeups": getattr(router, "wakeups", 0) / len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600, help="judgements per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per fleet endpoint")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"fleet": [], "single": []}
    ratios = []
    for r in range(args.rounds):
        rows = [{"question": f"r{r}-{i}", "references": ["x"], "prediction": "y"} for i in range(args.n)]
        this = {}
        for name in (["fleet", "single"] if r % 2 == 0 else ["single", "fleet"]):
            with ExitStack() as stack:  # new fakes for every run: no rate-limit bucket left over from the last one
                urls = [stack.enter_context(fake_provider("--latency", "0.2", "--rps", str(rps), quiet=True)) for rps in ((10, 20, 30) if name == "fleet" else (60,))]
                this[name] = asyncio.run(run(urls, rows, args.concurrency))
        for name, result in this.items():
            results[name].append(result)
        ratios.append(this["fleet"]["cpu"] / this["single"]["cpu"])
        print(f"round {r + 1}: " + "; ".join(f"{k}: {v['cpu'] * 1e3:.2f} ms CPU/judgement, {v['rate']:.1f} j/s, "
                                              f"{v['429']} x 429, {v['failed']} failed, {v['wakeups']:.1f} wakeups/j"
                                              for k, v in this.items()), flush=True)
    med = {k: statistics.median(x["cpu"] for x in v) for k, v in results.items()}
    print(f"\nCPU per judgement: fleet 10+20+30 {med['fleet'] * 1e3:.2f} ms, one endpoint (60) {med['single'] * 1e3:.2f} ms; "
          f"ratio {statistics.median(ratios):.3f} median (range {min(ratios):.3f}-{max(ratios):.3f}; target <= 1.1)")
    print(f"fleet wakeups per judgement (median): {statistics.median(x['wakeups'] for x in results['fleet']):.1f}")


if __name__ == "__main__":
    main()
