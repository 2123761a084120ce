"""Issue 23's done-when at full size: a cascade fitted on 300 labelled rows grades 900 others.

Judges of known reliability (gradekit.judge.testing.JudgePopulation: a weak judge right 77% of the time on
one call, strong judges 89%; each (model, row) easy or hard) served by ``python -m gradekit.judge.testing
--population`` in its own process; ``gradekit cascade fit`` and ``gradekit grade --cascade`` run
as the user runs them. Per seed it prints the fitted thresholds, the coverage, the agreement of
the trusted rows with the truth, the weak judge's share, the requests against the strongest judge
alone and the wall time; then a jury of three strong judges (majority), with and without a fourth
juror answering HTTP 500.

    PYTHONPATH=. python benchmarks/cascade_population.py [--seeds 3] [--easy 0.98 --hard 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAST = ["--no-cache", "--concurrency", "64", "--no-adapt"]


def gradekit(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "gradekit", *args], env={**os.environ, "OPENAI_API_KEY": "k"},
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr)
    return done


def one_seed(seed: int, easy: float, hard: float, folder: Path) -> None:
    rng = random.Random(seed)
    rows = [{"id": i, "question": f"question {i}?", "references": ["x"], "prediction": "y",
             "label": rng.choice(["correct", "incorrect"])} for i in range(1200)]
    truth = {r["id"]: r["label"] for r in rows}
    spec = {"accuracy": {"weak": 0.77, "strong-a": 0.89, "strong-b": 0.89, "strong-c": 0.89}, "labels": ["correct", "incorrect"],
            "truth": {str(k): v for k, v in truth.items()}, "key_pattern": r"question (\d+)\?", "failing": {"down": 500},
            "seed": seed, "easy": easy, "hard": hard}
    (folder / "population.json").write_text(json.dumps(spec))
    for name, part in (("calibration", rows[:300]), ("graded", rows[300:])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    fake = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--population", str(folder / "population.json")],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        started = time.perf_counter()
        gradekit("cascade", "fit", str(folder / "calibration.jsonl"), "-r", "semantic_equivalence_en", "--model", "weak",
                 "--model", "strong-a", "--samples", "5", "--target", "0.9", "--delta", "0.05", "-o", str(folder / "cascade.json"),
                 "--base-url", url, *FAST)
        fitted = json.loads((folder / "cascade.json").read_text())
        fit_s = time.perf_counter() - started
        started = time.perf_counter()
        done = gradekit("grade", str(folder / "graded.jsonl"), "-r", "semantic_equivalence_en", "--cascade", str(folder / "cascade.json"),
                        "-o", str(folder / "out.jsonl"), "--restart", "--base-url", url, "--json", *FAST)
        grade_s = time.perf_counter() - started
        out = [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()]
        trusted = [r for r in out if r["status"] == "ok"]
        block = json.loads(done.stdout)["cascade"]
        print(f"seed {seed}: thresholds {[j['threshold'] for j in fitted['judges']]}, coverage {len(trusted) / len(out):.3f}, "
              f"trusted agreement {sum(r['label'] == truth[r['id']] for r in trusted) / max(1, len(trusted)):.3f}, "
              f"weak decides {sum(r['decided_by'] == 'weak' for r in out) / len(out):.3f}, "
              f"requests {block['requests']} vs {block['strongest_alone']['requests']} strong alone; fit {fit_s:.0f} s, grade {grade_s:.0f} s")
        for jurors in (["strong-a", "strong-b", "strong-c"], ["strong-a", "strong-b", "strong-c", "down"]):
            started = time.perf_counter()
            gradekit("grade", str(folder / "graded.jsonl"), "-r", "semantic_equivalence_en", *[x for m in jurors for x in ("--model", m)],
                     "--jury", "majority", "-o", str(folder / "jury.jsonl"), "--restart", "--base-url", url, *FAST)
            got = [json.loads(line) for line in (folder / "jury.jsonl").read_text().splitlines()]
            print(f"  jury {'+'.join(jurors)}: ok {sum(r['status'] == 'ok' for r in got)}/{len(got)}, agreement "
                  f"{sum(r['label'] == truth[r['id']] for r in got) / len(got):.3f}; {time.perf_counter() - started:.0f} s")
    finally:
        fake.terminate()
        fake.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--easy", type=float, default=0.98, help="a call's accuracy on a row easy for the model")
    parser.add_argument("--hard", type=float, default=0.5, help="a call's accuracy on a row hard for the model")
    args = parser.parse_args()
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            one_seed(seed, args.easy, args.hard, Path(tmp))


if __name__ == "__main__":
    main()
