"""Self-pacing (#14) and 429 bursts without --rps (#11): the limit nobody told gradekit.

Pure parts (duration parsing, the Pacer on a clock the test moves) are table-driven; the rest
runs real judges and real `gradekit grade` processes against the loopback fake provider, which
enforces its limit server-side and sends OpenAI's x-ratelimit-* headers. Assertions count what
the fake saw and what the limiter says it learnt; none depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge import Judge, Limiter, RetryPolicy, SharedLimiter, load_rubric
from gradekit.judge._pacing import MIN_RPS, START_RPS, Pacer, parse_duration
from gradekit.judge.testing import FakeProvider, Reply

from ..cases import cases
from ..conftest import Waits
from ..virtual_time import simulate
from .test_shared_limiter import _env, _finish, _rows, _start, redis_url  # noqa: F401  (redis_url is a fixture)

EN = load_rubric("semantic_equivalence_en")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def headers(limit_per_s: float, remaining: float, reset: str = "1s") -> dict[str, str]:
    return {"x-ratelimit-limit-requests": str(round(limit_per_s * 60)), "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": reset}


# ---- pure parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), cases("openai_durations"))
def test_openai_durations_parse(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_headers_pace_to_the_limit_and_slow_down_when_little_remains() -> None:
    pacer = Pacer(clock=Clock())
    pacer.observe(200, headers(20, remaining=10))
    assert pacer.mode == "headers" and 19 <= pacer.rate() <= 20.5
    pacer.observe(200, headers(20, remaining=0))  # another job on the key is eating the bucket
    assert pacer.rate() < 17
    pacer.observe(200, headers(20, remaining=20))  # a full bucket is spent over a couple of seconds, not at once
    assert 20 < pacer.rate() < 30
    pacer.observe(200, {})  # one reply without headers changes nothing
    assert pacer.mode == "headers" and 20 < pacer.rate() < 30


def test_token_headers_limit_the_request_rate_by_the_tokens_a_request_costs() -> None:
    pacer = Pacer(clock=Clock())
    tokens = {"x-ratelimit-limit-tokens": "60000", "x-ratelimit-remaining-tokens": "500", "x-ratelimit-reset-tokens": "1s"}
    pacer.observe(200, {**headers(100, remaining=50), **tokens}, tokens=100)  # 1000 tokens/s at 100 per request
    assert pacer.rate() == pytest.approx(10, rel=0.1)


def test_a_told_limit_is_a_ceiling_headers_may_only_lower() -> None:
    pacer = Pacer(ceiling=10, clock=Clock())
    assert pacer.pacing().model_dump() == {"mode": "fixed", "rps": 10}
    pacer.observe(200, headers(20, remaining=10))
    assert pacer.rate() == 10 and pacer.pacing().mode == "fixed"
    pacer.observe(200, headers(5, remaining=1))
    assert pacer.rate() == 5 and pacer.pacing().mode == "headers"
    pacer.observe(429, {})  # without headers a told limit is not cut by AIMD
    assert pacer.rate() == 5


def test_no_adapt_ignores_replies() -> None:
    told, untold = Pacer(ceiling=10, adapt=False, clock=Clock()), Pacer(adapt=False, clock=Clock())
    for pacer in (told, untold):
        pacer.observe(200, headers(2, remaining=0))
        pacer.observe(429, {})
    assert told.pacing().model_dump() == {"mode": "fixed", "rps": 10}
    assert untold.pacing().model_dump() == {"mode": "fixed", "rps": None}


def test_aimd_slow_start_then_a_429_cuts_to_what_the_server_accepted_then_climbs() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    assert pacer.rate() is None  # before any reply: no slow start, the concurrency cap bounds the first burst
    pacer.observe(200, {})
    assert pacer.mode == "aimd" and pacer.rate() is None  # a server that never refuses is not paced
    pacer.observe(429, {}, sent_at=clock.now)
    assert pacer.rate() == START_RPS  # a limit exists: a safe start
    for _ in range(20):  # 1 s at 20 accepted/s: slow start doubles while the server accepts
        clock.now += 0.05
        pacer.observe(200, {})
    assert pacer.rate() > 2 * START_RPS
    sent = clock.now
    clock.now += 0.05
    pacer.observe(429, {}, sent_at=sent)
    cut = pacer.rate()
    assert cut == pytest.approx(0.9 * 20, rel=0.1)
    pacer.observe(429, {}, sent_at=sent)  # sent before the cut: the cut already answered for it
    assert pacer.rate() == pytest.approx(cut)
    for _ in range(36):  # 2 s more at 18 accepted/s
        clock.now += 1 / 18
        pacer.observe(200, {})
    assert pacer.rate() > cut  # additive increase
    assert pacer.rate() < cut + 3  # ... not another slow start
    for _ in range(200):  # refused again and again: never below the floor
        clock.now += 1
        pacer.observe(429, {}, sent_at=clock.now - 0.01)
    assert pacer.rate() >= MIN_RPS


def test_a_flight_of_429s_is_one_congestion_event_and_what_it_let_through_is_the_estimate() -> None:
    """A first wave of 64 meets a bucket of 20: its 44 refusals, and those of the requests let out before a
    round trip had passed, are one event; once the wave's 20 accepted answers are in, 20/s is the estimate."""
    clock = Clock()
    pacer = Pacer(clock=clock)
    wave = clock.now
    clock.now += 0.01
    for _ in range(44):  # the wave's refusals come back at once; its accepted requests take the judge's 200 ms
        pacer.observe(429, {}, sent_at=wave)
        clock.now += 0.0005
    for _ in range(6):  # rows let out after the first 429, refused before anything was accepted: the same flight
        pacer.observe(429, {}, sent_at=clock.now - 0.0002)
        clock.now += 0.001
    assert pacer.events == 1 and pacer.rate() == pytest.approx(START_RPS, rel=0.1)  # a safe rate (slow start) until the flight is answered
    clock.now = wave + 0.2
    for _ in range(20):
        pacer.observe(200, {}, sent_at=wave)
    assert pacer.rate() == pytest.approx(0.97 * 20)
    clock.now += 0.01
    pacer.observe(429, {}, sent_at=wave + 0.1)  # sent within the flight, answered late: still the same event
    assert pacer.events == 1


