"""Self-pacing from Anthropic's rate headers, and headers the replies contradict (#20, #21).

Pure parts run the Pacer on a clock the test moves; the rest runs real judges against the
loopback fake (its ``anthropic`` dialect enforces the limit and sends ``anthropic-ratelimit-*``).
"""

from __future__ import annotations

import asyncio
import datetime

from gradekit.judge import Judge, Limiter, load_rubric
from gradekit.judge._pacing import MIN_RPS, Pacer
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import Waits, reference_judge

EN = load_rubric("semantic_equivalence_en")
WALL = 1_900_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def anthropic(limit_per_s: float, remaining: float, reset_in: float = 1.0) -> dict[str, str]:
    at = datetime.datetime.fromtimestamp(WALL + reset_in, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return {"anthropic-ratelimit-requests-limit": str(round(limit_per_s * 60)),
            "anthropic-ratelimit-requests-remaining": str(remaining), "anthropic-ratelimit-requests-reset": at}


def lying(remaining: int = 0) -> dict[str, str]:
    """Headers claiming one request per minute, whatever the server really lets through."""
    return {"x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": "60s"}


def test_anthropic_headers_pace_like_openais() -> None:
    pacer = Pacer(clock=Clock(), wall=lambda: WALL)
    pacer.observe(200, anthropic(20, remaining=10))
    assert pacer.mode == "headers" and 19 <= pacer.rate() <= 20.5
    pacer.observe(200, anthropic(20, remaining=0))  # another job on the key is eating the bucket
    assert pacer.rate() < 17


def test_anthropic_token_headers_limit_the_request_rate() -> None:
    pacer = Pacer(clock=Clock(), wall=lambda: WALL)
    headers = {"anthropic-ratelimit-tokens-limit": "60000", "anthropic-ratelimit-tokens-remaining": "1000",
               "anthropic-ratelimit-tokens-reset": anthropic(1, 0)["anthropic-ratelimit-requests-reset"]}
    pacer.observe(200, headers, tokens=500)
    assert pacer.mode == "headers" and 1.5 <= pacer.rate() <= 3  # 1,000 tokens/s at 500 tokens a request


def test_headers_the_replies_contradict_are_trusted_less_and_less_and_a_429_restores_some_trust() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    rates = []
    for _ in range(40):  # one request per second, all accepted, against a claimed 1 per minute
        clock.now += 1.0
        pacer.observe(200, lying())
        rates.append(pacer.rate())
    assert rates[0] == MIN_RPS, "the headers are believed at first"
    assert rates[-1] > 10 * MIN_RPS
    assert all(later >= earlier for earlier, later in zip(rates, rates[1:]))
    before = pacer.rate()
    pacer.observe(429, lying())
    assert MIN_RPS < pacer.rate() < before


def test_honest_headers_are_never_doubted() -> None:
    honest = {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "30", "x-ratelimit-reset-requests": "30s"}
    once = Pacer(clock=Clock())
    once.observe(200, honest)
    clock = Clock()
    pacer = Pacer(clock=clock)
    for _ in range(300):  # a 60/min limit, used at up to twice its rate (a full bucket plus its refill) for five minutes
        clock.now += 0.5
        pacer.observe(200, honest)
    assert pacer.rate() == once.rate()


async def _grade_rows(judge: Judge, n: int) -> list:
    rows = [{"question": f"r-{i}", "references": ["x"], "prediction": "y"} for i in range(n)]
    return await asyncio.gather(*(judge.judge(EN, row) for row in rows))


async def test_anthropic_headers_pace_the_process_to_the_limit_with_few_429() -> None:
    with FakeProvider(dialect="anthropic", rate_limit_rps=20) as fake:  # a bucket the first wave (16) fits in
        limiter = Limiter(concurrency=16)
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            verdicts = await _grade_rows(judge, 50)
        statuses = [r.status for r in fake.chat_requests()]
        sent = fake.chat_requests()[0].headers
    assert "anthropic-ratelimit-requests-limit" not in sent  # the control: headers go server -> client
    assert all(v.ok for v in verdicts)
    assert statuses.count(429) <= 2
    pacing = limiter.pacing()
    assert pacing.mode == "headers" and 14 <= pacing.rps <= 25


async def test_a_header_claiming_one_request_a_minute_does_not_pin_a_run_that_every_reply_contradicts() -> None:
    def answer(body: dict) -> Reply:
        reply = reference_judge(body)
        return reply.model_copy(update={"headers": lying()})

    with FakeProvider(responder=answer) as fake:
        limiter = Limiter(concurrency=4, sleep=Waits())  # recorded pace waits: the test does not wait them out
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            verdicts = await _grade_rows(judge, 40)
        refused = [r.status for r in fake.chat_requests()].count(429)
    assert all(v.ok for v in verdicts) and refused == 0
    pacing = limiter.pacing()
    assert pacing.mode == "headers" and pacing.rps > 10 * MIN_RPS


def token_lying() -> dict[str, str]:
    """Headers claiming a budget of one token per minute, spent, whatever the server really lets through."""
    return {"x-ratelimit-limit-tokens": "1", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "60s"}


def test_token_headers_the_replies_contradict_are_trusted_less_and_less_like_request_headers() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    waits = []
    for _ in range(60):  # a 60-row run sent at the pacer's own pace, every reply accepted (120 tokens each)
        rate = pacer.rate()
        waits.append(1 / rate if rate else 0.0)
        clock.now += waits[-1]
        pacer.observe(200, token_lying(), tokens=120)
    assert waits[1] == 1 / MIN_RPS, "the headers are believed at first"
    assert sum(waits) < 60, sum(waits)  # was 59 waits of 5 s: 295 s for 60 rows that all succeeded
    assert sum(w >= 1 / MIN_RPS for w in waits) < 10
    before = pacer.rate()
    pacer.observe(429, token_lying())
    assert pacer.rate() < before  # a 429 restores some trust


async def test_a_token_header_claiming_one_token_a_minute_does_not_pin_a_run_that_every_reply_contradicts() -> None:
    def answer(body: dict) -> Reply:
        return reference_judge(body).model_copy(update={"headers": token_lying()})

    waits = Waits()
    with FakeProvider(responder=answer) as fake:
        limiter = Limiter(concurrency=4, sleep=waits)  # recorded pace waits: the test does not wait them out
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            verdicts = await _grade_rows(judge, 60)
        refused = [r.status for r in fake.chat_requests()].count(429)
    assert all(v.ok for v in verdicts) and refused == 0
    pacing = limiter.pacing()
    assert pacing.mode == "headers" and pacing.rps > 10 * MIN_RPS, pacing  # was pinned at MIN_RPS: 0.2 rows/s
