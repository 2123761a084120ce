"""Hedged requests over a fleet of loopback fakes: a straggler is sent once more to another endpoint.

Everything is asserted on counts (hedges, requests the fakes saw, connections they saw closed,
rows written, cache entries), never on times: a hung request hangs until its client leaves, so
only a hedge finishes its row soon, and a test that waits for one fails by its timeout if none came.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradekit.judge import HedgePolicy, Judge, JudgeCache, Limiter, load_rubric
from gradekit.judge._hedge import HedgeBudget, LatencyTracker
from gradekit.judge.testing import FakeProvider, Lognormal, Reply, auto_reply

from ..conftest import serve_in
from .test_fleet import cli, rows

EN = load_rubric("semantic_equivalence_en")
HANG = 60.0  # a hung reply: cut short when the client closes the connection


def slowed(body: dict, seconds: float) -> Reply:
    """The fake's own answer to ``body``, after ``seconds``."""
    return auto_reply(body).model_copy(update={"delay": seconds})


class HangFirst:
    """Shared by two fakes: the first request for each marked row (on whichever fake) hangs; any later one answers."""

    def __init__(self, marked: set[str]) -> None:
        self.marked = marked
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, body: dict) -> Reply | None:
        text = body["messages"][-1]["content"]
        for mark in self.marked:
            if re.search(rf"\b{re.escape(mark)}\b", text):
                with self.lock:
                    first = mark not in self.seen
                    self.seen.add(mark)
                return slowed(body, HANG) if first else None
        return None


@pytest.fixture()
def fleet() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    # 20 ms each: an ordinary reply is rarely late past twice the median, so few hedges besides the scripted ones.
    with FakeProvider(latency=0.02) as a, FakeProvider(latency=0.02) as b:
        yield a, b


def wait_for(condition, what: str, seconds: float = 20.0) -> None:
    """Poll until ``condition()`` holds (a fake thread records asynchronously); fail naming ``what``."""
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"never: {what}")
        time.sleep(0.02)


def mine_now(fakes, mark: str = "q-59") -> list:
    return [r for f in fakes for r in f.chat_requests() if mark in r.body["messages"][-1]["content"]]


def chat(fakes) -> list:
    return [r for f in fakes for r in f.chat_requests()]


async def judge_rows(judge: Judge, data: list[dict], concurrency: int = 1) -> list:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(row: dict):
        async with semaphore:
            return await judge.judge(EN, row)

    async with judge:
        return await asyncio.gather(*(one(r) for r in data))


async def test_a_hung_request_is_hedged_to_the_other_endpoint_and_cancelled(fleet, tmp_path: Path) -> None:
    a, b = fleet
    hang = HangFirst({"q-59"})
    a.set_responder(hang)
    b.set_responder(hang)
    cache = JudgeCache(tmp_path / "cache.sqlite")
    judge = Judge("fake-judge", base_url=[a.base_url, b.base_url], api_key="k", cache=cache, limiter=Limiter(concurrency=1))
    verdicts = await judge_rows(judge, rows(60))  # one at a time: each endpoint has answered many before q-59
    assert [v.status for v in verdicts] == ["ok"] * 60
    hedges = judge.hedges
    # The hung row's hedge won; an ordinary reply that came late may have been hedged too (it lost or won).
    assert hedges.won >= 1 and hedges.sent == hedges.won + hedges.lost
    mine = [r for f in fleet for r in f.chat_requests() if "q-59" in r.body["messages"][-1]["content"]]
    assert len(mine) == 2  # the first request and its hedge, on two different endpoints
    assert verdicts[59].usage.requests == 2, "the hung request and its hedge are both the row's (the loser was sent)"
    assert len(a.chat_requests()) + len(b.chat_requests()) <= 60 + hedges.sent
    assert any("q-59" in r.body["messages"][-1]["content"] for r in a.chat_requests())
    assert any("q-59" in r.body["messages"][-1]["content"] for r in b.chat_requests())
    hung = lambda: [r for r in mine_now(fleet) if r.cancelled]  # noqa: E731
    wait_for(lambda: len(hung()) == 1, "the hung request's connection closed")
    assert hung()[0].status == 0  # it never answered
    assert len(cache) == 60  # one answer per row
    per_endpoint = [e.hedges for e in judge.endpoints]
    assert sum(h.sent for h in per_endpoint) == hedges.sent and sum(h.won for h in per_endpoint) == hedges.won
    cache.close()


