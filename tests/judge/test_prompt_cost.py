"""The cost of a judgement (issue 45): the provider's prompt cache, the flex tier and the native APIs, against
the loopback fake provider playing each provider's caching and billing model (judge.testing._fake_billing).

What gradekit reports is compared with what the fake billed, writes included.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.judge import Budget, Judge, Limiter, list_rubrics, load_prices, load_rubric
from gradekit.judge._budget import price_of
from gradekit.judge.testing import FakeProvider, Reply, write_long_rubric

from ..cases import cases

ROW = {"question": "What is the capital of France?", "references": ["Paris"], "prediction": "Paris"}
# The fake bills these for every model (USD per 1M tokens); the --prices file gradekit is given says the same,
# with the write and read multipliers the provider documents (1.25x, 0.1x).
FAKE_PRICES = {"input": 3.0, "output": 15.0}
PRICE_FILE = {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75, "tiers": {"flex": {
    "input": 1.5, "output": 7.5, "cached_input": 0.15, "cache_write": 1.875}}}


def rows(n: int) -> list[dict]:
    return [{"question": f"question {i}: what is {i} + {i}?", "references": [str(2 * i)], "prediction": str(2 * i)} for i in range(n)]


def gradekit(*args: str, env: dict[str, str]) -> dict:
    """``python -m gradekit ARGS --json`` in a subprocess: its summary."""
    environment = {k: v for k, v in os.environ.items() if k not in ("GRADEKIT_PRICES", "OPENAI_BASE_URL")}
    done = subprocess.run([sys.executable, "-m", "gradekit", *args, "--json"], capture_output=True, text=True, timeout=240,
                          env={**environment, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def grade(tmp_path: Path, fake: FakeProvider, model: str, n: int, *extra: str, name: str = "run") -> dict:
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows(n)))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({model: PRICE_FILE}))
    spec = write_long_rubric(tmp_path / "rubric", 2000)
    return gradekit("grade", str(source), "-r", str(spec), "-o", str(tmp_path / f"{name}.out.jsonl"), "--model", model,
                    "--base-url", fake.base_url, "--api-key", "k", "--prices", str(prices), "--no-cache", *extra,
                    env={})


# ---- the layout: everything the rows share comes first -------------------------------------------------------


@pytest.mark.parametrize("rubric", [pytest.param(r, id=r.name) for r in list_rubrics()])
def test_two_rows_share_a_prefix_that_covers_the_static_part_in_every_mode(rubric) -> None:
    """The system block (instructions, criteria, examples) comes before anything a row fills, in every ask mode."""
    for mode in rubric.ask_modes:
        first, second = (rubric.render(_row_for(rubric, i), mode) for i in (1, 2))
        a, b = json.dumps(first), json.dumps(second)
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        system = json.dumps(first[:1])[:-2] if first[0]["role"] == "system" else ""
        assert first[0]["role"] == "system", f"{rubric.name}: no system block to cache"
        assert shared >= len(system), f"{rubric.name} ({mode}): the rows differ before the end of the system block"


def _row_for(rubric, i: int) -> dict:
    values: dict = {}
    for name, spec in rubric.variables.items():
        if spec.type == "list":
            values[name] = [f"gold {i}"]
        elif spec.type == "criteria":
            values[name] = [f"The response answers in English ({i})."]
        elif spec.type == "media":
            continue
        elif spec.type == "trajectory":
            values[name] = [{"role": "user", "content": f"task {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        else:
            values[name] = f"value {i} of {name}"
    return values


# ---- OpenAI's caching model: one write per prefix, cost equal to the bill ------------------------------------


def test_openai_cache_cost_reported_equals_billed_and_one_write_per_prefix(tmp_path: Path) -> None:
    """--concurrency 64 over a 2,000-token rubric: warming sends one write, every other request reads; the cost
    gradekit reports (writes included) is what the fake billed."""
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES) as fake:
        summary = grade(tmp_path, fake, "gpt-4.1", 200, "--concurrency", "64")  # no learning gate holds its first wave
        assert summary["ok"] == 200
        assert fake.billing.cache_writes == 1, "one cache write for the one prefix, not one per request of the first wave"
        assert summary["cost_usd"] == pytest.approx(fake.billing.billed_usd, rel=1e-9, abs=1e-12)
        assert summary["cache_write_tokens"] == sum(c.cache_write_tokens for c in fake.billing.charges) > 1000
        assert summary["cached_tokens"] == sum(c.cached_tokens for c in fake.billing.charges)
        assert summary["cache_hit_ratio"] > 0.8 and summary["cache_saved_usd"] > 0
        assert {r.body.get("prompt_cache_key") for r in fake.chat_requests()} == {None}, "sent only where documented"


async def test_without_warming_the_first_wave_writes_once_per_request() -> None:
    """The baseline warming fixes: 64 requests sent together with one cold prefix each miss and each pay the write."""
    spec = write_long_rubric(Path(os.environ.get("TMPDIR", "/tmp")) / f"gk-warm-{os.getpid()}", 2000)
    rubric = load_rubric(spec)
    wave = Wave(64)  # no request is answered before all 64 have arrived: however loaded the machine, they all miss
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES, responder=wave) as fake:
        cold = Judge("gpt-4.1", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=64), warm=False)
        await asyncio.gather(*(cold.judge(rubric, r) for r in rows(64)))
        assert fake.billing.cache_writes == 64
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES, latency=0.05) as fake:
        warm = Judge("gpt-4.1", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=64), prompt_cache_key=True)
        verdicts = await asyncio.gather(*(warm.judge(rubric, r) for r in rows(64)))
        assert all(v.ok for v in verdicts) and fake.billing.cache_writes == 1
        keys = {r.body["prompt_cache_key"] for r in fake.chat_requests()}
        assert len(keys) == 1 and keys.pop().startswith("gradekit-")


class Wave:
    """A responder that answers nothing until ``size`` requests have arrived (at most 60 s), then answers as the fake would."""

    def __init__(self, size: int) -> None:
        self.size, self.arrived, self.all_in = size, 0, None

    async def __call__(self, body: dict) -> None:
        if self.all_in is None:
            self.all_in = asyncio.Event()  # on the fake's own loop
        self.arrived += 1
        if self.arrived >= self.size:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 60)
        return None


async def test_two_prefixes_are_warmed_once_each_and_a_short_one_not_at_all(tmp_path: Path) -> None:
    long_a = load_rubric(write_long_rubric(tmp_path / "a", 2000, name="rubric_a"))
    long_b = load_rubric(write_long_rubric(tmp_path / "b", 2400, name="rubric_b"))
    short = load_rubric("correctness_3way")  # about 300 tokens: below OpenAI's 1,024-token minimum
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES, latency=0.02) as fake:
        judge = Judge("gpt-4.1", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=32))
        work = [judge.judge(r, row) for row in rows(20) for r in (long_a, long_b, short)]
        verdicts = await asyncio.gather(*work)
        assert all(v.ok for v in verdicts)
        assert fake.billing.cache_writes == 2 and judge.warmer.warmed == 2


# ---- Anthropic: native Messages API vs its OpenAI-compatible endpoint -----------------------------------------


def test_claude_native_costs_at_most_a_third_of_the_compatible_endpoint(tmp_path: Path) -> None:
    """1,000 rows, 2,000-token rubric, --concurrency 64: api anthropic (cache_control breakpoint, output_config.format)
    against Anthropic's OpenAI-compatible endpoint (no cache, response_format ignored); each figure is the bill."""
    with FakeProvider(dialect="anthropic", cache_model="anthropic", prices=FAKE_PRICES) as native:
        ours = grade(tmp_path, native, "claude-sonnet-4-5", 1000, "--concurrency", "64", "--api", "anthropic", name="native")
        bodies = [r.body for r in native.requests if r.path.endswith("/messages")]
        assert len(bodies) == 1000 and all("response_format" not in b for b in bodies)
        assert bodies[0]["output_config"]["format"]["type"] == "json_schema"
        assert bodies[0]["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert native.billing.cache_writes == 1
        assert ours["cost_usd"] == pytest.approx(native.billing.billed_usd, rel=1e-9)
    with FakeProvider(dialect="anthropic", cache_model="none", prices=FAKE_PRICES) as compatible:
        theirs = grade(tmp_path, compatible, "claude-sonnet-4-5", 1000, "--concurrency", "64", "--api", "chat", name="compatible")
        assert theirs["cost_usd"] == pytest.approx(compatible.billing.billed_usd, rel=1e-9)
    assert ours["ok"] == theirs["ok"] == 1000 and ours["label_counts"] == {"CORRECT": 1000}
    assert ours["cost_usd"] <= 0.35 * theirs["cost_usd"], (ours["cost_usd"], theirs["cost_usd"])


async def test_anthropic_thinking_stays_out_of_the_verdict_and_errors_keep_their_kinds(tmp_path: Path) -> None:
    rubric = load_rubric("correctness_3way")
    with FakeProvider(script=[Reply(status=529, error_message="Overloaded"), Reply(status=529, error_message="Overloaded")]) as fake:
        judge = Judge("claude-sonnet-4-5", base_url=fake.base_url, api_key="k", api="anthropic", params={
            "thinking": {"type": "enabled", "budget_tokens": 1024}}, sleep=_no_wait)
        verdict = await judge.judge(rubric, ROW)
        assert verdict.ok and verdict.label == "CORRECT" and verdict.usage.requests == 3  # two 529s retried
        assert verdict.reasoning and verdict.reasoning not in (verdict.raw or "")  # the thinking block, kept out of the verdict
        sent = [r for r in fake.requests if r.path.endswith("/messages")][-1]
        assert sent.headers["x-api-key"] == "k" and "authorization" not in sent.headers
        assert sent.headers["anthropic-version"] == "2023-06-01"
        fake.push(Reply(status=400, error_message="messages.0.content.0.text: text content blocks must be non-empty"))
        refused = await judge.judge(rubric, {**ROW, "prediction": "Lyon"})
        assert (refused.status, refused.error_kind) == ("error", "bad_request") and "must be non-empty" in refused.error


async def _no_wait(seconds: float) -> None:
    return None


# ---- the Responses API ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", [pytest.param("responses", id="told"), pytest.param(None, id="learnt")])
async def test_a_responses_only_model_is_judged_with_structured_verdicts(api: str | None) -> None:
    rubric = load_rubric("correctness_3way")
    with FakeProvider(responses_only=["o1-pro"]) as fake:
        judge = Judge("o1-pro", base_url=fake.base_url, api_key="k", api=api, params={"reasoning_effort": "low"})
        verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(6)))
        assert [v.label for v in verdicts] == ["CORRECT"] * 6 and all(v.read.mode == "json_schema" for v in verdicts)
        bodies = [r.body for r in fake.requests if r.path.endswith("/responses")]
        assert len(bodies) == 6 and all(b["text"]["format"]["type"] == "json_schema" and b["store"] is False
                                        and "previous_response_id" not in b for b in bodies)
        assert all(v.reasoning for v in verdicts), "the reasoning item is the verdict's reasoning"
        assert len(fake.chat_requests()) == (0 if api else 1), "learnt from one 404, then every row goes to /responses"


