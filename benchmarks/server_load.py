"""Reward server under load: `gradekit serve` in its own process, its grader judging through the
fake provider (another process, 200 ms per answer), and this process as 200 concurrent clients.

    python benchmarks/server_load.py              # 2,000 requests per scenario, concurrency 200
    python benchmarks/server_load.py --n 500

Requests rotate over the four contracts (Bailian /compute_reward, DashScope /api/v1, Vertex /,
OpenRLHF /get_reward) and are classified by each contract's own rules: a score, the contract's
failure (seed "fail", DashScope "failed", Vertex/OpenRLHF 502), or 503 busy.

First, the ceiling: the same judge calls made in-process with no server (on a small shared
machine the judge client's own CPU, not the 200 ms, bounds the rate).
(a) the default pool (64 workers + 256 queued) holds all 200 clients: everything scored.
(b) a small pool (16 workers + 16 queued): the excess is refused with 503 + Retry-After at once
    while the admitted requests are still scored. Twice: a thundering herd (all clients start
    together and retry exactly 1 s later, as OpenRLHF does), then clients that start spread over
    a second and back off with full jitter (target: 503 p99 well under 50 ms).
(c) the fake provider is stopped a quarter of the way through: every request sent after it is
    gone gets the contract's failure, none a score (the fake only ever says "correct" = 1.0, so
    any other score would be made up).

The judge here retries 3 times with <= 0.5 s backoff (a GraderRewardComputer subclass builds it),
so (c) ends in seconds; gradekit's default policy retries 6 times over up to ~15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

COMPUTER = '''
from gradekit.graders import GraderRewardComputer, load_grader
from gradekit.judge import Judge, RetryPolicy


class BenchReward(GraderRewardComputer):
    """The semantic-equivalence rubric, judged by the fake provider, with a short retry policy."""

    def __init__(self):
        judge = lambda: Judge("fake-judge", base_url={url!r}, api_key="k", timeout=30, cache=None,
                              retry=RetryPolicy(max_attempts=3, initial_wait=0.05, max_wait=0.5))
        super().__init__(load_grader({{"type": "llm", "rubric": "semantic_equivalence_en"}}, judge=judge))
'''

CONFIG = """\
server:
  graceful_timeout: 10
reward:
  class: "bench_reward.py:BenchReward"
logging:
  enable: false
thread_pool:
  max_workers: {workers}
  queue_size: {queue}
"""

ROUTES = ("/compute_reward", "/api/v1", "/", "/get_reward")


def payload(route: str, i: int) -> bytes:
    question, answer = f"Question {i}: what is the capital of France?", f"Answer {i}: Paris"
    if route == "/compute_reward":
        body: dict[str, Any] = {"prompt": question, "response": answer, "extra_params": {"answer": "Paris"}}
    elif route == "/api/v1":
        body = {"func_type": "reward", "ground_truth": {"answer": "Paris"},
                "agent_output": {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}}
    elif route == "/":
        body = {"example": {"contents": [{"role": "user", "parts": [{"text": question}]}], "references": {"answer": "Paris"}},
                "response": {"role": "model", "parts": [{"text": answer}]}, "metadata": {"step": 1, "tuning_job_id": 1}}
    else:
        body = {"query": [question + answer], "prompts": [question], "labels": ['{"answer": "Paris"}']}
    return json.dumps(body).encode()


def classify(route: str, status: int, body: bytes) -> tuple[str, float | None]:
    """("score", value) | ("failure", None) per the route's contract | ("busy", None) | ("other", None)."""
    if status == 503:
        return "busy", None
    try:
        data = json.loads(body)
    except ValueError:
        return "other", None
    if route == "/compute_reward" and status == 200:
        return ("score", data["score"]) if data["status"] == "success" else ("failure", None)
    if route == "/api/v1" and status == 200:
        return ("score", data["reward"]["reward_score"]) if data["status"] == "success" else ("failure", None)
    if route == "/" and status in (200, 502):
        return ("score", data["reward"]) if status == 200 else ("failure", None)
    if route == "/get_reward" and status in (200, 502):
        return ("score", data["rewards"][0]) if status == 200 else ("failure", None)
    return "other", None


