"""What a process learnt about an endpoint is kept in the cache (#36), and the learning gate holds only what is to be learnt.

A second process sharing the cache sends the fixed request from its first request on (no 400,
no gate); a wave of rows leaves in one event-loop tick unless the model is of a family known to
refuse parameters and the request carries something it has not accepted yet; a refusal met by
an unheld wave is learnt from the first 400 and every row still gets its answer; a process
starved of CPU still meets each refused parameter of a careful model once, because the learning
window starts when the first request is on the wire, not before its set-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.judge import Judge, JudgeCache, Limiter, load_rubric
from gradekit.judge._dialect import forget_dialects
from gradekit.judge.testing import FakeProvider

from ..conftest import reference_judge
from .test_judge_models import ROWS, answer_for

GRADEKIT = [sys.executable, "-m", "gradekit"]
BUSY_LOOPS = 4  # on the core the run is pinned to: it gets a fifth of it


def _pairs(path: Path, start: int, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": i, **ROWS["llmbar_pairwise"], "instruction": f"Say hi {i}"}) + "\n"
                            for i in range(start, start + n)), encoding="utf-8")
    return path


def _grade(source: Path, fake: FakeProvider, *extra: str, prefix: tuple[str, ...] = (),
           model: str = "gpt-5-mini") -> subprocess.CompletedProcess:
    out = source.with_suffix(".out.jsonl")
    return subprocess.run([*prefix, *GRADEKIT, "grade", str(source), "-r", "llmbar_pairwise", "-o", str(out), "--model", model,
                           "--base-url", fake.base_url, "--api-key", "k", "--json", *extra],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_second_process_sharing_the_cache_sends_no_400(tmp_path: Path) -> None:
    cache = tmp_path / "cache.sqlite3"
    with FakeProvider(dialect="openai-reasoning", responder=answer_for("llmbar_pairwise")) as fake:
        first = _grade(_pairs(tmp_path / "a.jsonl", 0, 10), fake, "--cache", str(cache), "--concurrency", "8")
        learnt = fake.chat_requests()
        second = _grade(_pairs(tmp_path / "b.jsonl", 10, 20), fake, "--cache", str(cache), "--concurrency", "8")
        requests = fake.chat_requests()[len(learnt):]
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert sum(r.status == 400 for r in learnt) >= 1  # the first process met the refusals and learnt from them
    assert json.loads(second.stdout)["ok"] == 20
    assert requests and {r.status for r in requests} == {200}  # none refused: the fixes came from the cache
    assert not any("temperature" in r.body or "max_tokens" in r.body for r in requests)


def _wave_ticks(url: str, cache: JudgeCache | None, start: int, n: int, model: str = "fake-judge") -> list[int]:
    """The event-loop iteration at which each of ``n`` rows' requests was handed to the HTTP client.

    A callback that reschedules itself counts the loop's iterations; the SDK logs each request it
    sends ("Sending HTTP Request", at debug; the fast wire logs its own so), and a handler notes the count then.
    The SDK client is warmed first by a request that is no judgement (a new client finds its platform in a
    thread, once per request in flight, which would spread the wave over a few ticks in a bare loop too),
    and the fast wire opened (its probe of the SDK would be one more request line).
    """
    ticks: list[int] = []
    count = [0]

    class Note(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Sending HTTP Request"):
                ticks.append(count[0])

    async def wave() -> None:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            count[0] += 1
            loop.call_soon(tick)

        loop.call_soon(tick)
        rubric = load_rubric("semantic_equivalence_en")
        rows = [{"question": f"question {i}?", "references": ["Paris"], "prediction": "Paris"} for i in range(start, start + n)]
        async with Judge(model, base_url=url, api_key="k", limiter=Limiter(concurrency=n), cache=cache) as judge:
            with contextlib.suppress(Exception):
                await judge.client.models.list()
            await judge._fleet.members[0].wire()  # the fast wire's one probe of the SDK, as a process's first request makes it
            ticks.clear()
            verdicts = await asyncio.gather(*(judge.judge(rubric, row) for row in rows))
        assert all(v.ok for v in verdicts), [v.error for v in verdicts if not v.ok]

    # The SDK logs each request it sends; the fast wire (judge._fastwire) logs its own the same way.
    loggers = [logging.getLogger("openai._base_client"), logging.getLogger("gradekit.judge.wire")]
    note, levels = Note(), [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(note)
        logger.setLevel(logging.DEBUG)
    try:
        asyncio.run(wave())
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(note)
            logger.setLevel(level)
    assert len(ticks) == n
    return ticks


def test_a_wave_with_nothing_to_learn_starts_every_request_in_one_tick(tmp_path: Path) -> None:
    cache = tmp_path / "cache.sqlite3"
    with FakeProvider(responder=reference_judge) as fake:
        forget_dialects()  # a new process that has never met this endpoint: a model of no careful family goes unheld
        fresh = _wave_ticks(fake.base_url, JudgeCache(cache), 0, 256)
        forget_dialects()  # a new process again, whose cache holds what the first one learnt
        known = _wave_ticks(fake.base_url, JudgeCache(cache), 1000, 256)
        same = _wave_ticks(fake.base_url, None, 2000, 256)  # ... and later in that process, without a cache
        forget_dialects()
        careful = _wave_ticks(fake.base_url, None, 3000, 32, model="o3")  # a family that refuses temperature: one goes first
        careful_known = _wave_ticks(fake.base_url, None, 4000, 256, model="o3")  # ... once per process
    assert max(fresh) == min(fresh), sorted(set(fresh))  # all 256 requests in one event-loop tick
    assert max(known) == min(known), sorted(set(known))
    assert max(same) == min(same), sorted(set(same))
    assert sorted(careful).count(min(careful)) == 1 and max(careful) > min(careful)  # held until the learner's answer
    assert max(careful_known) == min(careful_known), sorted(set(careful_known))


def test_an_unheld_wave_that_meets_a_refusal_learns_it_from_the_first_400_and_judges_every_row(tmp_path: Path) -> None:
    """A model no careful family names, served by software that refuses max_tokens and temperature (in that order)."""
    cache = tmp_path / "cache.sqlite3"
    with FakeProvider(dialect="openai-reasoning", responder=answer_for("llmbar_pairwise")) as fake:
        forget_dialects()
        done = _grade(_pairs(tmp_path / "a.jsonl", 0, 48), fake, "--cache", str(cache), "--concurrency", "48", model="house-judge")
        first = fake.chat_requests()
        again = _grade(_pairs(tmp_path / "b.jsonl", 100, 10), fake, "--cache", str(cache), "--concurrency", "8", model="house-judge")
        later = fake.chat_requests()[len(first):]
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] == 48  # every row answered: a refusal of the request's form is no row's failure
    refused = [r for r in first if r.status == 400]
    assert any("max_tokens" in r.body for r in refused), "the control: the unheld wave met the first refusal"
    assert len(refused) <= 2 * 48  # at most one 400 per parameter per request of the first wave
    # After the first fix the endpoint is met carefully: the second refusal (temperature) is met once, not once a row.
    assert sum("max_tokens" not in r.body for r in refused) == 1, [sorted(r.body) for r in refused]
    assert done.stderr.count("no longer sent") + done.stderr.count("sent as") <= 2, done.stderr  # each fix said once
    assert again.returncode == 0 and json.loads(again.stdout)["ok"] == 10
    assert later and {r.status for r in later} == {200}  # the next process starts from the cache: no 400


def test_a_folded_system_message_is_kept_in_the_cache_too(tmp_path: Path) -> None:
    """o1-mini refuses the system role: the second process folds it from its first request on."""
    cache = tmp_path / "cache.sqlite3"
    with FakeProvider(dialect="openai-reasoning", responder=answer_for("llmbar_pairwise")) as fake:
        first = _grade(_pairs(tmp_path / "a.jsonl", 0, 10), fake, "--cache", str(cache), "--concurrency", "8", model="o1-mini")
        learnt = len(fake.chat_requests())
        second = _grade(_pairs(tmp_path / "b.jsonl", 100, 10), fake, "--cache", str(cache), "--concurrency", "8", model="o1-mini")
        later = fake.chat_requests()[learnt:]
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert later and {r.status for r in later} == {200}, [r.body.get("error") for r in later if r.status != 200]
    assert not any(m.get("role") == "system" for r in later for m in r.body["messages"])


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_a_process_starved_on_one_busy_core_meets_each_refused_parameter_once(tmp_path: Path) -> None:
    """Pinned to one core that a busy loop shares, the first call's set-up is slow; the window waits for the wire."""
    core = sorted(os.sched_getaffinity(0))[0]
    busy = [subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"]) for _ in range(BUSY_LOOPS)]
    try:
        with FakeProvider(dialect="openai-reasoning", responder=answer_for("llmbar_pairwise")) as fake:
            done = _grade(_pairs(tmp_path / "rows.jsonl", 0, 64), fake, "--no-cache", "--concurrency", "64",
                          prefix=("taskset", "-c", str(core)))
            requests = fake.chat_requests()
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] == 64
    refused = [r for r in requests if r.status == 400]
    # openai-reasoning refuses temperature and max_tokens: one 400 each, whatever the load.
    assert len(refused) <= 2, [r.body.get("error") for r in refused]
    assert len({tuple(sorted(r.body)) for r in refused}) == len(refused)
