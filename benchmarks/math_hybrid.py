"""The judge calls the hybrid (math_equivalence + judge_fallback) saves on a realistic mix of answers.

Rows come from eval_sets/answer_verification ((question, gold, response) rows with human verdicts
and every kind of answer: boxed answers, notation differences, prose, units, long solutions,
multiple choice, short strings) and from a balanced draw of it (every wrong row and as many right
ones, as a GRPO batch half right would be).
Each mix is graded as a user grades it, `python -m gradekit grade --grader hybrid.yaml` in a
subprocess against the loopback fake judge (scripted with the human verdicts). The judge requests
are counted at the fake and set against what the judge alone costs under the same both-orders
rule (two per row); the symbolic check is the real one.

    PYTHONPATH=. python benchmarks/math_hybrid.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gradekit.graders.calibration._answer_eval import load_answer_suite, scripted_responder
from gradekit.judge.testing import FakeProvider

HYBRID = 'type: verified_answer\nexpression: "{{references.answer}}"\njudge_fallback: {rubric: answer_verification_3way}\n'


def grade(folder: Path, rows, config: str, fake: FakeProvider) -> dict:
    source, grader, out = folder / "mix.jsonl", folder / "grader.yaml", folder / "out.jsonl"
    source.write_text("".join(json.dumps({"id": r.id, "prompt": r.question or "Solve the problem.", "response": r.response,
                                          "references": {"answer": r.gold}}) + "\n" for r in rows), encoding="utf-8")
    grader.write_text(config, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(grader), "-o", str(out),
                           "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--restart", "--json", "--keep-going"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr)
    return json.loads(done.stdout)


def main() -> None:
    _, rows = load_answer_suite()
    wrong = [r for r in rows if r.verdict == "incorrect"]
    right = [r for r in rows if r.verdict == "correct"]
    share = sum(r.verdict == "correct" for r in rows) / len(rows)
    mixes = {f"answer_verification ({len(rows)} rows, {share:.0%} right)": rows,
             f"balanced ({2 * len(wrong)} rows, 50% right)": wrong + right[:: max(1, len(right) // len(wrong))][: len(wrong)]}
    print("judge calls the hybrid saves (requests counted at the fake judge; the symbolic check is real)")
    with tempfile.TemporaryDirectory() as tmp:
        for label, mix in mixes.items():
            with FakeProvider(responder=scripted_responder(rows)) as fake:
                hybrid = grade(Path(tmp), mix, HYBRID, fake)
                hybrid_requests = len(fake.chat_requests())
            both_orders = 2 * len(mix)  # the judge alone under the same both-orders rule
            accepted = hybrid["decided_by"].get("symbolic", 0)
            print(f"  {label}: decided_by symbolic {accepted}, judge {hybrid['decided_by'].get('judge', 0)}; "
                  f"judge requests {hybrid_requests} vs {both_orders} for the judge alone in both orders "
                  f"({hybrid_requests / both_orders:.2f}x; judge_calls_saved {hybrid['judge_calls_saved']}, "
                  f"{hybrid['judge_calls_saved'] / both_orders:.0%}); wall {hybrid['wall_s']:.1f} s")
            assert hybrid_requests == 2 * hybrid["decided_by"].get("judge", 0), "two requests per judged row, none for the others"


if __name__ == "__main__":
    main()