# ---- flex --------------------------------------------------------------------------------------------------------


async def test_a_flex_capacity_429_does_not_slow_the_pacer_and_a_late_row_goes_standard() -> None:
    rubric = load_rubric("correctness_3way")
    with FakeProvider(flex_full=True, prices=FAKE_PRICES) as fake:
        judge = Judge("gpt-5-mini", base_url=fake.base_url, api_key="k", service_tier="flex", flex_deadline_s=0,
                      limiter=Limiter(concurrency=4), sleep=_no_wait)
        verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(8)))
        assert all(v.ok for v in verdicts) and fake.flex_refused == 8
        assert judge.pacing().rps is None, "no capacity is not a rate limit: the pacer was not slowed"
        assert judge.endpoints[0].rate_limited == 0 and judge.flex_fallbacks == 8
        tiers = [r.body.get("service_tier") for r in fake.chat_requests()]
        assert tiers.count("flex") == 8 and tiers.count(None) == 8
    with FakeProvider(rate_limit_rps=1, rate_limit_burst=1, prices=FAKE_PRICES) as limited:  # the control: a real 429
        judge = Judge("gpt-5-mini", base_url=limited.base_url, api_key="k", limiter=Limiter(concurrency=4), sleep=_no_wait)
        await asyncio.gather(*(judge.judge(rubric, r) for r in rows(4)))
        assert judge.pacing().rps is not None


