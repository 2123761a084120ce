"""Symbolic checks per second: gradekit's MathVerifier on 2 workers against bare math_verify in one process.

Three runs on the same inputs (distinct (gold, response) pairs, so no cache is hit):

1. clean: realistic answers (boxed integers, fractions, decimals, polynomials, sets, some wrong)
   plus Math-Verify's own test cases (tests/data/math_verify/cases.jsonl). The bare library is
   ``verify(parse(gold), parse(response))`` in this process's main thread, where its signal
   timeouts work; gradekit is ``MathVerifier(workers=2).check_many``. Printed: checks/s of each,
   the ratio, and the ratio per core (gradekit's rate / its workers against the bare one, which
   uses one core).
2. 1% degenerate (a power tower, a 40-deep ``\\frac``, 3,000 nested parentheses, a ratio of
   huge factorials) mixed in: the bare library in the main thread returns False for each one
   after its own 5 s timeouts (a silent 0, counted); gradekit reports each as ``timeout``.
3. The bare library in a thread pool, as trainers run it: with its timeouts on it raises on
   every call (signal only works in the main thread); with them off (``parsing_timeout=None``,
   ``timeout_seconds=None``, the documented way) a degenerate input never returns. This run is
   a child process, killed after ``--bound`` seconds so that the benchmark ends; it reports how
   many checks finished.

    python benchmarks/math_verify.py [--pairs 2000] [--timeout 2] [--bound 30] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file is named after the library: its folder must not shadow the real math_verify.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
CASES = ROOT / "tests" / "data" / "math_verify" / "cases.jsonl"


def nested_frac(depth: int) -> str:
    text = "1"
    for _ in range(depth):
        text = r"\frac{1}{1+" + text + "}"
    return "$" + text + "$"


DEGENERATE = [("1", "$9^{9^{9^{9^{9}}}}$"), ("1", nested_frac(40)), ("1", "$" + "(" * 3000 + "1" + ")" * 3000 + "$"),
              ("1000000", r"$\frac{1000000!}{999999!}$")]


def clean_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = [(row["references"]["answer"], row["response"]) for row in map(json.loads, CASES.read_text(encoding="utf-8").splitlines())]
    k = 0
    while len(pairs) < n:
        k += 1
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        pick = k % 6
        if pick == 0:
            pairs.append((str(a * b), f"We multiply {a} by {b}. So the answer is \\boxed{{{a * b}}}."))
        elif pick == 1:
            pairs.append((f"\\frac{{{a}}}{{{b}}}", f"Simplifying, the probability is $\\frac{{{2 * a}}}{{{2 * b}}}$."))
        elif pick == 2:
            pairs.append((f"{a}.5", f"The final answer is {2 * a + 1}/2"))
        elif pick == 3:
            pairs.append((f"$x^2 - {a}x + {b}$", f"Expanding gives \\boxed{{x^{{2}} + {b} - {a} x}}"))
        elif pick == 4:
            pairs.append((f"$\\{{{a}, {b}\\}}$", f"The roots are $x = {b}$ and $x = {a}$, so \\boxed{{{b}, {a}}}"))
        else:
            pairs.append((str(a + b), f"First I got \\boxed{{{a + b + 1}}}. Wait, I dropped a carry: \\boxed{{{a + b - 1}}}"))
    return pairs[:n]


def with_degenerate(pairs: list[tuple[str, str]], share: float = 0.01) -> list[tuple[str, str]]:
    out = list(pairs)
    count = max(1, int(len(pairs) * share))
    for i in range(count):
        gold, response = DEGENERATE[i % len(DEGENERATE)]
        out[(i * len(out)) // count] = (gold, response + " " * i)  # distinct pairs: no dedup between them
    return out


def bare_main_thread(pairs: list[tuple[str, str]]) -> tuple[float, int, float]:
    """checks/s of verify(parse(g), parse(p)) in this thread, how many returned False after a timeout, CPU seconds."""
    import logging

    from math_verify import parse, verify

    timeouts = 0

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal timeouts
            timeouts += "Timeout" in record.getMessage()

    logging.getLogger("math_verify").addHandler(Count())
    start, cpu = time.perf_counter(), time.process_time()
    for gold, response in pairs:
        verify(parse(gold), parse(response))
    return len(pairs) / (time.perf_counter() - start), timeouts, time.process_time() - cpu


def gradekit_rate(pairs: list[tuple[str, str]], workers: int, timeout: float) -> tuple[float, dict[str, int], float]:
    """checks/s of MathVerifier.check_many, the outcomes, and the CPU seconds spent (workers' checks + this process)."""
    from gradekit.graders import MathVerifier

    with MathVerifier(timeout=timeout, workers=workers, cache_size=1) as verifier:
        for n in range(2 * workers):  # every worker is up: start-up is not a check's cost
            verifier.check_sync(str(n), str(n))
        before = verifier.stats()["worker_cpu_ms"]
        start, cpu = time.perf_counter(), time.process_time()
        checks = asyncio.run(verifier.check_many(pairs))
        elapsed, host_cpu = time.perf_counter() - start, time.process_time() - cpu
        worker_cpu = (verifier.stats()["worker_cpu_ms"] - before) / 1000
        outcomes: dict[str, int] = {}
        for check in checks:
            key = check.error_kind or check.outcome
            outcomes[key] = outcomes.get(key, 0) + 1
    return len(pairs) / elapsed, outcomes, worker_cpu + host_cpu


def child_threads(mode: str, n: int, seed: int) -> None:
    """The bare library in a 2-thread pool; prints a line per finished check (the parent counts them)."""
    from math_verify import parse, verify

    pairs = with_degenerate(clean_pairs(n, seed))

    def one(pair: tuple[str, str]) -> str:
        gold, response = pair
        try:
            if mode == "default":
                return "equal" if verify(parse(gold), parse(response)) else "false"
            return "equal" if verify(parse(gold, parsing_timeout=None), parse(response, parsing_timeout=None),
                                      timeout_seconds=None) else "false"
        except Exception as e:  # noqa: BLE001
            return type(e).__name__

    pool = ThreadPoolExecutor(2)
    for future in as_completed([pool.submit(one, pair) for pair in pairs]):  # as they finish: a stuck one hides no other
        print(future.result(), flush=True)
    os._exit(0)


def threads_run(mode: str, n: int, seed: int, bound: float) -> dict[str, object]:
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, "--pairs", str(n), "--seed", str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    start = time.perf_counter()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())

    with ThreadPoolExecutor(1) as reader:
        done = reader.submit(read)
        wait([done], timeout=bound)
        finished = done.done()  # the child closed its output: it ended by itself
        if not finished:
            proc.kill()
        proc.wait()
        done.result(timeout=10)
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return {"finished": finished, "answered": len(lines), "of": n, "outcomes": counts, "wall_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=2.0, help="gradekit's seconds per check")
    parser.add_argument("--bound", type=float, default=30.0, help="seconds the bare thread-pool runs may take before they are killed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2, help="clean runs, bare and gradekit alternated")
    parser.add_argument("--child", choices=("default", "off"))
    parser.add_argument("--skip-degenerate", action="store_true")
    args = parser.parse_args()
    if args.child:
        child_threads(args.child, args.pairs, args.seed)
        return
    clean = clean_pairs(args.pairs, args.seed)
    print(f"inputs: {len(clean)} distinct pairs ({sum(1 for _ in CASES.open())} of them Math-Verify's test cases); "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for run in range(args.repeat):  # alternated, so both see the same load
        bare, _, bare_cpu = bare_main_thread(clean)
        ours, outcomes, our_cpu = gradekit_rate(clean, args.workers, args.timeout)
        print(f"clean #{run + 1}:  bare math_verify {bare:6.1f} checks/s (1 process)   gradekit {ours:6.1f} checks/s ({args.workers} workers)"
              f"   ratio x{ours / bare:.2f}, per core x{ours / args.workers / bare:.2f} (wall), x{bare_cpu / our_cpu:.2f} (CPU: "
              f"{1000 * bare_cpu / len(clean):.1f} vs {1000 * our_cpu / len(clean):.1f} ms per check)   outcomes {outcomes}")
    if args.skip_degenerate:
        return
    mixed = with_degenerate(clean)
    degenerate = sum(1 for g, r in mixed if (g, r.rstrip()) in DEGENERATE)
    bare_mixed, silent, _ = bare_main_thread(mixed)
    ours_mixed, outcomes, _ = gradekit_rate(mixed, args.workers, args.timeout)
    print(f"1% degenerate ({degenerate} of {len(mixed)}):  bare {bare_mixed:7.1f} checks/s, {silent} internal timeouts returned "
          f"False (silent 0)   gradekit {ours_mixed:7.1f} checks/s (timeout {args.timeout:g} s), outcomes {outcomes}")
    for mode, label in (("default", "timeouts on (signal in a thread)"), ("off", "timeouts off (the threaded recipe)")):
        run = threads_run(mode, args.pairs, args.seed, args.bound)
        state = "finished" if run["finished"] else f"still running after {args.bound:g} s: killed"
        print(f"bare in a 2-thread pool, {label}: {run['answered']} of {run['of']} answered, {state}; outcomes {run['outcomes']}")


if __name__ == "__main__":
    main()
