"""A judgement against the cost of a raw HTTP request (issue 49), every figure a ratio within one run.

Contenders, each sending gradekit's exact requests (``Judge.prepare``, built before the clock) to the
same fake provider (a separate process, so its CPU is not the client's), 64 in flight:

- ``raw``: a bare aiohttp + orjson loop: post the bytes, read the reply, parse the verdict. The floor.
- ``sdk``: the plain SDK loop a user writes (``chat.completions.create``, ``json.loads`` of the content).
- ``fast``: gradekit's ``Judge`` (rendering, cache key, limiter, retry, fleet, parse, Verdict), fast wire on.
- ``sdkwire``: the same Judge with ``fast_wire=False`` (the SDK sends).

Scenarios: (cpu) 50 ms latency, --n requests: client CPU per judgement and throughput, each against
raw (targets: CPU <= 2.0x raw, throughput >= 0.95x raw); (wide) 200 ms latency, no limit, 300 rows:
throughput against the plain SDK loop (target >= 0.97x); (pace) `gradekit grade` at 64 in flight
against a 20 req/s limit (burst 20), 400 rows from a cold start, without rate headers (target >= 0.90
of the limit) and with them (>= 0.95, no 429 after the first flight); (wave) a fresh `gradekit grade`
process's first wave: 128 rows at 128 in flight, 500 ms latency: how long after the first request the
128th reaches the server, fast wire on and off.

    python benchmarks/wire.py                   # every scenario, 5 alternating rounds
    python benchmarks/wire.py --only cpu,wide --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import RUBRIC, exact_requests, fake_provider, rows  # noqa: E402

from gradekit.judge import Judge, Limiter, RetryPolicy  # noqa: E402

LABELS = ("正确", "错误")


async def run_raw(base_url: str, requests: list[dict], concurrency: int) -> int:
    """The floor: gradekit's request bytes over aiohttp, the reply and its verdict read with orjson."""
    import aiohttp
    import orjson

    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": "Bearer k", "Content-Type": "application/json"}
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000)) as session:
        async def one(request: dict) -> bool:
            async with semaphore:
                async with session.post(url, data=orjson.dumps(request), headers=headers) as response:
                    body = orjson.loads(await response.read())
                return orjson.loads(body["choices"][0]["message"]["content"])["judgement"] in LABELS

        results = await asyncio.gather(*(one(r) for r in requests))
    return sum(results)