async def test_flex_waits_for_capacity_until_its_deadline() -> None:
    rubric = load_rubric("correctness_3way")
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    with FakeProvider(flex_refusals=2) as fake:
        judge = Judge("gpt-5-mini", base_url=fake.base_url, api_key="k", service_tier="flex", flex_deadline_s=3600, sleep=record)
        verdict = await judge.judge(rubric, ROW)
        assert verdict.ok and verdict.usage.flex_prompt_tokens == verdict.usage.prompt_tokens > 0
        assert waits == [1.0, 2.0] and judge.flex_fallbacks == 0


def test_the_summary_splits_cost_by_tier(tmp_path: Path) -> None:
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES, flex_refusals=5) as fake:
        summary = grade(tmp_path, fake, "gpt-5.6", 40, "--concurrency", "1", "--service-tier", "flex", "--flex-deadline", "0")
        billed = fake.billing.billed_by_tier()
        assert set(summary["cost_by_tier"]) == {"standard", "flex"}
        assert summary["cost_by_tier"]["flex"] == pytest.approx(billed["flex"], rel=1e-9)
        assert summary["cost_by_tier"]["standard"] == pytest.approx(billed["default"], rel=1e-9)
        assert summary["cost_usd"] == pytest.approx(fake.billing.billed_usd, rel=1e-9)
        assert summary["flex_usage"]["prompt_tokens"] > 0


