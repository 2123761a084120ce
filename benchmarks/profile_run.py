"""Where the client's CPU goes in an unlimited run: cProfile over 10,000 judgements (issues 36, 49).

The fake provider runs as a separate process with no latency (so its CPU is not in the profile);
the run is gradekit's API, 64 in flight, no cache, no limit. The top entries by own time and by
cumulative time inside gradekit are printed; ``--out`` keeps the raw profile for snakeviz/pstats.

``--stages``: the profile is taken on the process's CPU clock, and its own time grouped by where
it is spent (each gradekit module, aiohttp, the event loop, jinja2, pydantic, ...); each group's
share times the CPU per judgement of the same run without the profiler is its microseconds per
judgement. ``--latency`` gives the fake a latency (benchmarks/wire.py measures at 50 ms);
``--no-fast-wire`` profiles the SDK path.

    python benchmarks/profile_run.py                 # 10,000 rows
    python benchmarks/profile_run.py --n 2000 --top 30 --out /tmp/run.prof
    python benchmarks/profile_run.py --n 3000 --latency 0.05 --stages
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


async def run(base_url: str, data: list[dict], concurrency: int, fast_wire: bool = True) -> int:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", limiter=Limiter(concurrency=concurrency),
                  retry=RetryPolicy(max_attempts=6), cache=None, fast_wire=fast_wire)
    async with judge:
        verdicts = await asyncio.gather(*(judge.judge(RUBRIC, row) for row in data))
    return sum(v.ok for v in verdicts)


def stage(path: str, function: str) -> str:
    """The group a profiled function's own time is counted in."""
    if "site-packages/" in path:
        package = path.split("site-packages/")[1].split("/")[0]
        if package in ("aiohttp", "multidict", "yarl", "aiohappyeyeballs", "propcache", "frozenlist", "aiosignal"):
            return "aiohttp (the HTTP client)"
        return package
    if "/judge/" in path:
        return "gradekit " + path.rsplit("/", 1)[-1]
    if "/prompts/" in path:
        return "jinja2"  # a rubric template's compiled blocks
    if "asyncio" in path or "selectors" in path:
        return "event loop (asyncio)"
    if path == "~":
        name = function.strip("<>").replace("built-in method ", "").replace("method ", "")
        if any(word in name for word in ("socket", "epoll", "recv", "send")):
            return "socket and epoll (kernel calls)"
        if "orjson" in name:
            return "orjson"
        if "_contextvars" in name:
            return "event loop (asyncio)"
        return "builtins (dict, str, isinstance, ...)"
    if path.endswith(("json/decoder.py", "json/encoder.py", "json/__init__.py")):
        return "json (stdlib)"
    return "stdlib " + path.rsplit("/", 1)[-1]


def print_stages(profile: cProfile.Profile, cpu_per_judgement: float, top: int) -> None:
    from collections import Counter

    own: Counter[str] = Counter()
    for (path, _, function), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        own[stage(path, function)] += tottime
    total = sum(own.values())
    print(f"---- own time by stage: share of the profile x {cpu_per_judgement * 1e6:.0f} us CPU per judgement unprofiled ----")
    for name, seconds in own.most_common(top):
        print(f"    {name:<42} {seconds / total * 100:5.1f}%  {seconds / total * cpu_per_judgement * 1e6:6.1f} us")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--latency", default="0")
    parser.add_argument("--stages", action="store_true", help="own time by stage, in microseconds per judgement")
    parser.add_argument("--no-fast-wire", action="store_true", help="the SDK sends (Judge(fast_wire=False))")
    parser.add_argument("--out", help="write the raw profile here")
    args = parser.parse_args()
    data = rows(args.n)
    fast = not args.no_fast_wire
    with fake_provider("--latency", args.latency, quiet=True) as url:
        asyncio.run(run(url, data[:50], args.concurrency, fast))  # warm up imports, the server and the learnt dialect
        cpu = time.process_time()
        asyncio.run(run(url, data, args.concurrency, fast))
        plain = (time.process_time() - cpu) / args.n  # the same run without the profiler: what the shares divide
        profile = cProfile.Profile(time.process_time) if args.stages else cProfile.Profile()
        cpu = time.process_time()
        profile.enable()
        ok = asyncio.run(run(url, data, args.concurrency, fast))
        profile.disable()
        cpu = time.process_time() - cpu
    print(f"{ok}/{args.n} ok; {plain * 1e3:.3f} ms CPU per judgement, {cpu / args.n * 1e3:.3f} ms under the profiler\n")
    if args.out:
        profile.dump_stats(args.out)
    if args.stages:
        print_stages(profile, plain, args.top)
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(args.top)
        print(f"---- top {args.top} by {order} ----")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip() and not line.startswith(("   Ordered", "   List"))))
        print()


if __name__ == "__main__":
    main()
