"""What the one-verdict rule costs on real judge replies: LLMBar's recorded GPT-4 and ChatGPT completions.

The parse layer used to take the last match; now a reply naming two different verdicts is a parse
failure (``ambiguous_verdict``). Every recorded completion of all 147 runs (every strategy, both
orders, both stages of the Swap strategies) is read twice, with the old rule (last match, rebuilt
here) and with ``judge.parse_reply``, under two readings:

- ``upstream``: the run's own parse spec (``comparison_spec`` / ``rating_spec``, the readings that
  reproduce the published ``statistics.json``);
- ``llmbar_pairwise``: the shipped rubric, as ``gradekit llmbar`` / ``meta-eval`` replays read them.

For each it counts the replies that become ambiguous and the verdicts that change, and, for the
llmbar_pairwise reading, how the ambiguous replies had been read before (the same verdict as
upstream's reading, or another). ``--replay`` also grades every bare-verdict run through the real
Judge against its loopback replay and checks Acc / Agr against the published figures.

    python benchmarks/parse_ambiguity.py [--replay] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gradekit.graders.calibration._llmbar import list_runs, load_run, parse_specs, replay_grade  # noqa: E402
from gradekit.judge import ParseFailure, Rubric, load_rubric, match_label, parse_reply  # noqa: E402

# A verdict-statement pattern for llmbar_pairwise (a proposal, not shipped): "Output (x)" alone on its
# line or followed by "is better", at a line start or after "Therefore,"; a paragraph that starts by
# naming an output to discuss it is not a verdict.
PROPOSED = (r'(?:^|\n|(?:Therefore|Thus|Hence|So|Overall|In conclusion),?[ \t]+)[ \t*_#>`"]*(?P<label>Output \([ab]\))'
            r'(?=[ \t*_`"]*(?:is (?:the )?better\b|[.!]?[ \t*_`"]*(?:\n|\Z)))')
BARE = {"Vanilla", "Vanilla_NoRules", "Vanilla_1shot", "Vanilla_2shot", "Metrics", "Reference", "Metrics_Reference"}


def last_match(spec: Rubric, text: str) -> str | None:
    """The previous rule for regex specs: the label of the last match, None if none or not offered."""
    assert spec.output.pattern is not None
    last = None
    for last in re.finditer(spec.output.pattern, text, re.DOTALL):
        pass
    if last is None:
        return None
    answer = last.group("label") if "label" in last.re.groupindex else (last.group(1) if last.re.groups else last.group(0))
    matched = match_label(spec, answer or "")
    return matched[0] if matched else None


def one_verdict(spec: Rubric, text: str) -> tuple[str | None, bool]:
    """(label or None, ambiguous?) under the current parse layer."""
    try:
        return parse_reply(spec, text, "text").label, False
    except ParseFailure as failure:
        return None, failure.reason == "ambiguous_verdict"


def replies():
    """(run, the run's spec for that step, completion text as recorded) for every recorded completion."""
    for run in list_runs():
        specs = parse_specs(run.judge, run.strategy)
        for row in load_run(run):
            for number, step in enumerate(row["results"]):
                if run.kind == "rating":
                    if number == len(row["results"]) - 1:
                        for key in ("score_1", "score_2"):
                            yield run, specs[-1], step[key][0]
                    continue
                if not isinstance(step, dict):
                    continue  # a generated metric or reference output, not parsed
                spec = specs[number] if run.kind == "swap" else specs[-1]
                for order in ("swap = False", "swap = True"):
                    yield run, spec, step[order]["completion"][0]


def group(strategy: str) -> str:
    return "bare verdict" if strategy in BARE else strategy


def measure(pattern: str | None = None) -> dict[str, Counter]:
    pairwise = load_rubric("llmbar_pairwise")
    if pattern is not None:
        pairwise = pairwise.model_copy(update={"output": pairwise.output.model_copy(update={"pattern": pattern})})
    counts: dict[str, Counter] = {}
    for run, spec, text in replies():
        c = counts.setdefault(group(run.strategy), Counter())
        c["replies"] += 1
        old = last_match(spec, text.strip())  # upstream strips the completion before matching
        new, new_ambiguous = one_verdict(spec, text.strip())
        c["upstream ambiguous"] += new_ambiguous
        c["upstream changed"] += (not new_ambiguous) and new != old
        if run.kind == "rating":
            continue
        c["pairwise replies"] += 1
        p_old = last_match(pairwise, text)
        p_new, p_ambiguous = one_verdict(pairwise, text)
        c["pairwise ambiguous"] += p_ambiguous
        c["pairwise changed"] += (not p_ambiguous) and p_new != p_old
        c["pairwise ambiguous, old read = upstream"] += p_ambiguous and p_old == new
        c["pairwise ambiguous, old read != upstream"] += p_ambiguous and p_old != new
        c["pairwise old read != upstream"] += p_old != new
        c["pairwise new read = upstream"] += p_new is not None and p_new == new
    return counts


async def replay_all() -> tuple[int, int, Counter]:
    """Every bare-verdict comparison run graded through the Judge against its replay: (runs, reproduced, error rows by kind)."""
    runs = reproduced = 0
    errors: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix="gradekit-parse-ambiguity-") as tmp:
        for run in list_runs():
            if run.strategy not in BARE:
                continue
            output = Path(tmp) / f"{run.subset}__{run.judge}__{run.strategy}.jsonl"
            result = await replay_grade(run, output=output)
            with output.open(encoding="utf-8") as handle:
                errors.update(row["error_kind"] for row in map(json.loads, handle) if row.get("error_kind"))
            report = result.summary.results.report
            runs += 1
            same = report is not None and report.acc is not None and report.agr is not None and \
                abs(report.acc * 100 - result.published_acc) < 1e-9 and abs(report.agr * 100 - result.published_agr) < 1e-9
            reproduced += same
            if not same:
                print(f"  DIFFERS {result.run}: {report}", file=sys.stderr)
    return runs, reproduced, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", action="store_true", help="also grade every bare-verdict run through the Judge and its replay")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--proposed-pattern", action="store_true",
                        help="read llmbar_pairwise with the verdict-statement pattern PROPOSED instead of the shipped one")
    args = parser.parse_args()
    started = time.perf_counter()
    counts = measure(PROPOSED if args.proposed_pattern else None)
    total = sum(counts.values(), Counter())
    if args.json:
        print(json.dumps({"version": 1, "by_strategy": counts, "total": total}, indent=1))
    else:
        print("| strategies | replies | upstream spec: ambiguous / changed | llmbar_pairwise: replies | ambiguous "
              "| changed | ambiguous, last match had read as upstream / otherwise | last match read != upstream "
              "| one verdict read = upstream |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, c in [*sorted(counts.items()), ("all", total)]:
            print(f"| {name} | {c['replies']} | {c['upstream ambiguous']} / {c['upstream changed']} | {c['pairwise replies']} "
                  f"| {c['pairwise ambiguous']} | {c['pairwise changed']} | {c['pairwise ambiguous, old read = upstream']} / "
                  f"{c['pairwise ambiguous, old read != upstream']} | {c['pairwise old read != upstream']} "
                  f"| {c['pairwise new read = upstream']} |")
        print(f"\nread {total['replies']} recorded replies twice in {time.perf_counter() - started:.1f} s")
    failed = total["upstream ambiguous"] + total["upstream changed"] + counts.get("bare verdict", Counter())["pairwise ambiguous"] \
        + counts.get("bare verdict", Counter())["pairwise changed"]
    if args.replay:
        runs, reproduced, errors = asyncio.run(replay_all())
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(errors.items())) or "none"
        print(f"replayed {runs} bare-verdict runs through the Judge: {reproduced} reproduce the published Acc / Agr; "
              f"error rows: {kinds} (a refusal is a reply upstream recorded as withheld by Azure's content filter)")
        failed += (runs - reproduced) + errors["parse_failure"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