def test_one_event_per_round_trip_once_the_round_trip_is_known() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    for _ in range(40):  # 2 s at 20 accepted/s, each answered after 200 ms
        pacer.observe(200, {}, sent_at=clock.now - 0.2)
        clock.now += 0.05
    pacer.observe(429, {}, sent_at=clock.now)
    first = pacer.rate()
    assert pacer.events == 1 and first == pytest.approx(0.9 * 20, rel=0.1)
    clock.now += 0.1
    pacer.observe(429, {}, sent_at=clock.now - 0.01)  # sent after the event but within its round trip
    assert pacer.events == 1 and pacer.rate() >= first  # no second cut
    clock.now += 0.2
    pacer.observe(429, {}, sent_at=clock.now - 0.01)  # sent a round trip after it: a new signal
    assert pacer.events == 2


@pytest.mark.parametrize(("shape", "share"), cases("cold_start_shapes"))
def test_without_headers_a_cold_start_holds_the_limit(shape: dict, share: float) -> None:
    """Virtual time (tests/virtual_time.py): the limiter as the judge drives it, against a token bucket that
    answers 429 with retry-after-ms at once and accepts after the judge's latency; no timed assertion."""
    server, limiter = simulate(**shape)
    limit = shape.get("rps", 20)
    assert server.accepted_rate() >= share * limit, (server.accepted_rate(), len(server.refused))
    assert limiter.pacing().mode == "aimd" and 0.85 * limit <= limiter.pacing().rps <= 1.2 * limit
    assert len(server.refused) <= 0.5 * len(server.accepted)  # the first flight's refusals and a few probes, no more


