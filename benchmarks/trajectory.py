"""Trajectories: fitting a long rollout into a judge's window, and an RL step of agent rollouts.

(a) render: one trajectory of about ``--tokens`` tokens (500,000; 400 tool calls whose results are
    5,000 characters each) fitted into a ``--budget`` of 32,000 tokens by ``middle_out``: the time
    (median of ``--repeat`` runs, parsing the messages included) and the peak memory it allocates
    (tracemalloc), on one core.
(b) step: one RL step's reward stage, ``--n`` rollouts (2,048) of about ``--step-tokens`` tokens
    each (30,000), judged by ``trajectory_task_success_en`` through the fake judge (a separate
    process) with a 32,768-token window, beside the same step judged on the final answers only
    (``semantic_equivalence_en``): wall time, requests and prompt tokens sent, and the ratio.

    python benchmarks/trajectory.py                       # both, the figures docs/benchmarks.md quotes
    python benchmarks/trajectory.py --only render --tokens 1000000
    python benchmarks/trajectory.py --only step --n 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import tracemalloc

from throughput import fake_provider

from gradekit.judge import Judge, Limiter, RetryPolicy, load_rubric
from gradekit.judge._trajectory import fit, read_steps

TASK = "Which company first sold the Acme rocket, and in which year?"


def rollout(tokens: int, result_chars: int = 5_000, seed: int = 0) -> list[dict]:
    """A search agent's rollout of about ``tokens`` tokens (gradekit's conservative count: 3 characters a token)."""
    calls = max(1, tokens * 3 // (result_chars + 120))
    messages = [{"role": "system", "content": "You are a search agent."}, {"role": "user", "content": f"{TASK} (#{seed})"}]
    for i in range(calls):
        messages.append({"role": "assistant", "content": f"Searching for the seller, attempt {i}.",
                         "tool_calls": [{"id": f"c{i}", "type": "function",
                                         "function": {"name": "web_search" if i % 7 else "fetch",
                                                      "arguments": json.dumps({"Query": f"acme rocket seller {seed}-{i}"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": (f"[{seed}-{i}] Acme rocket sales records. " * 200)[:result_chars]})
    messages.append({"role": "assistant", "content": "Acme Corp first sold it, in 1949."})
    return messages


def bench_render(tokens: int, budget: int, repeat: int) -> None:
    messages = rollout(tokens)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        rendered = fit(read_steps(messages), budget)
        times.append(time.perf_counter() - started)
    tracemalloc.start()
    fit(read_steps(messages), budget)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    c = rendered.coverage
    print(f"(a) render: {c.tokens_total:,} tokens ({c.steps_total} steps) into {budget:,}: {statistics.median(times) * 1000:.1f} ms "
          f"(median of {repeat}), peak {peak / 2**20:.1f} MiB allocated; shown {c.steps_shown} steps, {c.tokens_shown:,} tokens")


async def judge_all(base_url: str, rubric_name: str, rows: list[dict], concurrency: int) -> tuple[float, int, int, int]:
    judge = Judge("fake-judge", base_url=base_url, api_key="k", limiter=Limiter(concurrency=concurrency),
                  retry=RetryPolicy(max_attempts=3), cache=None, context_window=32_768)
    rubric = load_rubric(rubric_name)
    started = time.perf_counter()
    async with judge:
        verdicts = await asyncio.gather(*(judge.judge(rubric, row) for row in rows))
    wall = time.perf_counter() - started
    return wall, sum(v.ok for v in verdicts), sum(v.usage.requests for v in verdicts), sum(v.usage.prompt_tokens for v in verdicts)


def bench_step(n: int, tokens: int, concurrency: int) -> None:
    distinct = [rollout(tokens, seed=s) for s in range(16)]  # 16 rollouts, each row its own copy of one (no cache)
    whole = [{"trajectory": distinct[i % 16] + [{"role": "user", "content": f"row {i}"}, distinct[i % 16][-1]]} for i in range(n)]
    final = [{"question": TASK, "references": ["Acme Corp, 1949"], "prediction": f"{row['trajectory'][-1]['content']} (row {i})"}
             for i, row in enumerate(whole)]
    with fake_provider("--context-window", "32768", quiet=True) as base_url:
        t_final, ok_final, req_final, tok_final = asyncio.run(judge_all(base_url, "semantic_equivalence_en", final, concurrency))
        t_whole, ok_whole, req_whole, tok_whole = asyncio.run(judge_all(base_url, "trajectory_task_success_en", whole, concurrency))
    print(f"(b) step of {n} rollouts of ~{tokens:,} tokens, concurrency {concurrency}:")
    print(f"    final answer only  {t_final:7.2f} s  {ok_final}/{n} ok  {req_final} requests  {tok_final:,} prompt tokens")
    print(f"    whole trajectory   {t_whole:7.2f} s  {ok_whole}/{n} ok  {req_whole} requests  {tok_whole:,} prompt tokens")
    print(f"    ratio              {t_whole / t_final:7.2f}x wall time, {tok_whole / max(tok_final, 1):.0f}x prompt tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["render", "step"], default=None)
    parser.add_argument("--tokens", type=int, default=500_000)
    parser.add_argument("--budget", type=int, default=32_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--step-tokens", type=int, default=30_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if args.only in (None, "render"):
        bench_render(args.tokens, args.budget, args.repeat)
    if args.only in (None, "step"):
        bench_step(args.n, args.step_tokens, args.concurrency)


if __name__ == "__main__":
    main()
