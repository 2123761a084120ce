"""Offline grading at scale: rows/s and peak RSS for a million rows, as ratios against a bare loop.

    python benchmarks/scale.py                 # 1,000,000 rows (a few minutes, ~1 GB of temp files)
    python benchmarks/scale.py --rows 100000   # quicker

Each contender runs in a child process of its own, so its peak RSS is its own
(VmHWM); all of them read and write the same files in one temp dir.

(1) A deterministic grader (string match with REGEX_EXTRACT) through ``grade_file_with``,
    JSONL -> JSONL and Parquet -> Parquet, against a bare loop that does the same work by hand
    (json.loads, re.findall, compare, json.dumps): rows/s, gradekit / bare, and peak RSS.
(2) The LLM grader (``type: llm`` over the semantic_equivalence_en rubric) with a warm cache:
    a real run over ``--distinct`` rows against the fake provider fills the cache, then the
    million rows (those rows repeated) are graded again: every row a cache hit, zero requests.
    The same rows through ``grade_file`` (``gradekit grade -r``), the rubric without a grader
    around it. Target >= 20,000 rows/s, peak RSS < 300 MB.
(3) The judge core at 20 req/s: the fake enforcing 20 req/s, ``gradekit grade --rps 20``:
    the achieved rate as a share of the limit, and rows lost to 429s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

MATCH = {"type": "string_match", "expression": "{{references.answer}}", "operation": "EXACT_MATCH",
         "parse": {"type": "REGEX_EXTRACT", "regex": "<answer>(.*?)</answer>"}}
LLM = {"type": "llm", "rubric": "semantic_equivalence_en",
       "map": {"question": "prompt", "references": "references.answer", "prediction": "response"}}
RUBRIC_MAP = {"question": "prompt", "references": "answer", "prediction": "response"}  # the same variables, read as columns


def _row(i: int, distinct: int) -> dict:
    k = i % distinct
    return {"id": i, "prompt": f"What is {k} + {k}?", "response": f"It is <answer>{2 * k if k % 4 else k}</answer>",
            "answer": str(2 * k)}


def write_inputs(folder: Path, rows: int, distinct: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with (folder / "rows.jsonl").open("w", encoding="utf-8") as f, pq.ParquetWriter(
        folder / "rows.parquet", pa.schema([("id", pa.int64()), ("prompt", pa.string()), ("response", pa.string()),
                                            ("answer", pa.string())])) as parquet:
        for start in range(0, rows, 50_000):
            chunk = [_row(i, distinct) for i in range(start, min(rows, start + 50_000))]
            f.write("".join(json.dumps(r) + "\n" for r in chunk))
            parquet.write_table(pa.Table.from_pylist(chunk, schema=parquet.schema))
    with (folder / "distinct.jsonl").open("w", encoding="utf-8") as f:
        f.write("".join(json.dumps(_row(i, distinct)) + "\n" for i in range(distinct)))


# ---- children: each prints one JSON line ---------------------------------------------------------


def child_bare(source: Path, destination: Path) -> dict:
    """What a user writes by hand for the same reward: no checkpoint, no error rows, no types."""
    pattern = re.compile(r"<answer>(.*?)</answer>")
    n = 0
    with source.open(encoding="utf-8") as f, destination.open("w", encoding="utf-8") as out:
        for line in f:
            row = json.loads(line)
            found = pattern.findall(row["response"])
            score = 1.0 if found and found[-1] == row["answer"] else -1.0
            out.write(json.dumps({**row, "score": score, "status": "ok"}) + "\n")
            n += 1
    return {"rows": n}


def child_gradekit(config: dict, source: Path, destination: Path, cache: str | None) -> dict:
    from gradekit.graders import load_grader
    from gradekit.graders.runs._file import grade_file_with
    from gradekit.judge import Judge, JudgeCache, Limiter

    store = JudgeCache(cache) if cache else None
    judge = (lambda: Judge("fake-judge", base_url=os.environ["FAKE_URL"], api_key="k", cache=store,
                           limiter=Limiter(concurrency=64))) if cache else None
    grader = load_grader(config, judge=judge)

    async def run():
        try:
            return await grade_file_with(grader, source, destination, concurrency=66, resume=False)
        finally:
            await grader.aclose()

    summary = asyncio.run(run())
    return {"rows": summary.results.rows, "ok": summary.results.ok, "errors": summary.results.errors}


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent
    across fork and exec, so a small child of a big parent would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_rubric(source: Path, destination: Path, cache: str) -> dict:
    """`gradekit grade -r` over the same rows: the judge core without a grader around it."""
    from gradekit.graders import grade_file
    from gradekit.judge import Judge, JudgeCache, Limiter, load_rubric

    rubric = load_rubric("semantic_equivalence_en")
    judge = Judge("fake-judge", base_url=os.environ["FAKE_URL"], api_key="k", cache=JudgeCache(cache), limiter=Limiter(concurrency=64))

    async def run():
        async with judge:
            return await grade_file(judge, rubric, source, destination, RUBRIC_MAP, resume=False)

    summary = asyncio.run(run())
    return {"rows": summary.results.rows, "ok": summary.results.ok, "errors": summary.results.errors, "requests": summary.stats.usage.requests}


def run_child(*args: str, env: dict | None = None) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"child {args[0]} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


@contextmanager
def fake_provider(*args: str):
    proc = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--port", "0", *args], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def rate_at_20(folder: Path, n: int) -> tuple[float, int]:
    source = folder / "rate.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["a"], "prediction": f"p{i}"}) + "\n" for i in range(n)))
    with fake_provider("--latency", "0.2", "--rps", "20") as url:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                               "-o", str(folder / "rate.out.jsonl"), "--base-url", url, "--api-key", "k", "--rps", "20",
                               "--no-cache", "--concurrency", "64", "--json"], capture_output=True, text=True)
        summary = json.loads(done.stdout)
        wall = summary["wall_s"] or (time.perf_counter() - started)
    rate_limited = summary["errors_by_kind"].get("rate_limited", 0)
    return summary["rows"] / wall, rate_limited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--distinct", type=int, default=5_000, help="distinct rows the LLM cache is warmed with")
    parser.add_argument("--rate-rows", type=int, default=300, help="judgements for the 20 req/s run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gradekit-scale-") as tmp:
        folder = Path(tmp)
        write_inputs(folder, args.rows, args.distinct)
        mb = (folder / "rows.jsonl").stat().st_size / 2**20
        print(f"{args.rows:,} rows ({mb:.0f} MB of JSONL); rows/s from each child's wall time, start-up included\n")
        results = {
            "bare loop, JSONL": run_child("bare", str(folder / "rows.jsonl"), str(folder / "bare.jsonl")),
            "gradekit string_match, JSONL": run_child("gradekit", json.dumps(MATCH), str(folder / "rows.jsonl"),
                                                      str(folder / "out.jsonl"), ""),
            "gradekit string_match, Parquet": run_child("gradekit", json.dumps(MATCH), str(folder / "rows.parquet"),
                                                        str(folder / "out.parquet"), ""),
        }
        with fake_provider() as url:
            env = {**os.environ, "FAKE_URL": url}
            warm = run_child("gradekit", json.dumps(LLM), str(folder / "distinct.jsonl"), str(folder / "warm.jsonl"),
                             str(folder / "cache.sqlite3"), env=env)
            results["gradekit llm grader, warm cache, JSONL"] = run_child(
                "gradekit", json.dumps(LLM), str(folder / "rows.jsonl"), str(folder / "llm.jsonl"), str(folder / "cache.sqlite3"), env=env)
            results["gradekit grade -r (rubric), warm cache, JSONL"] = run_child(
                "rubric", str(folder / "rows.jsonl"), str(folder / "rubric.jsonl"), str(folder / "cache.sqlite3"), env=env)
        bare = results["bare loop, JSONL"]
        print(f"{'contender':42} {'rows/s':>10} {'vs bare':>8} {'peak RSS':>10}  ok/errors")
        for name, r in results.items():
            rate = r["rows"] / r["wall_s"]
            print(f"{name:42} {rate:10,.0f} {rate / (bare['rows'] / bare['wall_s']):8.2f} {r['maxrss_mb']:8.0f} MB"
                  f"  {r.get('ok', r['rows'])}/{r.get('errors', 0)}")
        print(f"\n(cache warmed by a real run over {args.distinct:,} distinct rows: {warm['rows'] / warm['wall_s']:.0f} rows/s "
              "through the fake provider)")
        rate, limited = rate_at_20(folder, args.rate_rows)
        print(f"judge core at the server's 20 req/s: {rate:.2f} judgements/s = {rate / 20:.3f} of the limit, "
              f"{limited} rows rate limited")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "bare":
            out = child_bare(Path(rest[0]), Path(rest[1]))
        elif kind == "rubric":
            out = child_rubric(Path(rest[0]), Path(rest[1]), rest[2])
        else:
            out = child_gradekit(json.loads(rest[0]), Path(rest[1]), Path(rest[2]), rest[3] or None)
        out["maxrss_mb"] = peak_rss_mb()
        print(json.dumps(out))
    else:
        main()