def test_with_headers_a_cold_start_holds_the_limit_and_meets_no_429_after_the_first_flight() -> None:
    server, limiter = simulate(headers=True)
    assert server.accepted_rate() >= 0.95 * 20
    first_answer = server.accepted[0] + 0.2  # when the first reply's headers were read
    assert server.refused and all(t < first_answer for t in server.refused)
    assert limiter.pacing().mode == "headers"


def test_adopting_a_shared_rate() -> None:
    pacer = Pacer(clock=Clock())
    pacer.adopt("headers", 12.5)
    assert pacer.pacing().model_dump() == {"mode": "headers", "rps": 12.5}
    Pacer(adapt=False).adopt("headers", 3)  # harmless when off


def _rate_limited(fake: FakeProvider, headers: dict[str, str]) -> openai.RateLimitError:
    """A real 429 from the fake, as the SDK raises it."""
    fake.push(Reply(status=429, headers=headers))
    client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return caught.value


def test_a_429_wait_is_at_least_the_hint_and_a_floor_that_grows_with_each_429_in_a_row(fake) -> None:
    policy = RetryPolicy(rate_limit_floor=0.1, max_wait=30)
    tiny = _rate_limited(fake, {"retry-after-ms": "3"})
    waits = [policy.rate_limited_wait(tiny, n) for n in range(1, 9)]
    floors = [min(30, 0.1 * 2 ** (n - 1)) for n in range(1, 9)]
    assert all(f <= w <= 2 * f for w, f in zip(waits, floors)), waits  # floor plus full jitter over it
    assert policy.rate_limited_wait(_rate_limited(fake, {"retry-after": "7"}), 1) == 7.0


# ---- real judges against the fake --------------------------------------------------------------


async def test_429s_do_not_spend_the_attempt_budget_of_failures(fake, make_judge, waits) -> None:
    fake.push(*[Reply(status=429, headers={"retry-after-ms": "2"}) for _ in range(8)])
    verdict = await make_judge(retry=RetryPolicy(max_attempts=2)).judge(EN, {"question": "q", "references": ["x"], "prediction": "x"})
    assert verdict.ok and verdict.usage.requests == 9
    assert len(waits) == 8 and all(w >= 0.1 for w in waits)
    assert waits[-1] >= 0.1 * 2 ** 7  # the floor grew with the streak


async def test_429s_stop_when_their_own_time_budget_is_spent(fake, make_judge, waits) -> None:
    fake.set_responder(lambda body: Reply(status=429, headers={"retry-after-ms": "5"}))
    judge = make_judge(retry=RetryPolicy(max_attempts=2, rate_limit_budget=20))
    verdict = await judge.judge(EN, {"question": "q", "references": ["x"], "prediction": "x"})
    assert verdict.error_kind == "rate_limited" and verdict.usage.requests > 2
    assert sum(waits) == pytest.approx(20)


async def _grade_rows(judge: Judge, n: int, tag: str = "r") -> list:
    rows = [{"question": f"{tag}-{i}", "references": ["x"], "prediction": "y"} for i in range(n)]
    return await asyncio.gather(*(judge.judge(EN, row) for row in rows))


async def test_a_429_burst_without_rps_loses_no_row_even_without_self_pacing() -> None:
    # #11: 40 req/s, burst 10, retry-after-ms of a few ms, concurrency 16, no --rps, and --no-adapt:
    # six attempts used to be spent in ~100 ms and rows ended rate_limited.
    with FakeProvider(rate_limit_rps=40, rate_limit_burst=10, rate_limit_headers=False) as fake:
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=16, adapt=False)) as judge:
            verdicts = await _grade_rows(judge, 120)
        assert fake.rate_limited > 0, "the control: the burst did meet the limit"
    assert [v.status for v in verdicts] == ["ok"] * 120