async def test_both_requests_are_counted_and_the_row_has_one_result(fleet, tmp_path: Path) -> None:
    a, b = fleet
    hang = HangFirst({"q-79"})
    a.set_responder(hang)
    b.set_responder(hang)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows(80)), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", a.base_url,
                 "--base-url", b.base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache", "--json",
                 "--concurrency", "1", process=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    hedges = summary["hedges"]
    assert hedges["won"] >= 1 and hedges["sent"] == hedges["won"] + hedges["lost"]
    assert len(mine_now(fleet, "q-79")) == 2
    # The hung request and its hedge were both sent: both are counted as requests (as is any other hedge).
    assert summary["requests"] == 80 + hedges["sent"]
    assert sum(e["hedges"]["sent"] for e in summary["endpoints"]) == hedges["sent"]
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(w["question"] for w in written) == sorted(f"q-{i}" for i in range(80))  # each row once
    assert all(w["status"] == "ok" for w in written)


def test_no_hedge_sends_none(fleet, tmp_path: Path) -> None:
    a, b = fleet
    slow_first = HangFirst(set())  # nothing hangs: rows answer; --no-hedge must add no request at all
    a.set_responder(slow_first)
    a.latency = b.latency = Lognormal(0.01, 0.2, seed=1)  # a tail a hedging run would hedge
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows(80)), encoding="utf-8")
    result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "out.jsonl"), "--base-url",
                 a.base_url, "--base-url", b.base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache", "--json",
                 "--concurrency", "4", "--no-hedge")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["hedges"] == {"sent": 0, "won": 0, "lost": 0}
    assert len(chat(fleet)) == 80 == summary["requests"]


async def test_one_endpoint_never_hedges() -> None:
    with FakeProvider(responder=HangFirst(set()), latency=Lognormal(0.005, 0.1, seed=2)) as only:
        judge = Judge("fake-judge", base_url=only.base_url, api_key="k", cache=None, limiter=Limiter(concurrency=4), hedge=True)
        assert not judge.hedging
        verdicts = await judge_rows(judge, rows(60), concurrency=4)
        assert all(v.status == "ok" for v in verdicts)
        assert judge.hedges.sent == 0 and len(only.chat_requests()) == 60


async def test_hedges_stay_within_ten_percent_when_one_endpoint_is_slow(fleet) -> None:
    a, b = fleet
    answered = [0]
    lock = threading.Lock()

    def slow_after_warmup(body: dict) -> Reply | None:
        with lock:
            answered[0] += 1
            n = answered[0]
        return slowed(body, 0.5) if n > 25 else None  # a's first answers are fast: its deadline is short

    a.set_responder(slow_after_warmup)
    judge = Judge("fake-judge", base_url=[a.base_url, b.base_url], api_key="k", cache=None, limiter=Limiter(concurrency=4))
    verdicts = await judge_rows(judge, rows(200), concurrency=8)
    assert [v.status for v in verdicts] == ["ok"] * 200, [(v.error_kind, v.error) for v in verdicts if v.status != "ok"][:2]
    hedges = judge.hedges
    sent = len(chat(fleet))
    assert hedges.sent >= 1  # a's stragglers were hedged ...
    assert hedges.sent <= 0.10 * (sent - hedges.sent)  # ... never more than 10% of the requests
    assert hedges.won + hedges.lost == hedges.sent


