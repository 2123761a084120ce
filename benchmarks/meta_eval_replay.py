"""`gradekit meta-eval` replayed from LLMBar's recorded judges: does it reproduce the published rows?

For every recorded strategy whose replies are a bare verdict (Vanilla, Vanilla_NoRules,
Vanilla_1shot, Vanilla_2shot, Metrics, Reference, Metrics_Reference) of GPT-4 and ChatGPT, the
recorded completions are served by the fake provider (`suite_replay_responder`, the same replay as
`gradekit llmbar --serve --subset all`) and every shipped suite that recorded the strategy is
meta-evaluated through the normal Judge path with llmbar_pairwise and the tie rule. Each subset's
accuracy and agreement are compared with the published row. Wall time is quoted per strategy.

    python benchmarks/meta_eval_replay.py [--judge GPT-4] [--strategy Vanilla_NoRules]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gradekit.graders.calibration._llmbar import judge_model, resolve_run, suite_replay_responder  # noqa: E402
from gradekit.graders.calibration._meta_eval import meta_eval  # noqa: E402
from gradekit.graders.calibration._suites import SHIPPED_SUITES, load_suite  # noqa: E402
from gradekit.judge import Judge, Limiter, load_rubric  # noqa: E402
from gradekit.judge.testing import FakeProvider  # noqa: E402

BARE = ["Vanilla", "Vanilla_NoRules", "Vanilla_1shot", "Vanilla_2shot", "Metrics", "Reference", "Metrics_Reference"]


def recorded(suite: str, judge: str, strategy: str) -> bool:
    try:
        for directory, _ in SHIPPED_SUITES[suite]:
            resolve_run(directory, judge, strategy)
    except ValueError:
        return False
    return True


async def one(judge: str, strategy: str) -> tuple[int, int, float, int]:
    suites = [load_suite(name) for name in SHIPPED_SUITES if recorded(name, judge, strategy)]
    rubric = load_rubric("llmbar_pairwise")
    with FakeProvider(responder=suite_replay_responder(judge, strategy)) as server:
        started = time.perf_counter()
        async with Judge(judge_model(judge, strategy), base_url=server.base_url, api_key="replay",
                         limiter=Limiter(concurrency=16)) as client:
            report = await meta_eval(suites, rubric, [client], on_conflict="tie")
        wall = time.perf_counter() - started
    published = {(p.suite, p.subset): p for p in report.published if p.judge == f"{judge}/{strategy}"}
    same = differ = 0
    for row in report.results:
        p = published[(row.suite, row.subset)]
        ok = abs(row.accuracy - p.accuracy) < 1e-9 and abs(row.agreement - p.agreement) < 1e-9 and row.n == p.n
        same += ok
        differ += not ok
        if not ok:
            print(f"  DIFFERS {row.suite}/{row.subset}: {row.accuracy:.2f}/{row.agreement:.2f} vs published "
                  f"{p.accuracy:.2f}/{p.agreement:.2f}")
    pairs = sum(len(s.pairs) for s in suites)
    print(f"| {judge}/{strategy} | {', '.join(s.name for s in suites)} | {pairs} | {same}/{same + differ} | "
          + " ".join(f"{r.subset} {r.accuracy:.1f}/{r.agreement:.1f}" for r in report.results if r.suite == "llmbar" or len(suites) > 1 and r.subset != "overall")
          + f" | {wall:.1f} s |")
    return same, differ, wall, pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", action="append", choices=["GPT-4", "ChatGPT"])
    parser.add_argument("--strategy", action="append", choices=BARE)
    args = parser.parse_args()
    print("| recorded judge / strategy | suites | pairs | rows reproduced | Acc/Agr per subset (meta-eval, %) | wall |")
    print("|---|---|---|---|---|---|")
    total_same = total_differ = 0
    for judge in args.judge or ["GPT-4", "ChatGPT"]:
        for strategy in args.strategy or BARE:
            same, differ, _, _ = asyncio.run(one(judge, strategy))
            total_same += same
            total_differ += differ
    print(f"\n{total_same} of {total_same + total_differ} published rows reproduced exactly")
    sys.exit(1 if total_differ else 0)


if __name__ == "__main__":
    main()
