"""Where the client's CPU goes in an unlimited run: cProfile over 10,000 judgements (issue 36).

The fake provider runs as a separate process with no latency (so its CPU is not in the profile);
the run is gradekit's API, 64 in flight, no cache, no limit. The top entries by own time and by
cumulative time inside gradekit are printed; ``--out`` keeps the raw profile for snakeviz/pstats.

    python benchmarks/profile_run.py                 # 10,000 rows
    python benchmarks/profile_run.py --n 2000 --top 30 --out /tmp/run.prof
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time

from gradekit.judge import Judge, Limiter, RetryPolicy

from throughput import RUBRIC, fake_provider, rows


async def run(base_url: str, data: list[dict], concurrency: int) -> int:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", limiter=Limiter(concurrency=concurrency),
                  retry=RetryPolicy(max_attempts=6), cache=None)
    async with judge:
        verdicts = await asyncio.gather(*(judge.judge(RUBRIC, row) for row in data))
    return sum(v.ok for v in verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="write the raw profile here")
    args = parser.parse_args()
    data = rows(args.n)
    with fake_provider("--latency", "0") as url:
        asyncio.run(run(url, data[:50], args.concurrency))  # warm up imports, the server and the learnt dialect
        profile = cProfile.Profile()
        cpu = time.process_time()
        profile.enable()
        ok = asyncio.run(run(url, data, args.concurrency))
        profile.disable()
        cpu = time.process_time() - cpu
    print(f"{ok}/{args.n} ok; {cpu / args.n * 1e3:.3f} ms CPU per judgement under the profiler\n")
    if args.out:
        profile.dump_stats(args.out)
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(args.top)
        print(f"---- top {args.top} by {order} ----")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip() and not line.startswith(("   Ordered", "   List"))))
        print()


if __name__ == "__main__":
    main()