@dataclass
class Result:
    route: str
    kind: str
    score: float | None
    sent: float
    latency: float


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, route: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    writer.write(f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def load(url: str, n: int, concurrency: int, on_progress: Any = None, jitter: bool = False) -> Run:
    """n requests from `concurrency` keep-alive connections; a minimal HTTP/1.1 client so the
    client's own CPU stays small next to the server's.

    After a 503 a client waits Retry-After before its next request (the refused one is not
    resent). ``jitter``: clients start spread over one second and wait a random 0..2 x Retry-After
    ("full jitter"), instead of all starting at once and waking up together every second.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    todo = iter(range(n))
    run = Run()

    async def worker(k: int) -> None:
        reader = writer = None
        if jitter:
            await asyncio.sleep(k / concurrency)
        for i in todo:
            route = ROUTES[i % len(ROUTES)]
            body = payload(route, i)
            sent = time.perf_counter()
            for attempt in range(2):  # one reconnect, if the server closed an idle keep-alive connection
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection(host, port)
                    status, headers, data = await _roundtrip(reader, writer, host, route, body)  # type: ignore[arg-type]
                    break
                except (ConnectionError, asyncio.IncompleteReadError):
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                    if attempt:
                        status, headers, data = 0, {}, b""
            latency = time.perf_counter() - sent
            if headers.get("connection") == "close" and writer is not None:
                writer.close()
                reader = writer = None
            kind, score = classify(route, status, data)
            run.results.append(Result(route, kind, score, sent, latency))
            if on_progress is not None:
                on_progress(len(run.results))
            if kind == "busy":  # a well-behaved client (OpenRLHF sleeps 1 s) waits before its next request
                wait = float(headers.get("retry-after", "1"))
                await asyncio.sleep(random.uniform(0, 2 * wait) if jitter else wait)
        if writer is not None:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    run.wall = time.perf_counter() - started
    return run


@contextmanager
def process(args: list[str], cwd: Path | None = None, log: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """A child that prints its URL as the first stdout line; stopped with SIGTERM at the end."""
    err = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        if log:
            err.close()


def server(tmp: Path, fake_url: str, workers: int, queue: int) -> Any:
    (tmp / "bench_reward.py").write_text(COMPUTER.format(url=fake_url), encoding="utf-8")
    (tmp / "config.yaml").write_text(CONFIG.format(workers=workers, queue=queue), encoding="utf-8")
    return process(["-m", "gradekit", "serve", "--config", "config.yaml", "--port", "0"], cwd=tmp, log=tmp / "server.log")


def ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.1f}"


def row(label: str, results: list[Result], wall: float | None = None) -> str:
    kinds = Counter(r.kind for r in results)
    scored = [r.latency for r in results if r.kind == "score"]
    busy = [r.latency for r in results if r.kind == "busy"]
    rate = f"{kinds['score'] / wall:7.1f}" if wall else "      -"
    return (f"{label:<26}{len(results):>6}{kinds['score']:>8}{kinds['busy']:>7}{kinds['failure']:>9}{kinds['other']:>7}"
            f"{ms(scored, .5):>9}{ms(scored, .99):>9}{ms(busy, .5):>9}{ms(busy, .99):>9}{rate:>9}")


HEADER = (f"{'scenario':<26}{'sent':>6}{'scored':>8}{'503':>7}{'failure':>9}{'other':>7}"
          f"{'p50 ms':>9}{'p99 ms':>9}{'503 p50':>9}{'503 p99':>9}{'score/s':>9}")


async def judge_alone(fake_url: str, n: int, concurrency: int) -> float:
    """Judgements/s of the same judge calls made in-process, no HTTP server in between: the ceiling
    this machine allows the server (the judge client's own CPU is most of a request's cost)."""
    from gradekit.judge import Judge, Limiter, RetryPolicy, load_rubric

    rubric = load_rubric("semantic_equivalence_en")
    judge = Judge("fake-judge", base_url=fake_url, api_key="k", cache=None, limiter=Limiter(concurrency=concurrency),
                  retry=RetryPolicy(max_attempts=3, initial_wait=0.05, max_wait=0.5))
    rows = [{"question": f"Question {i}: what is the capital of France?", "references": ["Paris"], "prediction": f"Answer {i}: Paris"}
            for i in range(n)]
    async with judge:
        await asyncio.gather(*(judge.judge(rubric, row) for row in rows[:50]))
        started = time.perf_counter()
        verdicts = await asyncio.gather(*(judge.judge(rubric, row) for row in rows))
        wall = time.perf_counter() - started
    assert all(v.ok for v in verdicts)
    return n / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="requests per scenario")
    parser.add_argument("--concurrency", type=int, default=200)
    args = parser.parse_args()
    n, c = args.n, args.concurrency
    print(f"{n} requests per scenario, {c} concurrent clients (each waits Retry-After after a 503), fake judge latency 200 ms,")
    print(f"routes rotated over {', '.join(ROUTES)}; server logging off; {os.cpu_count()} CPUs shared by client, server and fake\n")
    problems: list[str] = []

    with tempfile.TemporaryDirectory() as folder, process(["-m", "gradekit.judge.testing", "--port", "0", "--latency", "0.2"]) as fake:
        tmp = Path(folder)
        fake_url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        ceiling = asyncio.run(judge_alone(fake_url, n // 2, 64))
        print(f"judge alone, in-process, 64 concurrent, no server: {ceiling:.1f} judgements/s (this machine's ceiling)\n")
        gc.collect()
        gc.freeze()  # the client's own full collections would add their pauses to the latencies it measures
        print(HEADER)

        # (a) the default pool (64 workers + 256 queued) holds all 200 clients: nothing is refused
        with server(tmp, fake_url, workers=64, queue=256) as srv:
            url = srv.stdout.readline().strip()  # type: ignore[union-attr]
            asyncio.run(load(url, 100, c))  # warm up connections and imports
            run = asyncio.run(load(url, n, c))
        print(row("(a) 64 workers + 256 queue", run.results, run.wall))
        a = Counter(r.kind for r in run.results)
        if a["score"] != n:
            problems.append(f"(a) expected {n} scored, got {dict(a)}")
        rate_a = a["score"] / run.wall

        # (b) a small pool: the excess is refused at once; first a thundering herd (every client
        # starts at once and retries exactly a second later), then clients with jittered backoff
        for label, jitter in (("(b) 16+16, herd", False), ("(b) 16+16, jittered", True)):
            with server(tmp, fake_url, workers=16, queue=16) as srv:
                url = srv.stdout.readline().strip()  # type: ignore[union-attr]
                run = asyncio.run(load(url, n, c, jitter=jitter))
            print(row(label, run.results, run.wall))
            b = Counter(r.kind for r in run.results)
            if b["failure"] or b["other"] or not b["busy"]:
                problems.append(f"{label}: expected only scores and 503s, got {dict(b)}")
            busy = sorted(r.latency for r in run.results if r.kind == "busy")
            if jitter and busy and busy[int(0.99 * len(busy))] >= 0.05:
                problems.append(f"{label}: 503 p99 {busy[int(0.99 * len(busy))] * 1000:.1f} ms, target < 50 ms")

    # (c) a fresh fake, stopped a quarter of the way through the run
    with tempfile.TemporaryDirectory() as folder, process(["-m", "gradekit.judge.testing", "--port", "0", "--latency", "0.2"]) as fake:
        tmp = Path(folder)
        fake_url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        stopped: list[float] = []

        def stop() -> None:
            fake.terminate()
            fake.wait(timeout=30)
            stopped[0] = time.perf_counter()  # the fake process is gone: nothing can answer from here on

        def stop_fake_at_quarter(done: int) -> None:
            if done >= n // 4 and not stopped:
                stopped.append(float("inf"))
                threading.Thread(target=stop).start()  # off the client's loop: the wait blocks

        with server(tmp, fake_url, workers=64, queue=256) as srv:
            url = srv.stdout.readline().strip()  # type: ignore[union-attr]
            run = asyncio.run(load(url, n, c, on_progress=stop_fake_at_quarter))
        at = stopped[0]
        assert at != float("inf"), "the fake provider did not stop during the run"
        before = [r for r in run.results if r.sent < at]
        after = [r for r in run.results if r.sent >= at]
        print(row("(c) judge stopped: all", run.results, run.wall))
        print(row("    sent before the stop", before))
        print(row("    sent after the stop", after))
        per_route = {route: Counter(r.kind for r in after if r.route == route) for route in ROUTES}
        print("    after the stop, per contract: " + "; ".join(f"{route} {dict(counts)}" for route, counts in per_route.items()))
        wrong_scores = [r for r in run.results if r.kind == "score" and r.score != 1.0]
        after_kinds = Counter(r.kind for r in after)
        if after_kinds["score"] or after_kinds["other"] or wrong_scores or not after:
            problems.append(f"(c) after the stop expected only failures, got {dict(after_kinds)}; made-up scores: {len(wrong_scores)}")

    print()
    print(f"server (a) / judge alone = {rate_a / ceiling:.2f}")
    print("columns: scored = a reward returned; 503 = busy, refused at once with Retry-After; failure = the contract's")
    print("failure (seed status fail, DashScope failed, Vertex/OpenRLHF 502); other = anything else (must be 0);")
    print("latencies are client-side, request sent -> response read; p50/p99 are of scored requests, 503 p50/p99 of refusals.")
    if problems:
        print("\nPROBLEMS:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("checks passed: (a) every request scored; (b) only scores and 503s, jittered 503 p99 < 50 ms; (c) no score once the judge was gone")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
