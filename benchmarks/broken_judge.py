"""A 500-row run against a broken judge: requests sent and wall time, breaker on vs --keep-going.

Three broken judges: a port where nothing listens, a port that accepts and drops every
connection (so requests can be counted), and the fake provider answering 500 to everything.
The baseline is the same run with the breaker off (``keep_going=True``), measured in the same
process, with the retry waits recorded rather than slept so the baseline finishes in seconds;
the figures are requests (breaker / baseline). A last row times the real command line, with its
real retry waits, against the closed port: it must stop well inside 30 s.

    python benchmarks/broken_judge.py [--rows 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradekit.graders.runs import grade_file  # noqa: E402
from gradekit.judge import BreakerTripped, Judge, Limiter, RetryPolicy, load_rubric  # noqa: E402
from gradekit.judge.testing import DownJudge, FakeProvider, Reply  # noqa: E402

RUBRIC = "semantic_equivalence_en"


async def _no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


async def run(base_url: str, source: Path, out: Path, keep_going: bool) -> tuple[str, int, float]:
    rubric = load_rubric(RUBRIC)
    judge = Judge("fake-judge", base_url=base_url, api_key="k", timeout=10, limiter=Limiter(concurrency=16, sleep=_no_wait),
                  retry=RetryPolicy(), sleep=_no_wait)
    started = time.perf_counter()
    attempts = 0
    try:
        async with judge:
            summary = await grade_file(judge, rubric, source, out, {v: v for v in rubric.variables}, resume=False,
                                       keep_going=keep_going)
        outcome, attempts = f"{summary.results.errors} error rows", summary.stats.usage.requests
    except BreakerTripped as e:
        outcome = f"stopped, {e.summary.results.rows} rows written"
    return outcome, attempts, time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="broken-judge-"))
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}", "references": [f"a{i}"], "prediction": f"a{i}"}) + "\n"
                              for i in range(args.rows)), encoding="utf-8")
    print(f"{args.rows} rows, concurrency 16, 6 attempts per request; requests: breaker on / --keep-going")
    with DownJudge() as dropper, FakeProvider(responder=lambda body: Reply(status=500)) as fake:
        for name, url, count in (("connection dropped", dropper.base_url, lambda: dropper.accepted),
                                 ("HTTP 500", fake.base_url, lambda: len(fake.chat_requests()))):
            sent = []
            for keep_going in (True, False):
                before = count()
                outcome, _, wall = asyncio.run(run(url, source, folder / "out.jsonl", keep_going))
                sent.append((count() - before, outcome, wall))
            (base, base_outcome, base_wall), (mine, outcome, wall) = sent
            print(f"{name:<20} keep-going {base:5d} requests ({base_outcome}, {base_wall:5.1f} s) | breaker {mine:4d} "
                  f"requests ({outcome}, {wall:4.1f} s)   {mine / base:.3f}x requests")
    url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", RUBRIC, "-o", str(folder / "cli.jsonl"),
                           "--base-url", url, "--api-key", "k", "--no-cache"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"nothing listening, `gradekit grade` with real retry waits: exit {done.returncode} after "
          f"{time.perf_counter() - started:.1f} s (limit 30 s)")


if __name__ == "__main__":
    main()
