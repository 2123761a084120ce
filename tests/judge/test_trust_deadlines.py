"""Issue 35, deadlines that need no transport change: a broken Retry-After, a cascade fit against a dead judge,
a reward class that hangs."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from gradekit.judge import Limiter, load_rubric
from gradekit.judge.testing import Reply

from ..conftest import Waits

EN = load_rubric("semantic_equivalence_en")


async def test_one_429_with_a_broken_hint_holds_a_60_row_run_at_most_a_minute_and_is_said_once(fake, make_judge, waits,
                                                                                               caplog) -> None:
    held = Waits()  # what each request would have slept for the process-wide hold
    limiter = Limiter(concurrency=8, sleep=held)
    fake.push(Reply(status=429, headers={"Retry-After": "100001"}), Reply(status=429, headers={"Retry-After": "100001"}))
    judge = make_judge(limiter=limiter)
    logger = logging.getLogger("gradekit.judge")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="gradekit.judge"):
            verdicts = await asyncio.gather(*(judge.judge(EN, {"question": f"q{i}?", "references": ["x"], "prediction": "x"})
                                              for i in range(60)))
    finally:
        logger.removeHandler(caplog.handler)
    assert all(v.ok for v in verdicts)
    assert held and max(held) <= 60, max(held)  # was 600 s: every other row of the run stalled for 10 minutes
    assert max(waits) <= 60, max(waits)
    said = list({id(r): r.getMessage() for r in caplog.records if "taken as broken" in r.getMessage()}.values())
    assert len(said) == 1 and "Retry-After: 100001" in said[0], said


def test_cascade_fit_against_a_judge_that_answers_500_stops_early_with_the_breaker(fake, tmp_path) -> None:
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    fake.set_responder(lambda body: Reply(status=500, error_message="internal error"))
    rows = tmp_path / "labelled.jsonl"
    rows.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["x"], "prediction": "x", "label": "correct"}) + "\n"
                            for i in range(120)), encoding="utf-8")
    done = CliRunner().invoke(app, ["cascade", "fit", str(rows), "-r", "semantic_equivalence_en", "--model", "a", "--model", "b",
                                    "--samples", "2", "--concurrency", "4", "--base-url", fake.base_url, "--api-key", "k",
                                    "--no-cache", "-o", str(tmp_path / "c.json")])
    sent = len(fake.chat_requests())
    assert done.exit_code == 3, done.output
    assert "looks broken" in done.output and "server_error" in done.output and "nothing written" in done.output
    assert not Path(tmp_path / "c.json").exists()
    # 120 rows x 2 samples x 4 attempts = 960 requests to the first judge alone without a breaker; it trips after 50.
    assert sent < 200, sent
    assert {r.body["model"] for r in fake.chat_requests()} == {"a"}  # the second judge was never asked


async def test_the_learning_window_starts_when_the_first_request_is_on_the_wire_so_a_slow_set_up_costs_one_400() -> None:
    from gradekit.judge import Judge, RetryPolicy
    from gradekit.judge._dialect import LEARN_WAIT_S, forget_dialects
    from gradekit.judge.testing import FakeProvider

    forget_dialects()
    limiter = Limiter(concurrency=8)
    with FakeProvider(dialect="openai-reasoning") as fake:
        judge = Judge("o3", base_url=fake.base_url, api_key="k", limiter=limiter, cache=None, retry=RetryPolicy(max_attempts=2))
        # The first request's set-up outlasts the learning window: a process-wide pause before anything is sent
        # (a 429's Retry-After here; a starved core in the audit). The window must not run out before it is sent.
        limiter.hold(LEARN_WAIT_S + 1.0)
        verdicts = await asyncio.gather(*(judge.judge(EN, {"question": f"q{i}?", "references": ["x"], "prediction": "x"})
                                          for i in range(8)))
        statuses = [r.status for r in fake.chat_requests()]
    assert all(v.ok for v in verdicts), [v.error for v in verdicts if not v.ok]
    assert statuses.count(400) == 1, statuses  # was 8 x 400: every row in flight met the same refusal