# ---- prices: the judges people use --------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "base_url"), cases("priced_models"))
def test_max_cost_works_for_the_major_providers_models(model: str, base_url: str | None) -> None:
    budget = Budget(max_cost_usd=1.0, model=model)  # refused before this issue for all but 10 OpenAI models
    price = price_of(budget.prices, model, base_url=base_url)
    assert price is not None and price.input > 0 and price.output > 0
    if price.cached_input is not None:
        assert price.cached_input < price.input


def test_cache_writes_and_reads_are_priced_as_the_provider_prices_them() -> None:
    prices = load_prices()
    claude = price_of(prices, "claude-sonnet-4-5")
    assert claude.cache_write == pytest.approx(1.25 * claude.input) and claude.cached_input == pytest.approx(0.1 * claude.input)
    gpt = price_of(prices, "gpt-5.6")
    assert gpt.cache_write == pytest.approx(1.25 * gpt.input) and gpt.at("flex").input == pytest.approx(gpt.input / 2)


async def test_max_cost_counts_cache_writes() -> None:
    """A cap that plain input would fit is reached once the writes are counted at 1.25x."""
    spec = write_long_rubric(Path(os.environ.get("TMPDIR", "/tmp")) / f"gk-cap-{os.getpid()}", 2000)
    rubric = load_rubric(spec)
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES) as fake:
        budget = Budget(max_cost_usd=1.0, prices={"gpt-5.6": PRICE_FILE})
        judge = Judge("gpt-5.6", base_url=fake.base_url, api_key="k", budget=budget, limiter=Limiter(concurrency=1))
        await judge.judge(rubric, ROW)
        assert budget.spent_usd == pytest.approx(fake.billing.billed_usd, rel=1e-9)
        charge = fake.billing.charges[0]
        assert charge.cache_write_tokens > 1000
        assert budget.spent_usd > (charge.prompt_tokens * 3.0 + charge.completion_tokens * 15.0) / 1e6  # above plain input


# ---- explicit breakpoints -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("base_url", "model", "marker"), [
    pytest.param("https://api.openai.com/v1", "gpt-5.6", ("prompt_cache_breakpoint", {"mode": "explicit"}), id="gpt-5.6"),
    pytest.param("https://api.openai.com/v1", "gpt-5.6-mini-2026-09-01", ("prompt_cache_breakpoint", {"mode": "explicit"}), id="gpt-5.6-snapshot"),
    pytest.param("https://api.openai.com/v1", "gpt-5.5", None, id="gpt-5.5-implicit"),
    pytest.param("https://api.openai.com/v1", "gpt-4o-mini", None, id="gpt-4o-mini"),
    pytest.param("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "qwen-plus", ("cache_control", {"type": "ephemeral"}), id="dashscope"),
    pytest.param("http://localhost:8000/v1", "my-vllm-model", None, id="vllm"),
])
def test_the_breakpoint_each_endpoint_wants(base_url: str, model: str, marker) -> None:
    from gradekit.judge._warm import breakpoint_marker

    assert breakpoint_marker(base_url, model) == marker


