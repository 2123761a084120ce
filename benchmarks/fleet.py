"""A fleet: one judge on three endpoints with different limits, then one of them killed mid-run.

Three fake providers (this process) enforce 10, 20 and 30 req/s with OpenAI's rate-limit
headers and 200 ms latency; `gradekit grade` (a real subprocess) takes all three as repeated
--base-url, 900 rows, concurrency 64, no --rps. Beside it, the single-endpoint figure: one fake
enforcing the summed 60 req/s.

    python benchmarks/fleet.py               # 900 rows per scenario
    python benchmarks/fleet.py --rows 300 --only fleet,killed

Per scenario: answered requests per second as a share of the limit (the summed 60 req/s), the
share of requests answered 429, the exit status, rows ok and whether every row is in the output
exactly once, and the per-endpoint request counts of the `--json` summary. With the 30 req/s
endpoint killed 4 s in, the limit is time-weighted: 60 req/s for 4 s, 30 req/s after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scenarios import scenario_options  # noqa: E402

from gradekit.judge.testing import FakeProvider  # noqa: E402


def grade(directory: Path, tag: str, rows: int, urls: list[str]) -> subprocess.Popen:
    source = directory / f"{tag}.jsonl"
    source.write_text("".join(json.dumps({"question": f"{tag}-{i}", "references": ["x"], "prediction": "y"}) + "\n"
                              for i in range(rows)), encoding="utf-8")
    flags = [x for url in urls for x in ("--base-url", url)]
    return subprocess.Popen([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                             "-o", str(directory / f"{tag}-out.jsonl"), *flags, "--api-key", "k", "--model", "fake-judge",
                             "--no-cache", "--json", "--concurrency", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(name: str, directory: Path, rows: int, limits: list[float], kill: tuple[int, float] | None = None) -> dict:
    fakes = [FakeProvider(latency=0.2, rate_limit_rps=limit).start() for limit in limits]
    try:
        started = time.monotonic()
        proc = grade(directory, name, rows, [f.base_url for f in fakes])
        killed_at = None
        if kill is not None:
            index, after = kill
            time.sleep(max(0.0, started + after - time.monotonic()))
            threading.Thread(target=fakes[index].stop).start()
            killed_at = time.monotonic()
        out, err = proc.communicate(timeout=900)
        wall = time.monotonic() - started
        requests = [r for f in fakes for r in f.chat_requests()]  # a stopped fake keeps its records
    finally:
        for fake in fakes:
            fake.stop()
    lines = (directory / f"{name}-out.jsonl").read_text(encoding="utf-8").splitlines()
    written = [json.loads(line) for line in lines]
    ids = [w.get("question") for w in written]
    try:
        summary = json.loads(out)
    except ValueError:
        summary = {"error": err.strip()[-400:]}
    return {"requests": requests, "wall": wall, "exit": proc.returncode, "written": written, "ids": ids, "rows": rows,
            "summary": summary, "killed_at": None if killed_at is None else killed_at - started, "limits": limits}


def report(label: str, result: dict, kill_after: float | None = None) -> None:
    requests = result["requests"]
    ok = sorted(r.time for r in requests if r.status == 200)
    refused = sum(r.status == 429 for r in requests)
    span = ok[-1] - ok[0] if len(ok) > 1 else 0.0
    rate = (len(ok) - 1) / span if span > 0 else 0.0
    total = sum(result["limits"])
    if kill_after is not None and span > 0:  # time-weighted limit: all endpoints until the kill, the rest after
        before = min(span, kill_after)
        limit = (total * before + (total - max(result["limits"])) * max(0.0, span - before)) / span
    else:
        limit = total
    rows_ok = sum(w.get("status") == "ok" for w in result["written"])
    once = len(result["ids"]) == result["rows"] and len(set(result["ids"])) == result["rows"]
    endpoints = result["summary"].get("endpoints") or []
    counts = ", ".join(f"{e['base_url'].split(':')[-1].split('/')[0]}: {e['requests']} req {e['state']}" for e in endpoints)
    print(f"{label:<44} {rate / limit:6.3f} of {limit:5.1f}/s   429s {refused:4d} / {len(requests):4d} = "
          f"{refused / max(1, len(requests)):5.1%}   exit {result['exit']}   rows ok {rows_ok}/{result['rows']}   "
          f"exactly once {once}   wall {result['wall']:.1f} s", flush=True)
    print(f"{'':<44} endpoints: {counts}" + (f"   ({result['summary'].get('error')})" if "error" in result["summary"] else ""),
          flush=True)


def main() -> None:
    args, want = scenario_options(__doc__, rows=900, names="single, fleet, killed")
    print(f"{args.rows} rows, 200 ms latency, concurrency 64, no --rps, rate-limit headers\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if want("single"):
            report("single endpoint, limit 60", run("single", directory, args.rows, [60.0]))
        if want("fleet"):
            report("fleet 10 + 20 + 30 req/s", run("fleet", directory, args.rows, [10.0, 20.0, 30.0]))
        if want("killed"):
            report("fleet 10 + 20 + 30, the 30 killed 4 s in", run("killed", directory, args.rows, [10.0, 20.0, 30.0], kill=(2, 4.0)),
                   kill_after=4.0)


if __name__ == "__main__":
    main()
