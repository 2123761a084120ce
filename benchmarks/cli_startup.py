"""CLI start-up: `gradekit --help` and `gradekit rubrics` against `python -c "import typer, rich"`.

Median wall time and median CPU time of N runs each, as ratios to the baseline measured in the
same run. The three commands take turns (baseline, --help, rubrics, baseline, ...), so a burst of
load from the rest of a shared machine lands on all of them alike; CPU time moves least.

Bytecode is cached, as for an installed gradekit (pip compiles it at install time): the children
write and read it under a temporary PYTHONPYCACHEPREFIX after one warm-up run, so a source
checkout run with PYTHONDONTWRITEBYTECODE=1 is not charged for compiling gradekit on every start
while typer and rich load from their installed bytecode. `--cold` compiles on every start instead.
`--source DIR` times another checkout (e.g. an older commit) the same way.

    python benchmarks/cli_startup.py [--runs 10] [--cold] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (('python -c "import typer, rich"', ["-c", "import typer, rich"]),
            ("gradekit --help", ["-m", "gradekit", "--help"]),
            ("gradekit rubrics", ["-m", "gradekit", "rubrics"]))


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cold", action="store_true", help="no cached bytecode: compile every module on every start")
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to time")
    args = parser.parse_args()
    source = args.source.resolve()  # the working folder too: `python -m` puts it first on sys.path
    with tempfile.TemporaryDirectory(prefix="gradekit-bench-pyc-") as cache:
        env = {**os.environ, "PYTHONPATH": str(source)}
        if args.cold:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
        for _, argv in COMMANDS:  # warm-up: writes the bytecode and fills the OS file cache
            timed([sys.executable, *argv], env, source)
        walls: dict[str, list[float]] = {label: [] for label, _ in COMMANDS}
        cpus: dict[str, list[float]] = {label: [] for label, _ in COMMANDS}
        for _ in range(args.runs):
            for label, argv in COMMANDS:
                wall, cpu = timed([sys.executable, *argv], env, source)
                walls[label].append(wall)
                cpus[label].append(cpu)
    wall0, cpu0 = (statistics.median(walls[COMMANDS[0][0]]), statistics.median(cpus[COMMANDS[0][0]]))
    print(f"{source} ({'cold: no bytecode cache' if args.cold else 'bytecode cached'}; median of {args.runs}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"{'command':<36} {'wall':>8} {'ratio':>6}   {'cpu':>8} {'ratio':>6}")
    for label, _ in COMMANDS:
        wall, cpu = statistics.median(walls[label]), statistics.median(cpus[label])
        print(f"{label:<36} {wall * 1000:6.0f}ms {wall / wall0:6.2f}   {cpu * 1000:6.0f}ms {cpu / cpu0:6.2f}")


if __name__ == "__main__":
    main()
