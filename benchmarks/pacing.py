"""Self-pacing: `gradekit grade` with no --rps against provider limits it was never told.

The fake provider enforces the limit server-side (token bucket, 429 + Retry-After, and OpenAI's
x-ratelimit-* headers unless the scenario turns them off) in this process, counting what
arrives on its own clock; the graders are real subprocesses, 200 ms judge latency.

    python benchmarks/pacing.py              # 400 rows per scenario, limit 20 req/s
    python benchmarks/pacing.py --only headers,drop

Per scenario: the rate of answered (200) requests as a share of the true limit, the share of
requests answered 429, and rows lost (ending in an error). Ratios, not absolute figures: the
machine's speed cancels out. Baselines in the same run: --rps 20 (told; today's fixed pacing)
and --no-adapt (today's default command line, living on Retry-After alone).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scenarios import scenario_options  # noqa: E402
from shared_limiter import grade, start_redis  # noqa: E402  (one way to start a grader and a redis-server)

from gradekit.judge.testing import FakeProvider  # noqa: E402


def answered_rate(times: list[float], since: float | None = None) -> float:
    """Answered requests per second from ``since`` (default the first) to the last."""
    times = sorted(t for t in times if since is None or t >= since)
    if len(times) < 2:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


def run(name: str, directory: Path, rows: int, processes: list[tuple[str, ...]], **fake_options) -> dict:
    with FakeProvider(latency=0.2, **fake_options) as fake:
        procs = [grade(directory, f"{name}{i}", rows, fake.base_url, *options) for i, options in enumerate(processes)]
        summaries = [json.loads(p.communicate(timeout=900)[0]) for p in procs]
        requests = fake.chat_requests()
        started = fake._started
    return {"summaries": summaries, "requests": requests, "started": started}


def report(label: str, result: dict, limit: float, *, since: float | None = None, settle_limit: float | None = None) -> None:
    requests, summaries = result["requests"], result["summaries"]
    ok = [r.time for r in requests if r.status == 200]
    refused = sum(r.status == 429 for r in requests)
    lost = sum(s["errors"] for s in summaries)
    rate = answered_rate(ok)
    pacing = "; ".join(f"{s.get('pacing', {}).get('mode')} {s.get('pacing', {}).get('rps')}" for s in summaries)
    line = (f"{label:<58} {rate / limit:6.3f} of {limit:g}/s   429s {refused:4d} / {len(requests):4d} "
            f"= {refused / max(1, len(requests)):6.1%}   rows lost {lost:3d}   pacing at end: {pacing}")
    if since is not None and settle_limit is not None:
        after = answered_rate(ok, result["started"] + since)
        line += f"\n{'':<58} after the change: {after / settle_limit:6.3f} of {settle_limit:g}/s"
    print(line, flush=True)


def main() -> None:
    args, want = scenario_options(__doc__, rows=400)
    rows = args.rows
    print(f"{rows} rows, 200 ms latency, concurrency 16, no --rps unless said\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if want("told"):
            report("baseline: --rps 20 told, limit 20 (fixed)", run("told", directory, rows, [("--rps", "20")], rate_limit_rps=20), 20)
        if want("headers"):
            report("headers, limit 20", run("headers", directory, rows, [()], rate_limit_rps=20), 20)
        if want("aimd"):
            report("no headers, Retry-After only, limit 20", run("aimd", directory, rows, [()], rate_limit_rps=20,
                                                                   rate_limit_headers=False), 20)
        if want("noadapt"):
            report("before: --no-adapt, no headers, limit 20", run("noadapt", directory, rows, [("--no-adapt",)],
                                                                     rate_limit_rps=20, rate_limit_headers=False), 20)
        if want("drop"):
            report("headers, limit 30 -> 10 req/s after 8 s", run("drop", directory, rows, [()], rate_limit_rps=30,
                                                                    rate_limit_schedule=[(8, 10)]), 30, since=10, settle_limit=10)
        if want("rise"):
            report("headers, limit 10 -> 30 req/s after 8 s", run("rise", directory, rows, [()], rate_limit_rps=10,
                                                                    rate_limit_schedule=[(8, 30)]), 30, since=10, settle_limit=30)
        if want("shared"):
            redis, url = start_redis(directory)
            try:
                report("baseline: two processes sharing Redis, --rps 20 told", run("sharedtold", directory, rows // 2,
                       [("--limiter", url, "--rps", "20"), ("--limiter", url, "--rps", "20")], rate_limit_rps=20), 20)
                report("two processes sharing Redis, headers, limit 20", run("shared", directory, rows // 2,
                       [("--limiter", url), ("--limiter", url)], rate_limit_rps=20), 20)
            finally:
                redis.terminate()
                redis.wait(timeout=10)
        if want("burst"):
            # issue #11: 40 req/s, burst 10, retry-after-ms of a few ms, concurrency 16: no row may be lost.
            for options, label in (((), "#11: 500 rows, limit 40 burst 10, headers"),
                                   (("--no-adapt",), "#11: 500 rows, limit 40 burst 10, --no-adapt")):
                report(label, run("burst", directory, 500, [options], rate_limit_rps=40, rate_limit_burst=10), 40)


if __name__ == "__main__":
    main()
