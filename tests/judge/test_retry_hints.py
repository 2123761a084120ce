"""Retry hints a 429 carries (#21): capped at the 429 budget, unreadable ones ignored, Gemini's body read.

Judges run against the loopback fake with recorded sleeps: ``Limiter.held_seconds`` and the
``waits`` fixture say how long the process would have been held, without waiting it out.
"""

from __future__ import annotations

import json
import logging

import openai
import pytest

from gradekit.judge import Limiter, load_rubric, retry_after_seconds
from gradekit.judge.testing import FakeProvider, Reply

from ..cases import cases
from ..conftest import Waits

EN = load_rubric("semantic_equivalence_en")
ROW = {"question": "q", "references": ["x"], "prediction": "x"}
GEMINI_429 = json.dumps([{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).",
                                    "status": "RESOURCE_EXHAUSTED",
                                    "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"}]}}])


def _refused(fake: FakeProvider, reply: Reply) -> openai.APIStatusError:
    """The SDK's own exception for the reply, fetched over HTTP from the fake."""
    fake.push(reply)
    client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    client.close()
    return caught.value


@pytest.mark.parametrize(("headers", "expected"), cases("retry_hints"))
def test_retry_hints_are_read_capped_or_ignored(fake, headers: dict[str, str], expected: float | None) -> None:
    exc = _refused(fake, Reply(status=429, headers=headers))
    assert retry_after_seconds(exc) == expected


def test_a_hint_is_capped_at_the_budget_the_caller_gives(fake) -> None:
    exc = _refused(fake, Reply(status=429, headers={"Retry-After": "100"}))
    assert retry_after_seconds(exc, cap=30) == 30


def test_geminis_retry_delay_in_a_json_array_body_is_a_hint(fake) -> None:
    exc = _refused(fake, Reply(status=429, raw_body=GEMINI_429))
    assert isinstance(exc, openai.RateLimitError)
    assert retry_after_seconds(exc) == 20.0


def test_the_gemini_dialects_own_429_carries_a_readable_retry_delay() -> None:
    with FakeProvider(dialect="gemini", rate_limit_rps=0.5, rate_limit_burst=1) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        client.close()
    assert "retry-after" not in caught.value.response.headers
    hint = retry_after_seconds(caught.value)
    assert hint is not None and 0 < hint <= 2


async def test_a_garbage_retry_after_is_retried_not_a_server_error(fake, make_judge) -> None:
    fake.push(Reply(status=429, headers={"Retry-After": "garbage"}))
    verdict = await make_judge().judge(EN, ROW)
    assert verdict.ok, verdict
    assert [r.status for r in fake.chat_requests()] == [429, 200]


@pytest.mark.parametrize("headers", [
    pytest.param({"Retry-After": "100000"}, id="retry_after_100000"),
    pytest.param({"retry-after-ms": "1e12"}, id="retry_after_ms_1e12"),
    pytest.param({"Retry-After": "Thu, 01 Jan 2099 00:00:00 GMT"}, id="http_date_2099"),
])
async def test_a_huge_hint_holds_the_process_no_longer_than_the_hint_ceiling(fake, make_judge, waits, caplog,
                                                                           headers: dict[str, str]) -> None:
    limiter = Limiter(concurrency=4, sleep=Waits())
    fake.push(Reply(status=429, headers=headers))
    # On the logger itself: a CLI test earlier in the process may have stopped it propagating (warnings_to_stderr).
    logger = logging.getLogger("gradekit.judge")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="gradekit.judge"):
            verdict = await make_judge(limiter=limiter).judge(EN, ROW)
    finally:
        logger.removeHandler(caplog.handler)
    assert verdict.ok, verdict
    assert 0 < limiter.held_seconds <= 60  # issue 35: a hint over a minute is broken; 600 s held a whole run
    assert all(w <= 60 for w in waits)


async def test_geminis_retry_delay_holds_the_process(fake, make_judge) -> None:
    limiter = Limiter(concurrency=4, sleep=Waits())
    fake.push(Reply(status=429, raw_body=GEMINI_429))
    verdict = await make_judge(limiter=limiter).judge(EN, ROW)
    assert verdict.ok, verdict
    assert 19 <= limiter.held_seconds <= 20