async def test_a_breakpoint_the_endpoint_refuses_is_learnt_once_and_never_sent_again(tmp_path: Path) -> None:
    rubric = load_rubric(write_long_rubric(tmp_path, 2000))
    refused = []

    def responder(body: dict):
        system = body["messages"][0]["content"]
        if isinstance(system, list) and "prompt_cache_breakpoint" in system[-1]:
            refused.append(body)
            return Reply(status=400, error_message="Unrecognized request argument supplied: messages[0].content[0].prompt_cache_breakpoint")
        return None

    with FakeProvider(cache_model="openai", prices=FAKE_PRICES, responder=responder) as fake:
        judge = Judge("gpt-5.6", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=8))
        verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(8)))
        assert all(v.ok for v in verdicts) and len(refused) == 1, "one 400 teaches it (the first request of a careful model goes alone)"
        assert "prompt_cache_breakpoint" in judge.dialect.drop
        later = [r.body for r in fake.chat_requests()][1:]
        assert all(isinstance(b["messages"][0]["content"], list) is False or "prompt_cache_breakpoint" not in b["messages"][0]["content"][-1]
                   for b in later)


async def test_gpt_5_6_marks_the_end_of_the_rubric_and_reads_it_back(tmp_path: Path) -> None:
    rubric = load_rubric(write_long_rubric(tmp_path, 2000))
    with FakeProvider(cache_model="openai", prices=FAKE_PRICES) as fake:
        judge = Judge("gpt-5.6", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=16))
        verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(16)))
        assert all(v.label == "CORRECT" for v in verdicts)
        system = fake.chat_requests()[0].body["messages"][0]["content"]
        assert system[-1]["prompt_cache_breakpoint"] == {"mode": "explicit"} and system[-1]["text"].startswith("Weigh")
        assert fake.billing.cache_writes == 1 and sum(v.usage.cached_tokens for v in verdicts) > 15 * 2000


# ---- the native transports' translation, both ways ----------------------------------------------------------------

