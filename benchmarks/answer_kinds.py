"""Verified answers per kind: what the rules accept against bare math_verify, and checks per second.

Rows: eval_sets/answer_verification (its ``kind`` and ``split`` columns: number, expression, choice,
string; ``dev`` the rules were tuned on, ``heldout`` and ``heldout2`` written before them and held
out). Two measures on the same rows, each against a baseline run in the same process:

1. Accepted: per split and kind, recall (said equal / human correct) and false positives (said
   equal / human incorrect) of gradekit's rules (``MathVerifier``, ``kind: auto``, the row's
   question) and of the bare library, ``verify(parse(gold), parse(response))``, main thread.
   A gradekit check that could not finish (timeout, verifier_error, invalid_gold) is counted apart:
   it is never a score.
2. Speed: per kind, checks per second of ``MathVerifier(workers=2).check_many`` on distinct pairs
   (the rows repeated with a trailing space each, so no cache is hit) against the bare library on
   the same pairs in one process; the ratio per core divides by the two workers.

    python benchmarks/answer_kinds.py [--pairs 400] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

# benchmarks/math_verify.py is named after the library: this folder must not shadow the real math_verify.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from gradekit.graders import MathVerifier  # noqa: E402
from gradekit.graders.calibration._answer_eval import load_answer_suite  # noqa: E402

KINDS = ("number", "expression", "choice", "string")


def bare(gold: str, response: str) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(gold), parse(response)))
    except Exception:  # noqa: BLE001 - the bare baseline as trainers call it: an exception is a 0
        return False


def accepted(rows, verifier: MathVerifier) -> None:
    checks = asyncio.run(_checks(verifier, [(r.gold, r.response, r.question) for r in rows]))
    table: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row, check in zip(rows, checks):
        cell = table[(row.split or "-", row.kind or "-")]
        human = "pos" if row.verdict == "correct" else "neg"
        cell[human] += 1
        cell[f"bare_{human}"] += bare(row.gold, row.response)
        cell[f"ours_{human}"] += check.outcome == "equal"
        cell["unfinished"] += check.outcome in ("error", "invalid_gold")
    print("accepted: recall (said equal / human correct) and false positives (said equal / human incorrect)")
    print(f"  {'split':9} {'kind':11} {'bare recall':>12} {'gradekit recall':>16} {'bare FP':>8} {'gradekit FP':>12} {'no decision':>12}")
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (split, kind), cell in sorted(table.items()):
        for key, value in cell.items():
            totals[split][key] += value
        print(f"  {split:9} {kind:11} {cell['bare_pos']:>5}/{cell['pos']:<6} {cell['ours_pos']:>9}/{cell['pos']:<6} "
              f"{cell['bare_neg']:>3}/{cell['neg']:<4} {cell['ours_neg']:>7}/{cell['neg']:<4} {cell['unfinished']:>12}")
    for split, cell in sorted(totals.items()):
        ratio = cell["ours_pos"] / cell["bare_pos"] if cell["bare_pos"] else float("inf")
        print(f"  {split:9} {'all':11} {cell['bare_pos']:>5}/{cell['pos']:<6} {cell['ours_pos']:>9}/{cell['pos']:<6} "
              f"{cell['bare_neg']:>3}/{cell['neg']:<4} {cell['ours_neg']:>7}/{cell['neg']:<4} {cell['unfinished']:>12}   "
              f"recall x{ratio:.2f} of bare")


async def _checks(verifier: MathVerifier, triples):
    return await asyncio.gather(*(verifier.check(g, r, question=q) for g, r, q in triples))


def speed(rows, pairs: int, workers: int, timeout: float) -> None:
    print(f"speed: {pairs} distinct pairs per kind; gradekit on {workers} workers against the bare library in one process "
          "(wall: checks per second; CPU: milliseconds per check, the workers' as they report it plus all of this process's)")
    for kind in KINDS:
        mine = [r for r in rows if r.kind == kind]
        triples = [(r.gold, r.response + " " * (i // len(mine)), r.question) for i, r in zip(range(pairs), _cycle(mine))]
        start, cpu = time.perf_counter(), time.process_time()
        for gold, response, _ in triples:
            bare(gold, response)
        bare_rate, bare_cpu = len(triples) / (time.perf_counter() - start), (time.process_time() - cpu) / len(triples)
        with MathVerifier(timeout=timeout, workers=workers, cache_size=1) as verifier:
            for n in range(2 * workers):  # every worker up: start-up is not a check's cost
                verifier.check_sync(str(n), str(n))
            before = verifier.stats()["worker_cpu_ms"]
            start, cpu = time.perf_counter(), time.process_time()
            checks = asyncio.run(_checks(verifier, triples))
            ours = len(triples) / (time.perf_counter() - start)
            our_cpu = ((verifier.stats()["worker_cpu_ms"] - before) / 1000 + time.process_time() - cpu) / len(triples)
        errors = sum(c.outcome == "error" for c in checks)
        print(f"  {kind:11} bare {bare_rate:7.1f} checks/s {1000 * bare_cpu:6.2f} ms CPU   gradekit {ours:7.1f} checks/s "
              f"{1000 * our_cpu:6.2f} ms CPU   wall x{ours / bare_rate:.2f} (per core x{ours / workers / bare_rate:.2f}), "
              f"CPU x{bare_cpu / our_cpu:.2f}   ({errors} errors)")


def _cycle(items):
    while True:
        yield from items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=400, help="distinct pairs per kind for the speed run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the bare library logs every parse failure
    _, rows = load_answer_suite()
    print(f"{len(rows)} rows; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with MathVerifier(timeout=args.timeout, workers=args.workers) as verifier:
        accepted(rows, verifier)
    if not args.skip_speed:
        speed(rows, args.pairs, args.workers, args.timeout)


if __name__ == "__main__":
    main()
