"""CLI start-up: `gradekit --help` and `gradekit rubrics` against `python -c "import typer, rich"`.

Median wall time and median CPU time of N runs each, as ratios to the baseline measured in the
same run, so a noisy shared machine moves both (CPU time moves least). `--source DIR` times another checkout (e.g. an older commit) the same way.

    python benchmarks/cli_startup.py [--runs 10] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def median_seconds(argv: list[str], runs: int, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of the child; CPU time moves less on a busy machine."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to time")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.source.resolve())}
    python = sys.executable
    source = args.source.resolve()  # the working folder too: `python -m` puts it first on sys.path
    wall0, cpu0 = median_seconds([python, "-c", "import typer, rich"], args.runs, env, source)
    print(f"{'command':<36} {'wall':>8} {'ratio':>6}   {'cpu':>8} {'ratio':>6}")
    baseline = 'python -c "import typer, rich"'
    print(f"{baseline:<36} {wall0 * 1000:6.0f}ms {1:6.2f}   {cpu0 * 1000:6.0f}ms {1:6.2f}")
    for label, argv in (("gradekit --help", ["--help"]), ("gradekit rubrics", ["rubrics"])):
        wall, cpu = median_seconds([python, "-m", "graders", *argv], args.runs, env, source)
        print(f"{label:<36} {wall * 1000:6.0f}ms {wall / wall0:6.2f}   {cpu * 1000:6.0f}ms {cpu / cpu0:6.2f}")


if __name__ == "__main__":
    main()
