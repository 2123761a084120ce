"""`gradekit view` on a million-row graded JSONL: first page, filtered page, text search, peak RSS.

    python benchmarks/viewer.py                  # 1,000,000 rows (~560 MB of JSONL in a temp dir)
    python benchmarks/viewer.py --rows 100000    # quicker
    python benchmarks/viewer.py --file out.jsonl # an output you already have
    python benchmarks/viewer.py --starts 5       # the first page over 5 fresh starts (medians)

The viewer runs as a real `gradekit view --port 0 --no-browser` subprocess and is asked over
HTTP, as the page asks it. Timings are wall clock from the client; its peak RSS is the
subprocess's VmHWM. The baseline, in the same run, is the plainest way to answer "which rows
are errors" without the viewer: one streaming pass over the file with gradekit's own row reader
(orjson per line). Ratios are viewer / baseline.

The start is the noisiest figure on a shared machine: `--starts N` starts the viewer N times and
reports the medians of "listening", "first page" and the viewer's CPU seconds at the first page
(CPU time is what other load on the machine inflates least). One unmeasured start comes first and
writes the bytecode (under a temporary PYTHONPYCACHEPREFIX), so the viewer starts as an installed
gradekit does, not compiling its modules on every start as a checkout with PYTHONDONTWRITEBYTECODE
would; `--cold` measures that instead.

Targets (issue #16): first page within 2 s of starting, a filtered page within 1 s, under 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

WORDS = ("the judge said answer correct wrong because model output reference capital city river number "
         "France Paris Lyon summit quokka first second final verdict reply").split()


def make_file(path: Path, rows: int, seed: int = 0) -> None:
    """A graded output with gradekit's result columns: ~3% judge errors, a raw reply on each of them."""
    rnd = random.Random(seed)
    scores = {"correct": 1.0, "incorrect": 0.0}
    with path.open("wb") as f:
        for i in range(rows):
            error = rnd.random() < 0.03
            label = None if error else rnd.choice(["correct", "incorrect"])
            f.write(orjson.dumps({
                "id": f"q{i:07d}", "question": " ".join(rnd.choices(WORDS, k=12)), "references": ["Paris"],
                "prediction": " ".join(rnd.choices(WORDS, k=30)), "input_label": rnd.choice(["correct", "incorrect"]),
                "score": None if error else scores[label], "label": label, "status": "error" if error else "ok",
                "error_kind": "parse_failure" if error else None, "error": "reply is not a JSON object" if error else None,
                "rationale": None if error else " ".join(rnd.choices(WORDS, k=15)),
                "prompt_tokens": rnd.randint(300, 900), "completion_tokens": rnd.randint(10, 60), "cached": False,
                "raw": "Hmm, hard to say." if error else None,
            }) + b"\n")


