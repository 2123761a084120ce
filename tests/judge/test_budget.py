"""The budget cap (--max-cost, --max-tokens) over real HTTP to the loopback fake: admission, skips, cache savings, prices."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gradekit.judge import Budget, Judge, ModelPrice, cost_usd, load_prices, load_rubric
from gradekit.judge._budget import price_of
from gradekit.judge.testing import FakeProvider, Reply

RUBRIC = load_rubric("semantic_equivalence_en")
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}  # every reply bills exactly this
PRICES = {"fake-judge": ModelPrice(input=2.0, output=10.0)}
COST = 0.003  # 1000 * $2/1M + 100 * $10/1M per request
TOKENS = 1100


@pytest.fixture(autouse=True)
def _no_price_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRADEKIT_PRICES", raising=False)


@pytest.fixture
def billed(fake: FakeProvider) -> FakeProvider:
    fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "same", "judgement": "correct"}), usage=USAGE))
    return fake


def row(i: int) -> dict:
    return {"question": f"question {i}?", "references": ["Paris"], "prediction": "Paris"}


@pytest.mark.parametrize("budget", [
    pytest.param(lambda: Budget(max_cost_usd=4 * COST, prices=PRICES), id="max_cost"),
    pytest.param(lambda: Budget(max_tokens=4 * TOKENS), id="max_tokens"),
])
async def test_one_at_a_time_a_cap_of_n_requests_sends_exactly_n(billed: FakeProvider, make_judge, budget) -> None:
    cap = budget()
    judge = make_judge(budget=cap)
    verdicts = [await judge.judge(RUBRIC, row(i)) for i in range(7)]
    assert [v.status for v in verdicts] == ["ok"] * 4 + ["skipped"] * 3
    assert len(billed.chat_requests()) == 4
    for v in verdicts[4:]:
        assert (v.error_kind, v.score, v.usage.requests, v.usage.prompt_tokens) == ("budget", None, 0, 0)
        assert v.error is not None and v.error.startswith("budget reached: spent ")
    assert cap.spent_tokens == 4 * TOKENS and cap.exhausted and cap.refused == 3
    if cap.max_cost_usd is not None:
        assert cap.spent_usd == pytest.approx(4 * COST)
        assert "spent $0.0120 of $0.012" in (verdicts[-1].error or "")


@pytest.mark.parametrize("k", [2, 4])
async def test_with_k_in_flight_the_overshoot_is_bounded_by_what_was_in_flight(fake: FakeProvider, make_judge, k: int) -> None:
    # Slow replies keep k requests in flight when the cap is reached.
    fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}), usage=USAGE, delay=0.02))
    cap = Budget(max_cost_usd=5 * COST, prices=PRICES)
    judge = make_judge(budget=cap)
    gate = asyncio.Semaphore(k)

    async def one(i: int):
        async with gate:
            return await judge.judge(RUBRIC, row(i))

    verdicts = await asyncio.gather(*(one(i) for i in range(20)))
    sent = len(fake.chat_requests())
    assert sum(v.status == "ok" for v in verdicts) == sent
    assert all((v.status, v.error_kind) == ("skipped", "budget") for v in verdicts if v.status != "ok")
    assert sent >= 5, "the budget is used up before anything is skipped"
    assert sent < 5 + k, f"at most the {k} requests in flight run past the cap, sent {sent}"
    assert cap.spent_usd == pytest.approx(sent * COST)


async def test_cache_hits_after_exhaustion_still_score_and_report_what_they_saved(billed: FakeProvider, make_judge) -> None:
    cap = Budget(max_cost_usd=2 * COST, prices=PRICES)
    judge = make_judge(cache=True, budget=cap)
    first = [await judge.judge(RUBRIC, row(i)) for i in range(2)]
    assert all(v.ok and not v.cached for v in first) and cap.exhausted
    again = [await judge.judge(RUBRIC, row(i)) for i in range(2)]
    for v in again:
        assert (v.status, v.score, v.cached) == ("ok", 1.0, True)
        assert (v.usage.prompt_tokens, v.usage.completion_tokens) == (0, 0), "a cache hit bills nothing in this run"
        assert (v.usage.saved_prompt_tokens, v.usage.saved_completion_tokens) == (1000, 100)
    assert cap.saved_tokens == 2 * TOKENS and cap.saved_usd == pytest.approx(2 * COST)
    fresh = await judge.judge(RUBRIC, row(99))
    assert (fresh.status, fresh.error_kind) == ("skipped", "budget")
    assert len(billed.chat_requests()) == 2
    assert cap.spent_usd == pytest.approx(2 * COST)


async def test_a_zero_cap_serves_only_the_cache(billed: FakeProvider, make_judge) -> None:
    judge = make_judge(budget=Budget(max_cost_usd=0, prices=PRICES))
    verdict = await judge.judge(RUBRIC, row(1))
    assert (verdict.status, verdict.error_kind) == ("skipped", "budget") and billed.chat_requests() == []


async def test_admission_counts_requests_in_flight_and_waits_for_them() -> None:
    budget = Budget(max_tokens=100, model="fake-judge", prices=PRICES)
    held = [budget.try_start(40), budget.try_start(40), budget.try_start(40)]
    assert all(held), "spent 0 + reserved 80 is still under 100 when the third starts"
    assert budget.try_start(1) is None, "reserved 120: nothing more starts"
    waiting = asyncio.ensure_future(budget.start(1))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done(), "requests in flight may still leave room: wait, do not refuse"
    budget.settle(held[0], 5, 5)  # billed 10 of its 40: spent 10 + reserved 80 < 100
    admitted = await asyncio.wait_for(waiting, timeout=10)
    assert admitted is not None and budget.refused == 0
    refused = asyncio.ensure_future(budget.start(1))
    for r in (held[1], held[2], admitted):
        budget.settle(r, 40, 0)  # spent 130 >= 100
    assert await asyncio.wait_for(refused, timeout=10) is None
    assert budget.exhausted and budget.refused == 1 and budget.spent_tokens == 130
    with pytest.raises(ValueError, match="already settled"):
        budget.settle(admitted, 1, 1)


def test_unknown_model_under_a_cost_cap_fails_at_construction(fake: FakeProvider) -> None:
    with pytest.raises(ValueError, match=r"'mystery-judge-7'.*GRADEKIT_PRICES"):
        Budget(max_cost_usd=1.0, model="mystery-judge-7")
    with pytest.raises(ValueError, match=r"no price for judge model 'mystery-judge-7'.*`prices` FILE.*`max_tokens`"):
        Judge("mystery-judge-7", base_url=fake.base_url, api_key="k", budget=Budget(max_cost_usd=1.0))
    Budget(max_tokens=10, model="mystery-judge-7")  # a token cap needs no price


async def test_a_token_cap_on_an_unpriced_model_counts_tokens_but_not_dollars(billed: FakeProvider, make_judge) -> None:
    cap = Budget(max_tokens=10_000)
    verdict = await make_judge(budget=cap).judge(RUBRIC, row(1))
    assert verdict.ok and cap.spent_tokens == TOKENS and cap.spent_usd is None


def test_price_file_overrides_and_extends_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_prices()
    maintained = price_of(defaults, "gpt-4o-mini")  # genai-prices' bundled data: OpenAI's list price
    assert maintained is not None and (maintained.input, maintained.output, maintained.cached_input) == (0.15, 0.60, 0.075)
    mine = tmp_path / "prices.yaml"
    mine.write_text("my-judge: {input: 0.5, output: 1.5}\ngpt-4o-mini: {input: 0.2, output: 0.8}\n", encoding="utf-8")
    prices = load_prices(mine)
    assert prices["my-judge"] == ModelPrice(input=0.5, output=1.5)
    assert prices["gpt-4o-mini"] == ModelPrice(input=0.2, output=0.8)
    assert prices["qwen-plus"] == defaults["qwen-plus"], "entries the file does not name keep their defaults"
    assert price_of(prices, "gpt-4o") == price_of(defaults, "gpt-4o"), "models the file does not name keep their maintained price"
    env = tmp_path / "prices.json"
    env.write_text(json.dumps({"My-Judge": {"input": 9, "output": 9}, "team-judge": {"input": 1, "output": 2}}), encoding="utf-8")
    monkeypatch.setenv("GRADEKIT_PRICES", str(env))
    assert load_prices()["my-judge"] == ModelPrice(input=9, output=9)
    both = load_prices(mine)
    assert both["my-judge"] == ModelPrice(input=0.5, output=1.5), "an explicit file wins over $GRADEKIT_PRICES"
    assert both["team-judge"] == ModelPrice(input=1, output=2)
    assert Budget(max_cost_usd=1.0, model="team-judge").prices["team-judge"].output == 2


@pytest.mark.parametrize(("content", "problem"), [
    pytest.param("my-judge: {input: 0.5}\n", r"model 'my-judge': output: Field required", id="missing_output"),
    pytest.param("my-judge: {input: -1, output: 1}\n", r"model 'my-judge': input: .*greater than or equal to 0", id="negative"),
    pytest.param("- my-judge\n", r"maps model names", id="not_a_mapping"),
    pytest.param("my-judge: {input: [\n", r"not valid YAML", id="broken_yaml"),
])
def test_a_bad_price_file_names_the_file_and_the_entry(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=problem) as caught:
        load_prices(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(("model", "base"), [
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
    ("gpt-4o-2024-08-06", "gpt-4o"),
    ("gpt-4.1-nano-2025-04-14", "gpt-4.1-nano"),
    ("o3-2025-04-16", "o3"),
    ("GPT-5-mini-2025-08-07", "gpt-5-mini"),
    ("gpt-5", "gpt-5"),
])
def test_a_dated_snapshot_is_priced_as_its_base_model(model: str, base: str) -> None:
    prices = load_prices()
    assert price_of(prices, model) == price_of(prices, base) is not None
    expected = price_of(prices, base).input + price_of(prices, base).output
    assert cost_usd(prices, model, 1_000_000, 1_000_000) == pytest.approx(expected)


@pytest.mark.parametrize("model", ["my-judge-search-preview", "gpt-4o-minimal", "my-model-2024-07-18"])
def test_only_a_date_suffix_is_stripped(model: str) -> None:
    assert price_of(load_prices(), model) is None
    with pytest.raises(ValueError, match="no price"):
        cost_usd(load_prices(), model, 1, 1)


def test_a_cap_is_reached_exactly_not_a_float_rounding_later() -> None:
    budget = Budget(max_cost_usd=0.8, model="m", prices={"m": {"input": 1.0, "output": 1.0}})
    for tokens in (700_000, 100_000):  # $0.7 + $0.1: in floats 0.7999999999999999, under the cap
        reservation = budget.try_start(0)
        assert reservation is not None
        budget.settle(reservation, tokens, 0)
    assert budget.exhausted and budget.try_start(0) is None
    assert budget.spent_usd == pytest.approx(0.8)


def test_grade_frame_under_a_budget_keeps_every_row(billed: FakeProvider) -> None:
    import pandas as pd

    from gradekit.graders import grade_frame, llm_grader
    from gradekit.graders.runs._frame import _shared_runner

    judge = Judge("fake-judge", base_url=billed.base_url, api_key="k", budget=Budget(max_tokens=2 * TOKENS))
    df = pd.DataFrame({"question": [f"q{i}?" for i in range(5)], "response": ["Paris"] * 5, "references": ["Paris"] * 5})
    try:
        out = grade_frame(df, llm_grader(judge, "semantic_equivalence_en"), concurrency=1)
    finally:
        _shared_runner().run(judge.aclose())
    assert len(out) == 5 and out["score"].tolist()[:2] == [1.0, 1.0]
    assert out["error_kind"].tolist()[2:] == ["budget"] * 3 and out["score"].isna().tolist()[2:] == [True] * 3
    assert all(e.endswith("budget reached: spent 2200 of 2200 tokens (max tokens)") for e in out["error"].tolist()[2:])
    assert len(billed.chat_requests()) == 2


def test_cli_budget_skips_then_a_larger_cap_finishes_from_the_cache(tmp_path) -> None:
    """gradekit grade --max-cost: skipped rows, what was spent; the same command with more money grades the rest."""
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}", "references": ["a"], "prediction": f"p{i}"}) + "\n" for i in range(12)))
    prices = tmp_path / "prices.yaml"
    prices.write_text("judge-x: {input: 1000, output: 1000}\n")  # $0.001 a token: each reply here costs cents
    with FakeProvider(script=[Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}),
                                    usage={"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100})] * 12) as fake:
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(tmp_path / "c.sqlite3")}
        args = ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(output), "--model", "judge-x", "--prices", str(prices),
                "--concurrency", "1", "--json"]
        capped = CliRunner().invoke(app, [*args, "--max-cost", "0.4"], env=env)
        summary = json.loads(capped.output)
        assert capped.exit_code == 1 and len(fake.chat_requests()) == 4  # 4 x $0.1 reaches $0.4
        assert (summary["ok"], summary["skipped"], summary["errors"]) == (4, 8, 0)
        assert abs(summary["cost_usd"] - 0.4) < 1e-9 and "spent $0.4000 of $0.4" in summary["budget"]
        rows = [json.loads(line) for line in output.read_text().splitlines()]
        assert [r["status"] for r in rows] == ["ok"] * 4 + ["skipped"] * 8  # first come, first served
        assert all(r["error_kind"] == "budget" and r["score"] is None for r in rows if r["status"] == "skipped")
        more = CliRunner().invoke(app, [*args, "--max-cost", "5"], env=env)
        summary = json.loads(more.output)
        assert more.exit_code == 0 and len(fake.chat_requests()) == 12  # only the 8 skipped rows were sent
        assert summary["cache_hits"] == 4 and summary["saved_tokens"] == 400 and abs(summary["saved_usd"] - 0.4) < 1e-9


async def test_a_cancelled_waiter_does_not_block_the_queue() -> None:
    """Requests waiting for room are served first come, first served; one cancelled meanwhile gives up its place."""
    budget = Budget(max_tokens=10)
    first = await budget.start(10, model="gpt-4o-mini")  # all 10 reserved: the next two must wait
    order: list[str] = []

    async def wait(name: str) -> None:
        reservation = await budget.start(3, model="gpt-4o-mini")
        order.append(name)
        budget.settle(reservation, 1, 0)

    cancelled = asyncio.create_task(wait("cancelled"))
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    cancelled.cancel()
    budget.settle(first, 2, 0)  # spent 2: room again
    await asyncio.wait_for(second, 5)
    assert order == ["second"] and cancelled.cancelled()