async def test_hedge_false_and_a_policy_from_a_mapping(fleet) -> None:
    a, b = fleet
    assert not Judge("m", base_url=[a.base_url, b.base_url], api_key="k", hedge=False).hedging
    tuned = Judge("m", base_url=[a.base_url, b.base_url], api_key="k", hedge={"max_extra": 0.05, "min_samples": 5})
    assert tuned.hedging and tuned._fleet.hedge == HedgePolicy(max_extra=0.05, min_samples=5)
    with pytest.raises(ValueError):
        Judge("m", base_url=[a.base_url, b.base_url], api_key="k", hedge={"max_extr": 0.05})


def test_a_grader_files_judge_hedge(fleet, tmp_path: Path) -> None:
    a, b = fleet
    grader = tmp_path / "grader.yaml"
    grader.write_text(f"""judge:
  model: fake-judge
  hedge: false
  endpoints:
    - {{base_url: "{a.base_url}", api_key: k}}
    - {{base_url: "{b.base_url}", api_key: k}}
type: llm
rubric: semantic_equivalence_en
""", encoding="utf-8")
    from gradekit.graders import load_grader

    configured = load_grader(grader)
    judge = configured._builder.judge()
    assert len(judge.endpoints) == 2 and not judge.hedging


def test_latency_tracker_and_budget() -> None:
    tracker = LatencyTracker(window=100)
    policy = HedgePolicy(min_samples=20)
    for _ in range(19):
        tracker.add(0.1)
    assert tracker.hedge_after(policy) is None  # too few samples: no hedging yet
    tracker.add(0.1)
    after = tracker.hedge_after(policy)
    assert after is not None and 0.2 <= after <= 0.2 * 1.09  # 2 x median beats a p95 equal to it
    for _ in range(100):  # the window forgets: 100 newer samples replace the old ones
        tracker.add(1.0)
    assert tracker.count == 100 and 0.99 <= tracker.quantile(0.5) <= 1.09
    budget = HedgeBudget(0.1)
    spent = 0
    for _ in range(200):
        budget.earned()
        spent += budget.spend()
    assert spent == 20


def test_a_serving_fleet_reports_its_hedges_on_metrics_and_stats(fleet, tmp_path: Path) -> None:
    import yaml

    from gradekit.graders.server._config import parse_server_config

    from ..server.test_server import call
    from ..server.test_server_rl import families, total, urllib_text

    a, b = fleet
    hang = HangFirst({"q-49"})
    a.set_responder(hang)
    b.set_responder(hang)
    (tmp_path / "grader.yaml").write_text(yaml.safe_dump({"type": "llm", "rubric": "semantic_equivalence_en", "judge": {
        "model": "fake-judge", "endpoints": [{"base_url": a.base_url, "api_key": "k"}, {"base_url": b.base_url, "api_key": "k"}]}}),
        encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  grader: grader.yaml\nhedge: true\n", encoding="utf-8")
    assert parse_server_config({"hedge": {"max_extra": 0.05}}).hedge == HedgePolicy(max_extra=0.05)
    assert parse_server_config({"hedge": False}).hedge is False
    proc, url = serve_in(tmp_path)
    try:
        assert "gradekit_judge_hedges" in urllib_text(url + "/metrics")
        for i in range(50):  # one at a time: both endpoints have answered many before q-49 hangs
            status, _, body = call(url, "/compute_reward", {"prompt": "Capital of France?", "response": f"Paris (q-{i})",
                                                            "extra_params": {"answer": "Paris"}})
            assert status == 200, body
        after = families(urllib_text(url + "/metrics"))
        won = total(after, "gradekit_judge_hedges_total", outcome="won")
        assert won >= 1 and total(after, "gradekit_hedges_won_total") == won
        assert total(after, "gradekit_hedges_sent_total") == total(after, "gradekit_judge_hedges_total", outcome="sent") >= won
        hedges = call(url, "/stats")[2]["hedges"]
        assert hedges["won"] == won and hedges["sent"] == hedges["won"] + hedges["lost"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
