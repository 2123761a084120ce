"""Two `gradekit grade` processes against one provider limit: shared through Redis vs each on its own.

The fake provider enforces the limit server-side (token bucket, 429 + Retry-After) and runs in
this process only to count what arrives, on its own clock; the graders are real subprocesses.
A redis-server (Debian's package) is started on a free port and stopped afterwards.

    python benchmarks/shared_limiter.py              # 100 rows per process, limit 20 req/s
    python benchmarks/shared_limiter.py --rows 300

Per scenario: the combined rate the provider received as a share of its limit (first to last
request), the 429s it answered, the busiest second, and rows that ended in an error.
(a) two processes, --rps 20 each, --limiter redis://   (target: ratio <= 1, 0 429s, 0 errors)
(b) two processes, --rps 20 each, in-process limiters  (what (a) prevents)
(c) one process, --rps 20                                (the single-process baseline)
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradekit.judge.testing import FakeProvider, RecordedRequest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)],
                            stdout=subprocess.DEVNULL)
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.02)
    proc.terminate()
    sys.exit("redis-server did not start")


def grade(directory: Path, tag: str, rows: int, base_url: str, *options: str) -> subprocess.Popen:
    source = directory / f"{tag}.jsonl"
    source.write_text("".join(json.dumps({"question": f"{tag}-{i}", "references": ["x"], "prediction": "y"}) + "\n"
                              for i in range(rows)), encoding="utf-8")
    return subprocess.Popen([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                             "-o", str(directory / f"{tag}-out.jsonl"), "--base-url", base_url, "--api-key", "k",
                             "--model", "fake-judge", "--no-cache", "--json", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def busiest_second(requests: list[RecordedRequest]) -> int:
    times = sorted(r.time for r in requests)
    return max((sum(1 for u in times if t <= u < t + 1.0) for t in times), default=0)


def scenario(name: str, directory: Path, limit: float, rows: int, per_process: list[tuple[str, ...]]) -> None:
    with FakeProvider(rate_limit_rps=limit, latency=0.2) as fake:
        procs = [grade(directory, f"{name}{i}", rows, fake.base_url, "--rps", f"{limit:g}", *options)
                 for i, options in enumerate(per_process)]
        errors = sum(json.loads(p.communicate(timeout=600)[0])["errors"] for p in procs)
        requests = fake.chat_requests()
    # Whole seconds from the first answered request: a moving window admits up to the limit at the
    # start of each second, so first-to-last (n - 1) / span would overstate a bursty but correct pace.
    answered = sorted(r.time for r in requests if r.status == 200)
    seconds = max(1, int(answered[-1] - answered[0]))
    rate = sum(1 for t in answered if t < answered[0] + seconds) / seconds
    refused = sum(r.status == 429 for r in requests)
    print(f"    {rate:6.2f} judgements/s = {rate / limit:.3f} of the limit   429s {refused:3d}   "
          f"busiest second {busiest_second(requests):3d} requests   rows with errors {errors}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100, help="rows per process")
    parser.add_argument("--limit", type=float, default=20.0, help="the provider's requests per second, and --rps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        redis, url = start_redis(directory)
        try:
            print(f"{args.rows} rows per process, provider limit {args.limit:g} req/s, 200 ms latency\n")
            print(f"(a) two processes, --rps {args.limit:g} each, --limiter redis://")
            scenario("a", directory, args.limit, args.rows, [("--limiter", url), ("--limiter", url)])
            print(f"(b) two processes, --rps {args.limit:g} each, in-process limiters")
            scenario("b", directory, args.limit, args.rows, [(), ()])
            print(f"(c) one process, --rps {args.limit:g}")
            scenario("c", directory, args.limit, 2 * args.rows, [()])
        finally:
            redis.terminate()
            redis.wait(timeout=10)


if __name__ == "__main__":
    main()
