"""The cost of a judgement: 1,000 rows through a 2,000-token rubric, today's request layout and settings
against caching, warm-up and flex, per provider model, against the fake provider playing each provider's
caching and billing model (``gradekit.judge.testing.FakeProvider(cache_model=...)``: minimum prefix,
write and read prices, a cache filled only when a request completes; flex at half price).

Contenders (each a fresh fake, so every run starts with a cold provider cache):

- ``gpt-5.6 today``: chat completions, no ``prompt_cache_key``, no warm-up (``Judge(warm=False)``);
  OpenAI's caching model (writes 1.25x, reads 0.1x);
- ``gpt-5.6 cached``: the same judge with warm-up and ``prompt_cache_key`` (gradekit's default on OpenAI);
- ``gpt-5.6 cached+flex``: and ``service_tier: flex`` (half price);
- ``claude today``: Anthropic's OpenAI-compatible endpoint (no prompt cache there), ``api: chat``;
- ``claude native``: ``api: anthropic`` (a ``cache_control`` breakpoint on the rubric's system block,
  structured output through ``output_config.format``), Anthropic's caching model.

Every request is answered after ``--latency`` seconds (a judge's round trip). Printed per contender: the
cost gradekit reports, what the fake billed (they must match), the requests that wrote the cache, wall
time, and the ratios of cost and wall time to that model's ``today`` run (the targets: Claude native
<= 0.35x the cost, one write per prefix for OpenAI, <= 1.1x the wall time without flex).

    python benchmarks/prompt_cost.py                     # 1,000 rows, concurrency 64, 1 s per request
    python benchmarks/prompt_cost.py --rows 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from gradekit.judge import Budget, Judge, Limiter, load_rubric
from gradekit.judge._budget import usage_cost
from gradekit.judge.testing import FakeProvider, write_long_rubric

SHORT = load_rubric("correctness_3way")
PRICES = {"gpt-5.6": {"input": 4.0, "output": 20.0}, "claude-sonnet-4-5": {"input": 3.0, "output": 15.0}}
CONTENDERS = [  # (name, model, fake's cache model, dialect, judge options)
    ("gpt-5.6 today", "gpt-5.6", "openai", "openai", {"warm": False, "prompt_cache_key": False}),
    ("gpt-5.6 cached", "gpt-5.6", "openai", "openai", {"prompt_cache_key": True}),
    ("gpt-5.6 cached+flex", "gpt-5.6", "openai", "openai", {"prompt_cache_key": True, "service_tier": "flex"}),
    ("claude today", "claude-sonnet-4-5", "none", "anthropic", {"api": "chat"}),
    ("claude native", "claude-sonnet-4-5", "anthropic", "anthropic", {"api": "anthropic"}),
]


async def run(name: str, model: str, cache_model: str, dialect: str, options: dict, rubric, rows: list[dict],
              concurrency: int, latency: float) -> dict:
    prices = Budget().prices
    with FakeProvider(cache_model=cache_model, dialect=dialect, prices=PRICES[model], latency=latency) as fake:
        judge = Judge(model, base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=concurrency), cache=None, **options)
        async with judge:
            # As on any run after the first: what the endpoint takes is known (gradekit keeps it in its cache), so
            # no learning gate holds the first wave. One short row (below every cache minimum) teaches it here.
            await judge.judge(SHORT, rows[0])
            billed, writes = fake.billing.billed_usd, fake.billing.cache_writes
            started = time.perf_counter()
            verdicts = await asyncio.gather(*(judge.judge(rubric, row) for row in rows))
            wall = time.perf_counter() - started
        usage = sum((v.usage for v in verdicts), start=verdicts[0].usage.__class__())
        reported = float(usage_cost(prices, model, usage) or 0)
        return {"name": name, "ok": sum(v.ok for v in verdicts), "reported": reported, "billed": fake.billing.billed_usd - billed,
                "writes": fake.billing.cache_writes - writes, "wall": wall}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the fake takes per request")
    parser.add_argument("--rubric-tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1, help="runs per contender (the median wall time is kept)")
    args = parser.parse_args()
    rubric = load_rubric(write_long_rubric(Path(tempfile.mkdtemp()), args.rubric_tokens))
    rows = [{"question": f"question {i}: what is {i} + {i}?", "references": [str(2 * i)], "prediction": str(2 * i)}
            for i in range(args.rows)]
    results: dict[str, dict] = {}
    for _ in range(args.rounds):
        for contender in CONTENDERS:
            result = await run(*contender, rubric, rows, args.concurrency, args.latency)
            kept = results.setdefault(result["name"], {**result, "walls": []})
            kept["walls"].append(result["wall"])
    print(f"{args.rows} rows, {args.rubric_tokens}-token rubric, concurrency {args.concurrency}, {args.latency:g} s per request, "
          f"{args.rounds} round(s)")
    print(f"{'contender':<22}{'ok':>6}{'reported $':>12}{'billed $':>12}{'writes':>8}{'wall s':>8}{'cost x':>8}{'wall x':>8}")
    for name, r in results.items():
        base = results[name.split(" ")[0] + " today"]
        wall, base_wall = statistics.median(r["walls"]), statistics.median(base["walls"])
        print(f"{name:<22}{r['ok']:>6}{r['reported']:>12.4f}{r['billed']:>12.4f}{r['writes']:>8}{wall:>8.2f}"
              f"{r['reported'] / base['reported']:>8.3f}{wall / base_wall:>8.3f}")
        assert abs(r["reported"] - r["billed"]) <= 1e-9 * max(1.0, r["billed"]), f"{name}: reported != billed"


if __name__ == "__main__":
    asyncio.run(main())
