"""CLI start-up: `gradekit --help` and `gradekit rubrics` against `python -c "import typer, rich"`.

Median wall time of N runs each, as a ratio to the baseline measured in the same run, so a noisy
shared machine moves both. `--source DIR` times another checkout (e.g. an older commit) the same way.

    python benchmarks/cli_startup.py [--runs 10] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def median_seconds(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to time")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.source.resolve())}
    python = sys.executable
    baseline = median_seconds([python, "-c", "import typer, rich"], args.runs, env)
    print(f"baseline  python -c 'import typer, rich'   {baseline * 1000:7.0f} ms   1.00x")
    for label, argv in (("gradekit --help", ["--help"]), ("gradekit rubrics", ["rubrics"])):
        seconds = median_seconds([python, "-m", "graders", *argv], args.runs, env)
        print(f"{label:<17}                        {seconds * 1000:7.0f} ms   {seconds / baseline:5.2f}x")


if __name__ == "__main__":
    main()
