"""The judge client over real HTTP against the loopback fake provider: faults, retries, fallback, cache, limits."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gradekit.judge import Judge, JudgeCache, Limiter, RetryPolicy, load_rubric
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import reference_judge, verdict_json

ZH = load_rubric("semantic_equivalence_zh")
TONE = load_rubric("tone")
ROW = {"question": "《红楼梦》的作者是谁？", "references": ["曹雪芹"], "prediction": "曹雪芹"}


async def test_ok_verdict_carries_label_score_usage(fake, make_judge) -> None:
    fake.push(verdict_json("正确", "两者一致"))
    verdict = await make_judge().judge(ZH, ROW)
    assert (verdict.status, verdict.label, verdict.score, verdict.rationale) == ("ok", "正确", 1.0, "两者一致")
    assert verdict.usage.requests == 1 and verdict.usage.prompt_tokens > 0 and verdict.usage.completion_tokens > 0
    assert verdict.read.mode == "json_schema" and not verdict.cached
    sent = fake.chat_requests()[0].body
    assert sent["temperature"] == 0 and sent["response_format"]["json_schema"]["strict"] is True


async def test_429_honours_retry_after_then_recovers(fake, make_judge, waits) -> None:
    fake.push(Reply(status=429, headers={"Retry-After": "7"}), Reply(status=429, headers={"retry-after-ms": "1500"}), verdict_json("错误"))
    judge = make_judge()
    verdict = await judge.judge(ZH, ROW)
    assert verdict.ok and verdict.label == "错误" and verdict.usage.requests == 3
    assert waits == [1.5, 7.0] or waits == [7.0, 1.5]
    assert judge.limiter.held_seconds > 0  # the 429 paused every request of the process, not only this one


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_backs_off_with_jitter_and_recovers(fake, make_judge, waits, status) -> None:
    fake.push(Reply(status=status), Reply(status=status), verdict_json("正确"))
    verdict = await make_judge(retry=RetryPolicy(max_attempts=5, initial_wait=0.5, max_wait=8)).judge(ZH, ROW)
    assert verdict.ok and verdict.usage.requests == 3
    assert len(waits) == 2 and all(0 <= w <= 8 for w in waits)


async def test_5xx_forever_is_server_error_never_a_score(fake, make_judge, waits) -> None:
    fake.set_responder(lambda body: Reply(status=503))
    verdict = await make_judge(retry=RetryPolicy(max_attempts=3)).judge(ZH, ROW)
    assert (verdict.status, verdict.error_kind, verdict.score, verdict.usage.requests) == ("error", "server_error", None, 3)


async def test_timeout_is_retried_then_reported(fake, make_judge) -> None:
    # The late answers come after a minute, so they surely time out; the timeout itself is generous
    # enough that the prompt answer in between is not cut off by a loaded machine.
    fake.push(Reply(delay=60, content="late"), verdict_json("正确"))
    assert (await make_judge(timeout=1.5).judge(ZH, ROW)).ok
    fake.set_responder(lambda body: Reply(delay=60, content="late"))
    verdict = await make_judge(timeout=1.5, retry=RetryPolicy(max_attempts=2)).judge(ZH, ROW)
    assert (verdict.error_kind, verdict.usage.requests, verdict.score) == ("timeout", 2, None)


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(Reply(raw_body='{"id": "x", "choices": [{"message": {"content": "{\\"judge'), id="truncated_body"),
        pytest.param(Reply(drop=True), id="dropped_connection"),
        pytest.param(Reply(raw_body='{"id": "x", "object": "chat.completion", "choices": []}'), id="no_choices"),
    ],
)
async def test_malformed_responses_are_retried(fake, make_judge, broken) -> None:
    fake.push(broken, verdict_json("正确"))
    verdict = await make_judge().judge(ZH, ROW)
    assert verdict.ok and verdict.usage.requests == 2


@pytest.mark.parametrize(
    ("status", "hint"),
    [(401, "OPENAI_API_KEY or `api_key`"), (404, "check `model`"), (400, "HTTP 400"), (422, "HTTP 422")],
)
async def test_client_errors_fail_fast_with_a_hint(status, hint) -> None:
    # A plain-text rubric has no fallback chain, so a 4xx is final at once.
    with FakeProvider(script=[Reply(status=status, error_message="nope")]) as fake:
        from gradekit.judge import Judge

        judge = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(), retry=RetryPolicy(max_attempts=5))
        verdict = await judge.judge(TONE, {"response": "hi", "tone": "warm"})
        await judge.aclose()
    assert (verdict.error_kind, verdict.usage.requests) == ("bad_request", 1)
    assert hint in verdict.error and len(fake.chat_requests()) == 1


async def test_unparseable_reply_is_re_asked_then_a_parse_failure(fake, make_judge) -> None:
    fake.push(Reply(content="I think it is right."), verdict_json("正确"))
    verdict = await make_judge().judge(ZH, ROW)
    assert verdict.ok and verdict.usage.requests == 2
    fake.set_responder(lambda body: Reply(content='{"judgement": "maybe"}'))
    verdict = await make_judge(retry=RetryPolicy(parse_retries=2)).judge(ZH, ROW)
    assert (verdict.status, verdict.error_kind, verdict.score, verdict.usage.requests) == ("error", "parse_failure", None, 3)
    assert "maybe" in verdict.raw


async def test_truncated_reply_is_reported_as_truncated_and_not_re_asked(fake, make_judge) -> None:
    # The same token limit cuts the same reply off again: a re-ask would only double the bill.
    fake.set_responder(lambda body: Reply(content='{"rationale": "long', finish_reason="length"))
    verdict = await make_judge(retry=RetryPolicy(parse_retries=1)).judge(ZH, ROW)
    assert (verdict.error_kind, verdict.usage.requests, verdict.score) == ("truncated", 1, None)
    assert "`params.max_completion_tokens`" in verdict.error  # the spec field; the CLI says it as its flag


async def test_refusal_is_not_re_asked(fake, make_judge) -> None:
    fake.push(Reply(refusal="I can't help with that."))
    verdict = await make_judge().judge(ZH, ROW)
    assert (verdict.error_kind, verdict.usage.requests, verdict.score) == ("refusal", 1, None)
    fake.push(Reply(content="", finish_reason="content_filter"))
    assert (await make_judge().judge(ZH, ROW)).error_kind == "refusal"


@pytest.mark.parametrize(
    ("rejects", "reached"),
    [
        ({"reject_json_schema": True}, "tool"),
        ({"reject_json_schema": True, "reject_tools": True}, "json_object"),
        ({"reject_json_schema": True, "reject_tools": True, "reject_json_object": True}, "tags"),
    ],
)
async def test_fallback_chain_reaches_a_working_mode_and_remembers_it(rejects, reached, tmp_path) -> None:
    with FakeProvider(responder=reference_judge, **rejects) as fake:
        from gradekit.judge import Judge

        cache = JudgeCache(tmp_path / "c.sqlite3")
        judge = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(), cache=cache)
        first = await judge.judge(ZH, ROW)
        assert (first.status, first.label, first.read.mode) == ("ok", "正确", reached)
        failed_first = len(fake.chat_requests())
        assert failed_first == len(rejects) + 1
        second = await judge.judge(ZH, {**ROW, "prediction": "高鹗"})
        assert (second.label, second.read.mode) == ("错误", reached)
        assert len(fake.chat_requests()) == failed_first + 1  # straight to the mode that worked
        await judge.aclose()

        # A new process (new Judge, same cache) asks in the remembered mode: a cache hit, zero requests.
        again = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(), cache=cache)
        before = len(fake.chat_requests())
        third = await again.judge(ZH, ROW)
        assert third.cached and third.label == "正确" and len(fake.chat_requests()) == before
        await again.aclose()


async def test_a_400_no_output_format_can_fix_does_not_walk_the_chain(fake, make_judge) -> None:
    fake.set_responder(lambda body: Reply(status=400, error_message="model not supported for this key"))
    verdict = await make_judge().judge(ZH, ROW)
    assert verdict.error_kind == "bad_request" and "model not supported" in verdict.error
    assert len(fake.chat_requests()) == 1


async def test_a_context_length_400_without_a_window_is_context_overflow_after_one_request(fake, make_judge) -> None:
    fake.set_responder(lambda body: Reply(status=400, error_message="context length exceeded"))
    verdict = await make_judge().judge(ZH, ROW)
    assert verdict.error_kind == "context_overflow" and "context length exceeded" in verdict.error
    assert len(fake.chat_requests()) == 1


async def test_cache_hit_sends_nothing_and_takes_no_limiter_slot(fake, make_judge) -> None:
    fake.set_responder(reference_judge)
    judge = make_judge(cache=True, limiter=Limiter(rps=0.001, concurrency=1))
    first = await judge.judge(ZH, ROW)  # takes the only token the bucket will have for ~1000 s
    assert first.ok and not first.cached
    # Were a hit to need a limiter slot it would wait ~1000 s; it must come straight back.
    second = await asyncio.wait_for(judge.judge(ZH, ROW), timeout=30)
    assert second.cached and second.label == first.label and len(fake.chat_requests()) == 1


async def test_errors_are_never_cached(fake, make_judge) -> None:
    judge = make_judge(cache=True, retry=RetryPolicy(parse_retries=0))
    fake.push(Reply(content="no verdict here"))
    assert (await judge.judge(ZH, ROW)).error_kind == "parse_failure"
    fake.push(verdict_json("正确"))
    verdict = await judge.judge(ZH, ROW)
    assert verdict.ok and not verdict.cached and len(fake.chat_requests()) == 2


async def test_cache_key_covers_model_and_sampling(fake, make_judge, tmp_path) -> None:
    fake.set_responder(reference_judge)
    cache = JudgeCache(tmp_path / "k.sqlite3")
    await make_judge(cache=cache).judge(ZH, ROW)
    await make_judge(cache=cache, sampling={"max_tokens": 50}).judge(ZH, ROW)
    await make_judge(cache=cache, sampling={"seed": 3}).judge(ZH, ROW)
    assert len(fake.chat_requests()) == 3 and len(cache) == 3


async def test_missing_variable_is_an_input_error_without_a_request(fake, make_judge) -> None:
    verdict = await make_judge().judge(ZH, {"question": "q", "references": ["a"]})
    assert (verdict.error_kind, verdict.score) == ("input", None) and "prediction" in verdict.error
    assert fake.chat_requests() == []


async def test_rate_the_server_sees_stays_within_the_limit() -> None:
    # The server enforces the same 10 req/s as a token bucket; the client's pacing keeps it from ever refusing.
    rps, n = 10, 35
    with FakeProvider(responder=reference_judge, rate_limit_rps=rps) as fake:
        from gradekit.judge import Judge

        judge = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(rps=rps, concurrency=32))
        started = time.monotonic()
        verdicts = await asyncio.gather(*(judge.judge(ZH, {**ROW, "prediction": f"p{i}"}) for i in range(n)))
        took = time.monotonic() - started
        await judge.aclose()
    seen = fake.chat_requests()
    assert all(v.ok for v in verdicts) and len(seen) == n
    assert [r.status for r in seen].count(429) == 0
    # The pace, as a lower bound a loaded machine can only raise: past its burst the limiter grants
    # rps a second. (Arrival times on the fake's clock are no measure: a stalled server loop bunches them.)
    assert took >= (n - judge.limiter.burst) / rps * 0.95


async def test_concurrency_cap_bounds_requests_in_flight() -> None:
    latency, cap = 0.2, 3
    with FakeProvider(responder=reference_judge, latency=latency) as fake:
        from gradekit.judge import Judge

        judge = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=cap))
        await asyncio.gather(*(judge.judge(ZH, {**ROW, "prediction": f"p{i}"}) for i in range(9)))
        await judge.aclose()
    arrivals = sorted(r.time for r in fake.chat_requests())
    # Request k+cap can only start after request k's reply, which takes at least `latency`.
    assert all(arrivals[i + cap] - arrivals[i] >= latency * 0.95 for i in range(len(arrivals) - cap))


async def test_tokens_per_minute_paces_requests() -> None:
    from gradekit.judge import Judge, estimate_tokens

    # A bucket of 2.5 requests' worth of tokens lets two through at once; the third must wait
    # (0.5 request's worth at tpm/60 tokens per second = 12 s), so within a second the server sees two.
    row = {**ROW, "prediction": "p"}
    per_request = sum(estimate_tokens(m["content"]) for m in ZH.render(row)) + 50
    with FakeProvider(responder=reference_judge) as fake:
        judge = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(tpm=2.5 * per_request), sampling={"max_tokens": 50})
        tasks = [asyncio.create_task(judge.judge(ZH, row)) for _ in range(4)]
        deadline = time.monotonic() + 60  # a safety net: the two admitted requests are waited for, however slow
        while sum(t.done() for t in tasks) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # Then a second more in which nothing else may go out (the third waits ~12 s for its tokens).
        done, pending = await asyncio.wait(tasks, timeout=1.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await judge.aclose()
    assert len(done) == 2 and len(fake.chat_requests()) == 2


async def test_a_hold_also_stops_requests_already_waiting_in_the_pacer() -> None:
    """A 429's Retry-After pauses requests queued behind the rate pacer too, not only new ones."""
    limiter = Limiter(rps=20, burst=1)
    entered: list[float] = []

    async def request(first: bool) -> None:
        async with limiter.slot():
            entered.append(time.monotonic())
            if first:
                await asyncio.sleep(0.01)  # the others are now queued in the pacer
                limiter.hold(0.3)  # the server said Retry-After while they were being paced

    await asyncio.gather(request(True), *(request(False) for _ in range(3)))
    resume = entered[0] + 0.3
    assert len(entered) == 4 and all(t >= resume - 0.01 for t in entered[1:])