def baseline(path: Path) -> tuple[float, int]:
    """Seconds for one pass with gradekit's row reader, and the error rows it found."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gradekit.graders.runs._io import read_rows

    start = time.perf_counter()
    errors = sum(1 for row in read_rows(path) if isinstance(row, dict) and row.get("status") == "error")
    return time.perf_counter() - start, errors


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=600) as response:
        return json.loads(response.read())


def timed(url: str, repeat: int = 3) -> tuple[float, dict]:
    """Median wall seconds of ``repeat`` requests, and the last answer."""
    times, body = [], {}
    for _ in range(repeat):
        start = time.perf_counter()
        body = get(url)
        times.append(time.perf_counter() - start)
    return statistics.median(times), body


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far: a figure the other load on the machine does not inflate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--file", type=Path, help="View this graded JSONL instead of a generated one.")
    parser.add_argument("--starts", type=int, default=1, help="Start the viewer this many times for the first-page figures.")
    parser.add_argument("--cold", action="store_true", help="No bytecode cache: every start compiles gradekit's modules.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gradekit-bench-view-") as folder:
        path = args.file or Path(folder) / "graded.jsonl"
        if args.file is None:
            started = time.perf_counter()
            make_file(path, args.rows)
            print(f"generated {args.rows:,} rows ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s", flush=True)
        base_s, base_errors = baseline(path)
        print(f"baseline: one streaming pass with read_rows: {base_s:.2f} s ({base_errors:,} error rows)", flush=True)

        # The viewer's own start, in process: open the file and answer the first page (no CLI, no server).
        from gradekit.graders.view import ResultsFile

        started = time.perf_counter()
        opened = ResultsFile(path)
        opened.rows(limit=50)
        library_first = time.perf_counter() - started
        opened.close()
        print(f"library: ResultsFile(path) + first page in {library_first:.2f} s", flush=True)

        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        if args.cold:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(folder) / "pyc")
        starts: list[tuple[float, float, float]] = []
        for attempt in range(-1, max(1, args.starts)):  # -1: the warm-up start, not counted
            started = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "gradekit", "view", str(path), "--port", "0", "--no-browser"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
            url = proc.stdout.readline().strip()  # type: ignore[union-attr]
            listening = time.perf_counter() - started
            with urllib.request.urlopen(f"{url}/", timeout=600) as response:  # the page, as a browser asks first
                assert response.status == 200 and b"<html" in response.read().lower()
            first = get(f"{url}/api/rows?offset=0&limit=50")
            if attempt >= 0:
                starts.append((listening, time.perf_counter() - started, cpu_seconds(proc.pid)))
            if attempt < args.starts - 1:
                proc.terminate()
                proc.wait(timeout=120)
        listening, first_page, first_cpu = (statistics.median(column) for column in zip(*starts))
        if args.starts > 1:
            print(f"first page, each start ({'cold' if args.cold else 'bytecode cached'}): " + ", ".join(f"{f:.2f} s ({c:.2f} CPU s)" for _, f, c in starts), flush=True)
        try:
            get(f"{url}/api/summary")  # waits for the columnar copy: filters run on it
            indexed = time.perf_counter() - started
            indexed_cpu = cpu_seconds(proc.pid)
            filtered_s, filtered = timed(f"{url}/api/rows?status=error&limit=50")
            deep_s, _ = timed(f"{url}/api/rows?status=error&offset=20000&limit=50")
            search_s, searched = timed(f"{url}/api/rows?q=quokka%20summit&limit=50")
            sort_s, _ = timed(f"{url}/api/rows?sort=-prompt_tokens&limit=50")
            row_s, _ = timed(f"{url}/api/rows/{first['total'] - 1}")
            summary_s, _ = timed(f"{url}/api/summary", repeat=1)
            rss = peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        assert filtered["total"] == base_errors, (filtered["total"], base_errors)

        results = [
            ("in process: ResultsFile(path) + first page", library_first, None),
            ("server listening (Python start, CLI imports, column types)", listening, None),
            (f"first page (start -> GET / + 50 rows and total; {'from the file' if not first['ready'] else 'indexed'})", first_page, "< 2 s"),
            ("first page after listening", first_page - listening, None),
            ("indexed for filters (start -> summary)", indexed, None),
            ("filtered page status=error", filtered_s, "< 1 s"),
            ("filtered page status=error, offset 20,000", deep_s, None),
            (f"text search q='quokka summit' ({searched['total']:,} rows)", search_s, None),
            ("sorted page sort=-prompt_tokens", sort_s, None),
            ("one row /api/rows/{last}", row_s, None),
            ("summary (counts, histogram, agreement)", summary_s, None),
        ]
        print(f"\n{first['total']:,} rows, {filtered['total']:,} errors; baseline pass {base_s:.2f} s")
        print(f"{'measure':58} {'seconds':>8} {'/ baseline':>11}  target")
        for name, seconds, target in results:
            print(f"{name:58} {seconds:8.3f} {seconds / base_s:11.3f}  {target or ''}")
        print(f"{'viewer CPU seconds at the first page / when indexed':58} {first_cpu:8.2f} / {indexed_cpu:.2f}")
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'viewer peak RSS (VmHWM)':58} {rss:7.0f}M {'':11}  < 500 MB")


if __name__ == "__main__":
    main()