async def test_headers_pace_the_process_to_the_limit_with_no_429() -> None:
    # The bucket holds a second's requests (20): the first wave (16, sent before any reply) fits in it.
    with FakeProvider(rate_limit_rps=20) as fake:
        limiter = Limiter(concurrency=16)
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            verdicts = await _grade_rows(judge, 60)
        statuses = [r.status for r in fake.chat_requests()]
    assert all(v.ok for v in verdicts)
    assert statuses.count(429) == 0
    pacing = limiter.pacing()
    assert pacing.mode == "headers" and 14 <= pacing.rps <= 25


async def test_a_first_wave_larger_than_the_burst_meets_429s_only_before_the_first_reply() -> None:
    """Nothing is known before the first reply, and the first wave goes out together (#36): past a
    burst of 5, its requests meet 429s; from the first reply's headers on, the run is paced."""
    with FakeProvider(rate_limit_rps=20, rate_limit_burst=5) as fake:
        limiter = Limiter(concurrency=16)
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            verdicts = await _grade_rows(judge, 60)
        statuses = [r.status for r in fake.chat_requests()]
    assert all(v.ok for v in verdicts)
    # The first wave's 11 past the burst, and at most two more while the first replies' headers are read;
    # unpaced, 60 rows at 16 in flight meet the burst again and again.
    assert statuses.count(429) <= 16 - 5 + 2, statuses
    assert limiter.pacing().mode == "headers"


async def test_without_headers_aimd_finds_the_limit_from_429s() -> None:
    with FakeProvider(rate_limit_rps=20, rate_limit_burst=5, rate_limit_headers=False) as fake:
        limiter = Limiter(concurrency=16)
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            verdicts = await _grade_rows(judge, 80)
        refused = fake.rate_limited
    assert all(v.ok for v in verdicts)
    pacing = limiter.pacing()
    assert pacing.mode == "aimd" and pacing.rps < 40
    assert refused < 20  # concurrency 16 with no pacing would meet hundreds


async def test_retry_after_only_holds_the_process_and_cuts_the_rate(fake, make_judge) -> None:
    limiter = Limiter(concurrency=8, sleep=Waits())
    fake.push(Reply(status=429, headers={"Retry-After": "2"}))
    verdict = await make_judge(limiter=limiter).judge(EN, {"question": "q", "references": ["x"], "prediction": "x"})
    assert verdict.ok and limiter.held_seconds > 0
    assert limiter.pacing().mode == "aimd" and START_RPS <= limiter.pacing().rps <= 2 * START_RPS


@pytest.mark.parametrize(("before", "after"), [pytest.param(30, 10, id="drop_30_to_10"), pytest.param(10, 30, id="rise_10_to_30")])
async def test_a_limit_that_changes_mid_run_is_followed(before: float, after: float) -> None:
    with FakeProvider(rate_limit_rps=before, rate_limit_schedule=[(1.5, after)]) as fake:
        limiter = Limiter(concurrency=16)
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            first = await _grade_rows(judge, 20, "a")
            while time.monotonic() - fake._started < 1.6:  # the fake runs in this process: one monotonic clock
                await asyncio.sleep(0.1)
            second = await _grade_rows(judge, 45, "b")
        refused = fake.rate_limited
        last = fake.chat_requests()[-1]
    assert all(v.ok for v in first + second)
    assert refused < 20
    assert limiter.pacing().mode == "headers"
    assert 0.75 * after <= limiter.pacing().rps <= 1.3 * after, (limiter.pacing(), last.status)


async def test_told_rps_wins_over_headers_that_allow_more() -> None:
    with FakeProvider(rate_limit_rps=40) as fake:
        limiter = Limiter(rps=10, concurrency=8)
        async with Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=limiter) as judge:
            assert all(v.ok for v in await _grade_rows(judge, 12))
    assert limiter.pacing().model_dump() == {"mode": "fixed", "rps": 10}


# ---- the command line --------------------------------------------------------------------------