TOOL_REQUEST = {"model": "m", "temperature": 0.0, "max_tokens": 50, "stop": "\n\n", "messages": [
    {"role": "system", "content": "Judge."}, {"role": "user", "content": [
        {"type": "text", "text": "Row"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
    "tools": [{"type": "function", "function": {"name": "submit_verdict", "description": "Record the verdict.",
                                                 "parameters": {"type": "object", "properties": {"grade": {"type": "string"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "submit_verdict"}}}


def test_a_chat_request_as_the_messages_api_asks_it() -> None:
    from gradekit.judge._native import anthropic_body

    body = anthropic_body({**TOOL_REQUEST, "logprobs": True, "prompt_cache_key": "k", "thinking": {"type": "enabled"}})
    assert body["system"] == [{"type": "text", "text": "Judge.", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Row"}, {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]
    assert body["tools"][0]["input_schema"]["properties"] == {"grade": {"type": "string"}}
    assert body["tool_choice"] == {"type": "tool", "name": "submit_verdict"} and body["max_tokens"] == 50
    assert body["stop_sequences"] == ["\n\n"] and body["thinking"] == {"type": "enabled"}
    assert not {"logprobs", "prompt_cache_key", "stop", "response_format"} & set(body)


def test_a_chat_request_as_the_responses_api_asks_it() -> None:
    from gradekit.judge._native import responses_body

    body = responses_body({**TOOL_REQUEST, "reasoning_effort": "low", "prompt_cache_key": "k", "service_tier": "flex",
                           "response_format": {"type": "json_object"}})
    assert body["input"][1]["content"] == [{"type": "input_text", "text": "Row"},
                                           {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]
    assert body["tools"][0]["name"] == "submit_verdict" and body["tool_choice"] == {"type": "function", "name": "submit_verdict"}
    assert body["reasoning"] == {"effort": "low"} and body["max_output_tokens"] == 50 and body["store"] is False
    assert body["text"] == {"format": {"type": "json_object"}} and body["prompt_cache_key"] == "k" and body["service_tier"] == "flex"
    assert not {"messages", "max_tokens", "tool_choice_function", "previous_response_id"} & set(body)


@pytest.mark.parametrize(("message", "content", "tool", "reasoning", "finish", "usage"), [
    pytest.param({"content": [{"type": "thinking", "thinking": "draft: INCORRECT"}, {"type": "text", "text": '{"grade": "CORRECT"}'}],
                  "stop_reason": "end_turn", "usage": {"input_tokens": 10, "cache_creation_input_tokens": 2000,
                                                       "cache_read_input_tokens": 0, "output_tokens": 7}},
                 '{"grade": "CORRECT"}', None, "draft: INCORRECT", "stop", (2010, 0, 2000), id="thinking-then-text-write"),
    pytest.param({"content": [{"type": "tool_use", "id": "t1", "name": "submit_verdict", "input": {"grade": "CORRECT"}}],
                  "stop_reason": "tool_use", "usage": {"input_tokens": 10, "cache_read_input_tokens": 2000, "output_tokens": 7}},
                 None, '{"grade": "CORRECT"}', None, "tool_calls", (2010, 2000, 0), id="tool-use-read"),
    pytest.param({"content": [{"type": "text", "text": '{"grade": "COR'}], "stop_reason": "max_tokens", "usage": {}},
                 '{"grade": "COR', None, None, "length", (0, 0, 0), id="cut-off"),
    pytest.param({"content": [], "stop_reason": "refusal", "usage": {"input_tokens": 5, "output_tokens": 0}},
                 None, None, None, "content_filter", (5, 0, 0), id="refusal"),
])
def test_a_messages_api_reply_as_a_chat_completion(message, content, tool, reasoning, finish, usage) -> None:
    from gradekit.judge._native import anthropic_completion

    completion = anthropic_completion({"id": "msg", "model": "claude", **message})
    reply, choice = completion["choices"][0]["message"], completion["choices"][0]
    assert reply["content"] == content and reply.get("reasoning_content") == reasoning and choice["finish_reason"] == finish
    assert (json.loads(reply["tool_calls"][0]["function"]["arguments"]) if tool else None) == (json.loads(tool) if tool else None)
    spent = completion["usage"]
    assert (spent["prompt_tokens"], spent["prompt_tokens_details"]["cached_tokens"], spent["prompt_tokens_details"]["cache_write_tokens"]) == usage


@pytest.mark.parametrize(("response", "content", "tool", "reasoning", "finish"), [
    pytest.param({"status": "completed", "output": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "message", "content": [{"type": "output_text", "text": '{"grade": "CORRECT"}'}]}]},
        '{"grade": "CORRECT"}', None, "thinking", "stop", id="reasoning-then-message"),
    pytest.param({"status": "completed", "output": [{"type": "function_call", "call_id": "c1", "name": "submit_verdict",
                                                     "arguments": '{"grade": "CORRECT"}'}]},
                 None, '{"grade": "CORRECT"}', None, "tool_calls", id="function-call"),
    pytest.param({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": [
        {"type": "reasoning", "summary": []}]}, None, None, None, "length", id="cut-off-while-reasoning"),
    pytest.param({"status": "completed", "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "no"}]}]},
                 None, None, None, "stop", id="refusal"),
])
def test_a_responses_api_reply_as_a_chat_completion(response, content, tool, reasoning, finish) -> None:
    from gradekit.judge._native import responses_completion

    completion = responses_completion({"id": "resp", "model": "o1-pro", "usage": {"input_tokens": 9, "output_tokens": 3,
                                                                                  "input_tokens_details": {"cached_tokens": 4}}, **response})
    reply, choice = completion["choices"][0]["message"], completion["choices"][0]
    assert reply["content"] == content and reply.get("reasoning_content") == reasoning and choice["finish_reason"] == finish
    assert (reply["tool_calls"][0]["function"]["arguments"] if tool else None) == tool
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == 4


async def test_a_claude_model_without_structured_outputs_is_asked_with_a_forced_tool() -> None:
    rubric = load_rubric("correctness_3way")

    def responder(body: dict):  # the fake hands responders the chat body a Messages request asks the same of
        if body.get("response_format"):
            return Reply(status=400, error_message="output_config.format: structured outputs are not supported for this model")
        return None

    with FakeProvider(responder=responder) as fake:
        judge = Judge("claude-3-5-haiku-latest", base_url=fake.base_url, api_key="k", api="anthropic")
        verdicts = [await judge.judge(rubric, r) for r in rows(3)]
        assert [(v.label, v.read.mode) for v in verdicts] == [("CORRECT", "tool")] * 3
        sent = [r.body for r in fake.requests if r.path.endswith("/messages")]
        assert "output_config" in sent[0] and all(b["tool_choice"] == {"type": "tool", "name": "submit_verdict"} for b in sent[1:])
        assert len(sent) == 4, "the refused mode is learnt once for the endpoint"


def test_writes_never_read_back_are_a_warning_and_a_negative_saving() -> None:
    from gradekit.graders.runs import RunSummary
    from gradekit.graders.runs._record import add_money
    from gradekit.judge import Usage

    summary = RunSummary(results={"rows": 10, "ok": 10},
                         stats={"usage": Usage(prompt_tokens=25_000, completion_tokens=100, cache_write_tokens=20_000)})
    add_money(summary, Budget(prices={"my-judge": PRICE_FILE}), "my-judge")
    assert summary.stats.money.cache_saved_usd == pytest.approx(-20_000 * (3.75 - 3.0) / 1e6)
    assert summary.stats.money.cost_usd == pytest.approx((5_000 * 3.0 + 20_000 * 3.75 + 100 * 15.0) / 1e6)
    assert any("never" not in w and "none was read back" in w for w in summary.warnings)


# ---- the native transports ride the same fleet, limiter and retries -----------------------------------------------------


async def test_anthropic_rate_limits_pace_the_limiter_through_its_own_headers() -> None:
    rubric = load_rubric("correctness_3way")
    with FakeProvider(dialect="anthropic", rate_limit_rps=20, rate_limit_burst=2) as fake:
        judge = Judge("claude-sonnet-4-5", base_url=fake.base_url, api_key="k", api="anthropic", limiter=Limiter(concurrency=8))
        verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(24)))
        assert all(v.ok for v in verdicts)
        assert judge.pacing().mode == "headers", "anthropic-ratelimit-* headers on the Messages API pace the limiter"
        replies = [r for r in fake.requests if r.path.endswith("/messages")]
        assert len(replies) == 24 + fake.rate_limited


async def test_a_native_fleet_fails_over_from_a_dead_endpoint() -> None:
    from gradekit.judge.testing import DownJudge

    rubric = load_rubric("correctness_3way")
    down = DownJudge()
    try:
        with FakeProvider() as fake:
            judge = Judge("o1-pro", base_url=[down.base_url, fake.base_url], api_key="k", api="responses", hedge=False)
            verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(8)))
            assert [v.label for v in verdicts] == ["CORRECT"] * 8
            assert len([r for r in fake.requests if r.path.endswith("/responses")]) == 8 and down.accepted >= 1
    finally:
        down.close()


async def test_a_failing_warm_up_releases_the_wave_at_once(tmp_path: Path) -> None:
    """The first request of a cold prefix fails for good (a 400): the others are not held behind one failing request after another."""
    rubric = load_rubric(write_long_rubric(tmp_path, 2000))
    with FakeProvider(cache_model="openai", script=[Reply(status=400, error_message="this row is refused")], latency=0.05) as fake:
        judge = Judge("gpt-4.1", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=16))
        verdicts = await asyncio.gather(*(judge.judge(rubric, r) for r in rows(16)))
        assert sorted(v.status for v in verdicts) == ["error"] + ["ok"] * 15
        assert judge.warmer.warmed == 1, "after the failure the prefix goes unheld: no second warming request"


async def test_an_endpoint_that_refuses_prompt_cache_key_is_learnt_once() -> None:
    rubric = load_rubric("correctness_3way")
    refused = []

    def responder(body: dict):
        if "prompt_cache_key" in body:
            refused.append(body)
            return Reply(status=400, error_message="Unrecognized request argument supplied: prompt_cache_key")
        return None

    with FakeProvider(responder=responder) as fake:
        judge = Judge("gpt-4.1", base_url=fake.base_url, api_key="k", prompt_cache_key=True, limiter=Limiter(concurrency=1))
        verdicts = [await judge.judge(rubric, r) for r in rows(4)]
        assert all(v.label == "CORRECT" for v in verdicts) and len(refused) == 1
        assert "prompt_cache_key" in judge.dialect.drop and len(fake.chat_requests()) == 5


@pytest.mark.parametrize("api", ["anthropic", "responses"])
async def test_a_native_request_that_never_answers_is_a_timeout(api: str) -> None:
    from gradekit.judge import RetryPolicy

    rubric = load_rubric("correctness_3way")
    with FakeProvider(script=[Reply(content="{}", delay=30)]) as fake:
        judge = Judge("claude-sonnet-4-5" if api == "anthropic" else "o1-pro", base_url=fake.base_url, api_key="k", api=api,
                      timeout=0.5, retry=RetryPolicy(max_attempts=1))
        verdict = await judge.judge(rubric, ROW)
        assert (verdict.status, verdict.error_kind) == ("error", "timeout")
        assert ("/messages" if api == "anthropic" else "/responses") in verdict.error