async def run_sdk(base_url: str, requests: list[dict], concurrency: int) -> int:
    """The plain SDK loop a user writes: create(), json.loads of the content."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(request: dict) -> bool:
        async with semaphore:
            reply = await client.chat.completions.create(**request)
            return json.loads(reply.choices[0].message.content)["judgement"] in LABELS

    async with client:
        results = await asyncio.gather(*(one(r) for r in requests))
    return sum(results)


async def run_judge(base_url: str, data: list[dict], concurrency: int, fast: bool) -> int:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", limiter=Limiter(concurrency=concurrency),
                  retry=RetryPolicy(max_attempts=6), cache=None, fast_wire=fast)
    async with judge:
        verdicts = await asyncio.gather(*(judge.judge(RUBRIC, row) for row in data))
    return sum(v.ok for v in verdicts)


def measure(factory) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    ok = asyncio.run(factory())
    return time.perf_counter() - wall, time.process_time() - cpu, ok


def contenders(url: str, data: list[dict], requests: list[dict], concurrency: int) -> dict:
    return {"raw": lambda: run_raw(url, requests, concurrency), "sdk": lambda: run_sdk(url, requests, concurrency),
            "fast": lambda: run_judge(url, data, concurrency, True), "sdkwire": lambda: run_judge(url, data, concurrency, False)}


def alternate(url: str, data: list[dict], requests: list[dict], concurrency: int, rounds: int) -> dict[str, list[tuple]]:
    """Each contender once per round, the order rotated round by round; (wall, cpu, ok) per run."""
    runs = contenders(url, data, requests, concurrency)
    warm = contenders(url, data[:64], requests[:64], concurrency)
    for name in runs:  # warm up: imports, the server, the dialect learnt
        measure(warm[name])
    results: dict[str, list[tuple]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(measure(runs[name]))
    return results


def ratio_line(label: str, values: list[float], target: str) -> str:
    return (f"    {label:<44} {statistics.median(values):6.3f} median (range {min(values):.3f}-{max(values):.3f}; "
            f"target {target})")


def cpu_scenario(n: int, concurrency: int, rounds: int) -> None:
    data = rows(n)
    with fake_provider("--latency", "0.05", quiet=True) as url:
        requests = exact_requests(url, data)
        results = alternate(url, data, requests, concurrency, rounds)
    print(f"(cpu) 50 ms latency, {n} requests, {concurrency} in flight, {rounds} alternating rounds")
    for name, runs in results.items():
        walls, cpus, oks = zip(*runs)
        print(f"    {name:<8} CPU {statistics.median(cpus) / n * 1e3:6.3f} ms per judgement, "
              f"{n / statistics.median(walls):7.1f} judgements/s (median), ok {min(oks)}/{n}")
    per = {name: [(w, c) for w, c, _ in runs] for name, runs in results.items()}
    print(ratio_line("CPU per judgement, gradekit / raw", [f[1] / r[1] for f, r in zip(per["fast"], per["raw"])], "<= 2.0"))
    print(ratio_line("CPU, gradekit with fast_wire=False / raw", [f[1] / r[1] for f, r in zip(per["sdkwire"], per["raw"])], "-"))
    print(ratio_line("CPU, plain SDK loop / raw", [f[1] / r[1] for f, r in zip(per["sdk"], per["raw"])], "-"))
    print(ratio_line("throughput, gradekit / raw", [r[0] / f[0] for f, r in zip(per["fast"], per["raw"])], ">= 0.95"))
    print(ratio_line("throughput, gradekit / plain SDK loop", [r[0] / f[0] for f, r in zip(per["fast"], per["sdk"])], "-"))
    print()


def wide_scenario(n: int, concurrency: int, rounds: int) -> None:
    data = rows(n)
    with fake_provider("--latency", "0.2", quiet=True) as url:
        requests = exact_requests(url, data)
        results = alternate(url, data, requests, concurrency, rounds)
    per = {name: [w for w, _, _ in runs] for name, runs in results.items()}
    print(f"(wide) 200 ms latency, no limit, {n} rows, {concurrency} in flight, {rounds} alternating rounds")
    for name, walls in per.items():
        print(f"    {name:<8} {n / statistics.median(walls):7.1f} judgements/s (median)")
    print(ratio_line("throughput, gradekit / plain SDK loop", [s / f for f, s in zip(per["fast"], per["sdk"])], ">= 0.97"))
    print(ratio_line("throughput, gradekit / raw", [s / f for f, s in zip(per["fast"], per["raw"])], "-"))
    print(ratio_line("throughput, fast_wire=False / plain SDK loop", [s / f for f, s in zip(per["sdkwire"], per["sdk"])], "-"))
    print()


def pace_scenario(n: int, concurrency: int) -> None:
    from pacing import report, run

    print(f"(pace) `gradekit grade`, {n} rows, {concurrency} in flight, 200 ms latency, limit 20 req/s (burst 20), cold start")
    with tempfile.TemporaryDirectory() as tmp:
        for label, headers in (("no rate headers, Retry-After only", False), ("rate headers", True)):
            result = run("p", Path(tmp), n, [("--concurrency", str(concurrency))], rate_limit_rps=20, rate_limit_headers=headers)
            report(f"    {label}", result, 20)
            answered = sorted(r.time for r in result["requests"] if r.status == 200)
            late = [r for r in result["requests"] if r.status == 429 and answered and r.time > answered[0] + 0.2]
            print(f"    {'':<54} 429s after the first flight (once the first answer was back): {len(late)}")
    print()


def wave_scenario(n: int, rounds: int) -> None:
    from gradekit.judge.testing import FakeProvider

    print(f"(wave) a fresh `gradekit grade` process, {n} rows at {n} in flight, 500 ms latency: the first wave's arrival spread")
    spreads: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "rows.jsonl"
        source.write_text("".join(json.dumps({"question": f"w{i}", "references": ["x"], "prediction": "y"}) + "\n"
                                  for i in range(n)), encoding="utf-8")
        for r in range(rounds):
            for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
                with FakeProvider(latency=0.5) as fake:
                    env = {**os.environ, "GRADEKIT_FAST_WIRE": "1" if setting == "on" else "0"}
                    subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                                    "-o", str(Path(tmp) / f"out-{setting}-{r}.jsonl"), "--base-url", fake.base_url, "--api-key", "k",
                                    "--model", "fake-judge", "--no-cache", "--concurrency", str(n)],
                                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    times = sorted(q.time for q in fake.chat_requests())
                spreads[setting].append(times[n - 1] - times[0])
    for setting, values in spreads.items():
        print(f"    fast wire {setting:<3} first to {n}th request: {statistics.median(values) * 1e3:6.1f} ms median "
              f"(range {min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="requests per run in (cpu)")
    parser.add_argument("--wide-n", type=int, default=300, help="rows per run in (wide)")
    parser.add_argument("--pace-n", type=int, default=400, help="rows in (pace)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="cpu,wide,pace,wave")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"load average at start: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}\n", flush=True)
    if "cpu" in only:
        cpu_scenario(args.n, args.concurrency, args.rounds)
    if "wide" in only:
        wide_scenario(args.wide_n, args.concurrency, args.rounds)
    if "pace" in only:
        pace_scenario(args.pace_n, args.concurrency)
    if "wave" in only:
        wave_scenario(128, max(3, args.rounds // 2))
    print(f"load average at end: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