def _grade_cli(tmp_path: Path, base_url: str, *options: str) -> dict:
    source = _rows(tmp_path / "in.jsonl", "cli", 15)
    result = CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "out.jsonl"),
                                      "--base-url", base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache", "--json",
                                      "--restart", *options])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_json_summary_reports_the_pacing(tmp_path: Path) -> None:
    with FakeProvider(rate_limit_rps=30) as fake:
        learnt = _grade_cli(tmp_path, fake.base_url)["pacing"]
        told = _grade_cli(tmp_path, fake.base_url, "--rps", "12")["pacing"]
        off = _grade_cli(tmp_path, fake.base_url, "--no-adapt")["pacing"]
    assert learnt["mode"] == "headers" and 20 <= learnt["rps"] <= 40
    assert told == {"mode": "fixed", "rps": 12}
    assert off == {"mode": "fixed", "rps": None}


def test_the_human_summary_shows_the_pacing(tmp_path: Path) -> None:
    source = _rows(tmp_path / "in.jsonl", "h", 5)
    with FakeProvider(rate_limit_rps=30) as fake:
        result = CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"),
                                          "--base-url", fake.base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "pacing" in result.stdout and "headers" in result.stdout


# ---- shared through Redis ------------------------------------------------------------------------


async def test_a_rate_learnt_by_one_limiter_is_adopted_by_another_sharing_redis(redis_url: str) -> None:  # noqa: F811
    learner, other = (SharedLimiter(redis_url, key="pacing-adopt") for _ in range(2))
    async with learner.slot():
        pass
    learner.observe(200, headers(7, remaining=0))
    await asyncio.gather(*learner._publishing)
    async with other.slot():
        pass
    assert other.pacing().mode == "headers" and other.pacing().rps == pytest.approx(learner.pacing().rps)


def test_two_processes_sharing_redis_learn_one_limit_and_stay_within_it(redis_url: str, tmp_path: Path) -> None:  # noqa: F811
    with FakeProvider(rate_limit_rps=20, latency=0.05) as fake:
        procs = [_start(tmp_path, tag, 90, fake.base_url, "--limiter", redis_url, "--limiter-key", "pacing-two")
                 for tag in ("a", "b")]
        summaries = [_finish(p) for p in procs]
        statuses = [r.status for r in fake.chat_requests()]
    assert all(s["errors"] == 0 and s["ok"] == 90 for s in summaries)
    assert all(s["pacing"]["mode"] == "headers" for s in summaries)
    assert statuses.count(429) <= 2  # <= 1% of 180; each pacing alone at the full limit would meet dozens


def test_the_fake_serves_rate_limit_flags_from_the_command_line() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--rps", "5", "--no-rate-headers", "--schedule", "0:7"],
                            stdout=subprocess.PIPE, text=True, env=_env())
    try:
        url = proc.stdout.readline().strip()
        reply = openai.OpenAI(base_url=url, api_key="k").chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.status_code == 200 and "x-ratelimit-limit-requests" not in reply.headers
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_fake_sends_openai_rate_limit_headers_and_changes_its_limit_on_schedule() -> None:
    with FakeProvider(rate_limit_rps=20, rate_limit_tpm=60000, rate_limit_schedule=[(3, 5)]) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)

        def ask():
            return client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])

        first = ask().headers
        assert time.monotonic() - fake._started < 3, "the first request came after the change: the test says nothing"
        time.sleep(max(0.0, 3.05 - (time.monotonic() - fake._started)))  # past the change; one monotonic clock
        second = ask().headers
    assert first["x-ratelimit-limit-requests"] == "1200" and first["x-ratelimit-remaining-requests"] == "19"
    assert parse_duration(first["x-ratelimit-reset-requests"]) == pytest.approx(0.05, abs=0.01)
    assert first["x-ratelimit-limit-tokens"] == "60000" and int(first["x-ratelimit-remaining-tokens"]) < 1000
    assert second["x-ratelimit-limit-requests"] == "300"
