"""What the per-row checks cost the input reader, and what checking a checkpoint costs a resume.

read_rows decodes each JSONL line itself (a bad byte is that row's error), checks each CSV cell
for undecodable bytes and the 128 KiB limit, and reads Parquet row group by row group. The
baseline is the plain loop it replaced, in the same run (the machine is shared, so only ratios
mean anything):

    python benchmarks/read_rows.py             # 200,000 rows
    python benchmarks/read_rows.py --rows 50000

Printed: seconds per 100k rows, and read_rows / baseline. The resume check (rows and tail hash
of an output, see graders/runs/_checkpoint.py) is timed against one plain read of that output.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import orjson

from gradekit.graders.runs._io import read_rows, tail_hash, text_rows_before


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def _baseline_csv(path: Path) -> int:
    with path.open(encoding="utf-8", newline="") as handle:
        return sum(1 for _ in csv.DictReader(handle))


def _baseline_jsonl(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip() and orjson.loads(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    n = parser.parse_args().rows
    rows = [{"id": i, "question": f"问题 {i}: how long is the Yangtze?", "references": "about 6,300 km",
             "prediction": f"answer {i}: 6300 kilometres, give or take " + "x" * 80} for i in range(n)]
    with tempfile.TemporaryDirectory() as folder:
        csv_path, jsonl_path = Path(folder) / "in.csv", Path(folder) / "in.jsonl"
        with csv_path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        jsonl_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        per = 100_000 / n
        print(f"{n} rows; seconds per 100k rows (best of 3); ratio = gradekit / baseline")
        for name, path, baseline in (("csv", csv_path, _baseline_csv), ("jsonl", jsonl_path, _baseline_jsonl)):
            ours = _best(lambda: sum(1 for _ in read_rows(path)))
            base = _best(lambda: baseline(path))
            print(f"  read {name:5}  read_rows {ours * per:.3f} s   baseline {base * per:.3f} s   ratio {ours / base:.2f}")
            size = path.stat().st_size
            check = _best(lambda: (text_rows_before(path, size), tail_hash(path, size)))
            print(f"  resume check {name:5}  {check * per:.3f} s   / plain read {check / base:.2f}")


if __name__ == "__main__":
    main()
