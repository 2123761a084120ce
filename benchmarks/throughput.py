"""Judge-core throughput and overhead: gradekit vs a bare AsyncOpenAI + semaphore loop.

Both run in this process, one after the other, against the same fake provider started as a
separate process (so its CPU is not counted). Figures are ratios against the bare loop of the
same run, because this machine is shared and absolute numbers drift.

    python benchmarks/throughput.py                 # every scenario
    python benchmarks/throughput.py --only a,c      # some of them
    python benchmarks/throughput.py --rounds 5      # each alternates the contenders 5 times: the median ratio

On a loaded machine one pair of runs can differ by 2x either way; the contenders alternate
round by round and the median of the per-round ratios is reported, with the range.

(a) API, 200 ms latency, no rate limit, N rows (300), 64 in flight: judgements/s, gradekit / bare
    (target >= 0.95). The first round is a process that knows nothing of the endpoint yet.
(b) 200 ms latency, the server enforcing 20 req/s, gradekit configured to 20 req/s:
    judgements/s as a share of the limit, failed rows (target >= 0.97 of the limit, 0 failed).
(c) 0 ms latency, 1,000 rows: client CPU seconds per judgement, gradekit / the plain SDK loop
    (target <= 1.15), and gradekit / a bare loop that sends gradekit's exact requests.
(d) the CLI including its start-up (``gradekit grade`` on a JSONL file, a cache shared by the
    rounds as a user's default one is, new rows each round) against a bare loop run as a script
    the same way (start-up, read the file, send, write the verdicts): 200 ms latency, --cli-n rows
    (1,000), 64 in flight; throughput, CLI / bare (target >= 0.80).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from openai import AsyncOpenAI

from gradekit.judge import Judge, Limiter, RetryPolicy, load_rubric

RUBRIC = load_rubric("semantic_equivalence_zh")


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"question": f"问题 {i}：长江有多长？", "references": ["约6300公里"], "prediction": f"回答 {i}：6300 千米"}
            for i in range(start, start + n)]


@contextmanager
def fake_provider(*args: str, quiet: bool = False):
    """The fake provider as a separate process (its CPU is not the client's), yielding its base URL; ``quiet`` drops its stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL if quiet else None, text=True)
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


async def run_bare(base_url: str, data: list[list[dict]], concurrency: int) -> tuple[int, int]:
    """The plain SDK loop, what a user writes by hand: send the prompt, json.loads the verdict.

    It sends the very messages gradekit sends, rendered before the clock starts, so the two put
    the same load on the server and the comparison charges gradekit for its rendering too.
    """
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": RUBRIC.output.json_schema, "strict": True}}
    requests = [{"model": "fake-judge", "temperature": 0, "response_format": schema, "messages": messages} for messages in data]
    return await run_exact(base_url, requests, concurrency)


async def run_exact(base_url: str, requests: list[dict], concurrency: int) -> tuple[int, int]:
    """A bare loop that sends gradekit's exact requests (Judge.prepare, built before the clock) through the SDK."""
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(request: dict) -> bool:
        async with semaphore:
            try:
                reply = await client.chat.completions.create(**request)
                return json.loads(reply.choices[0].message.content)["judgement"] in ("正确", "错误")
            except Exception:
                return False

    async with client:
        results = await asyncio.gather(*(one(request) for request in requests))
    return sum(results), sum(not r for r in results)


def exact_requests(base_url: str, data: list[dict]) -> list[dict]:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", cache=None)
    return [judge.prepare(RUBRIC, row).request for row in data]  # type: ignore[union-attr]


def measure(coro_factory) -> tuple[float, float, tuple[int, int]]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = asyncio.run(coro_factory())
    return time.perf_counter() - wall, time.process_time() - cpu, result


BARE_SCRIPT = r"""
import asyncio, json, sys
from openai import AsyncOpenAI
source, out, base_url, concurrency = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
jobs = [json.loads(line) for line in open(source, encoding="utf-8")]
async def main():
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    semaphore = asyncio.Semaphore(concurrency)
    async def one(job):
        async with semaphore:
            try:
                reply = await client.chat.completions.create(model="fake-judge", temperature=0, messages=job["messages"],
                                                             response_format=job["response_format"])
                return {"id": job["id"], "label": json.loads(reply.choices[0].message.content)["judgement"]}
            except Exception as e:
                return {"id": job["id"], "error": str(e)}
    async with client:
        results = await asyncio.gather(*(one(job) for job in jobs))
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
asyncio.run(main())
"""


def timed_process(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def cli_scenario(n: int, concurrency: int, rounds: int) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": RUBRIC.output.json_schema, "strict": True}}
    ratios, g_rates, b_rates = [], [], []
    with tempfile.TemporaryDirectory() as tmp, fake_provider("--latency", "0.2") as url:
        folder = Path(tmp)
        cache = folder / "cache.sqlite3"
        for r in range(rounds):
            data = rows(n, start=(r + 1) * n)  # new rows each round: the cache holds the dialect, not their replies
            source = folder / f"rows{r}.jsonl"
            source.write_text("".join(json.dumps({"id": i, **row}, ensure_ascii=False) + "\n" for i, row in enumerate(data)),
                              encoding="utf-8")
            jobs = folder / f"jobs{r}.jsonl"
            jobs.write_text("".join(json.dumps({"id": i, "messages": RUBRIC.render(row), "response_format": schema},
                                               ensure_ascii=False) + "\n" for i, row in enumerate(data)), encoding="utf-8")
            g_wall = timed_process([sys.executable, "-m", "gradekit", "grade", str(source), "-r", RUBRIC.name, "-o",
                                    str(folder / f"out{r}.jsonl"), "--model", "fake-judge", "--base-url", url, "--api-key", "k",
                                    "--concurrency", str(concurrency), "--cache", str(cache)])
            b_wall = timed_process([sys.executable, "-c", BARE_SCRIPT, str(jobs), str(folder / f"bare{r}.jsonl"), url, str(concurrency)])
            g_rates.append(n / g_wall)
            b_rates.append(n / b_wall)
            ratios.append(b_wall / g_wall)
    print_rates(f"(d) CLI including start-up, {n} rows, 200 ms latency, {concurrency} in flight, {rounds} alternating rounds",
                {"gradekit grade": g_rates, "bare script   ": b_rates}, "CLI/bare", ratios, "learns the dialect", 0.80)


def print_rates(title: str, rates: dict[str, list[float]], name: str, ratios: list[float], first: str, target: float) -> None:
    """A scenario's median rates per contender and the median ratio of the alternated rounds."""
    print(title)
    for contender, values in rates.items():
        print(f"    {contender} {statistics.median(values):7.1f} judgements/s (median)")
    print(f"    ratio {name} = {statistics.median(ratios):.3f} median, first round {ratios[0]:.3f} ({first}), "
          f"range {min(ratios):.3f}-{max(ratios):.3f} (target >= {target:.2f})\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="judgements per round in (a) and (b)")
    parser.add_argument("--cpu-n", type=int, default=1000, help="judgements per round in (c)")
    parser.add_argument("--cli-n", type=int, default=1000, help="rows per round in (d)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each scenario (at least 3)")
    parser.add_argument("--only", default="a,b,c,d", help="scenarios to run, e.g. a,c")
    args = parser.parse_args()
    n, c, rounds = args.n, args.concurrency, max(3, args.rounds)
    only = set(args.only.split(","))
    data = rows(n)
    rendered = [RUBRIC.render(row) for row in data]
    print(f"{rounds} alternating rounds per scenario, concurrency {c}\n")

    if "a" in only:
        ratios, g_rates, b_rates, g_bad = [], [], [], 0
        with fake_provider("--latency", "0.2") as url:
            measure(lambda: run_bare(url, rendered[:20], c))  # warm up imports and the server
            for _ in range(rounds):
                # Each round's Judge is new; the process-wide dialect is learnt in the first round only
                # (a new process with a cache starts with it: see (d)).
                g_wall, _, (_, bad) = measure(lambda: run_gradekit(url, data, c, None))
                b_wall, _, _ = measure(lambda: run_bare(url, rendered, c))
                g_bad += bad
                g_rates.append(n / g_wall)
                b_rates.append(n / b_wall)
                ratios.append(b_wall / g_wall)
        print_rates(f"(a) API, {n} rows, 200 ms latency, no limit (gradekit failed {g_bad})",
                    {"gradekit": g_rates, "bare    ": b_rates}, "gradekit/bare", ratios, "nothing learnt yet", 0.95)

    if "b" in only:
        limit = 20.0
        with fake_provider("--latency", "0.2", "--rps", str(limit)) as url:
            g_wall, _, (g_ok, g_bad) = measure(lambda: run_gradekit(url, data, c, limit))
            b_wall, _, (b_ok, b_bad) = measure(lambda: run_bare(url, rendered, c))
        g_rate = n / g_wall  # plain judgements per wall second, start-up and the last reply's latency included
        print(f"(b) 200 ms latency, server limit {limit:g} req/s, gradekit --rps {limit:g}")
        print(f"    gradekit {g_rate:7.2f} judgements/s = {g_rate / limit:.3f} of the limit  failed {g_bad}  (target >= 0.97, 0 failed)")
        print(f"    bare     {n / b_wall:7.2f} judgements/s  failed {b_bad} (no limiter, no retries: 429s are lost rows)\n")

    if "c" in only:
        cpu_n = args.cpu_n
        cpu_data = rows(cpu_n)
        cpu_rendered = [RUBRIC.render(row) for row in cpu_data]
        with fake_provider("--latency", "0") as url:
            exact = exact_requests(url, cpu_data)
            measure(lambda: run_gradekit(url, cpu_data[:50], c, None))  # warm up; the dialect is learnt here
            measure(lambda: run_bare(url, cpu_rendered[:50], c))
            cpu_g, cpu_p, cpu_e = [], [], []
            for _ in range(rounds):
                cpu_g.append(measure(lambda: run_gradekit(url, cpu_data, c, None))[1] / cpu_n)
                cpu_p.append(measure(lambda: run_bare(url, cpu_rendered, c))[1] / cpu_n)
                cpu_e.append(measure(lambda: run_exact(url, exact, c))[1] / cpu_n)
        plain = [g / p for g, p in zip(cpu_g, cpu_p)]
        same = [g / e for g, e in zip(cpu_g, cpu_e)]
        print(f"(c) 0 ms latency, {cpu_n} rows, client CPU per judgement (median of {rounds}, alternating)")
        print(f"    gradekit {statistics.median(cpu_g) * 1e3:6.3f} ms   plain SDK loop {statistics.median(cpu_p) * 1e3:6.3f} ms   "
              f"exact-request loop {statistics.median(cpu_e) * 1e3:6.3f} ms")
        print(f"    ratio gradekit/plain = {statistics.median(plain):.3f} median (range {min(plain):.3f}-{max(plain):.3f}, "
              f"target <= 1.15); gradekit/exact = {statistics.median(same):.3f} (range {min(same):.3f}-{max(same):.3f})\n")

    if "d" in only:
        cli_scenario(args.cli_n, c, rounds)


if __name__ == "__main__":
    main()