@pytest.mark.parametrize("concurrency", [pytest.param(1, id="one_at_a_time"), pytest.param(8, id="eight_learning_together")])
async def test_every_request_a_judgement_sent_is_in_its_usage(concurrency: int) -> None:
    """Issue 47: the wire returns each attempt's Usage and a failure carries its own, so a verdict counts the 400s
    that taught the dialect a fix, the retried 5xx and the re-asked reply alike: the verdicts' requests sum to what
    the provider saw, and their tokens to what it billed."""
    from gradekit.judge.testing import auto_reply

    billed: list[dict] = []
    lock = threading.Lock()

    def answer(body: dict) -> Reply:
        reply = auto_reply(body)
        spent = {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}
        with lock:
            billed.append(spent)
            if len(billed) % 5 == 2:
                return Reply(status=503)  # transient: retried
        return reply.model_copy(update={"usage": spent})

    en = load_rubric("semantic_equivalence_en")
    rows = [{"question": f"q-{i}", "references": ["x"], "prediction": "x"} for i in range(12)]
    with FakeProvider(dialect="openai-reasoning", responder=answer) as fake:  # it refuses temperature: a 400 to learn from
        judge = Judge("gpt-5-mini", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=concurrency),
                      retry=RetryPolicy(max_attempts=4, initial_wait=0.01, max_wait=0.05))
        async with judge:
            verdicts = await asyncio.gather(*(judge.judge(en, row) for row in rows))
        seen = fake.chat_requests()
    assert all(v.ok for v in verdicts), [v.error for v in verdicts if not v.ok]
    assert any(r.status == 400 for r in seen) and any(r.status == 503 for r in seen)
    assert sum(v.usage.requests for v in verdicts) == len(seen)
    answered = sum(r.status == 200 for r in seen)
    assert sum(v.usage.prompt_tokens for v in verdicts) == 50 * answered and sum(v.usage.completion_tokens for v in verdicts) == 5 * answered
