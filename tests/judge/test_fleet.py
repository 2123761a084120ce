"""A fleet: one judge model served by several loopback fakes, with routing, failover and one cache.

Shares are asserted on request counts with wide margins, never on times (throughput is measured
in benchmarks/fleet.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradekit.judge import Judge, JudgeCache, Limiter, cache_key, load_rubric
from gradekit.judge.testing import DownJudge, FakeProvider

EN = load_rubric("semantic_equivalence_en")
ROOT = Path(__file__).resolve().parents[2]


def rows(n: int, tag: str = "q") -> list[dict]:
    return [{"question": f"{tag}-{i}", "references": ["x"], "prediction": "x"} for i in range(n)]


def cli(*args: str, env: dict[str, str] | None = None, process: bool = False) -> subprocess.CompletedProcess:
    """The real command: in this process (CliRunner, no interpreter start-up), or as ``gradekit`` in a subprocess."""
    if process:
        return subprocess.run([sys.executable, "-m", "gradekit", *args], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback would have reached the user
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def write_rows(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n, path.stem)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    """Two unlimited fakes shared by the tests that keep both alive."""
    with FakeProvider(latency=0.02) as a, FakeProvider(latency=0.02) as b:
        yield a, b


async def test_requests_follow_each_endpoints_limit() -> None:
    # 10 and 40 req/s, both stating them in rate-limit headers: the faster one answers most rows.
    with FakeProvider(latency=0.02, rate_limit_rps=10, rate_limit_burst=2) as slow, \
            FakeProvider(latency=0.02, rate_limit_rps=40, rate_limit_burst=2) as fast:
        async with Judge("fake-judge", base_url=[slow.base_url, fast.base_url], api_key="k",
                         limiter=Limiter(concurrency=8)) as judge:
            verdicts = await asyncio.gather(*(judge.judge(EN, row) for row in rows(90)))
        answered = [sum(r.status == 200 for r in f.chat_requests()) for f in (slow, fast)]
        refused = slow.rate_limited + fast.rate_limited
    assert all(v.ok for v in verdicts)
    assert sum(answered) == 90
    assert answered[1] >= 2 * answered[0]  # 4x the limit: at least twice the rows
    assert refused <= 45  # paced (with adapt=False the same run met 182 429s)
    stats = judge.endpoints
    assert [e.base_url for e in stats] == [slow.base_url, fast.base_url]
    assert [e.ok for e in stats] == answered and all(e.state == "up" for e in stats)
    assert judge.pacing().mode == "headers" and judge.pacing().rps > 20  # the fleet's rate is the sum of its endpoints'
    # What the limiters held is every endpoint's (the reward server's /metrics reports it), not the first one's alone.
    held = [m.limiter.held_seconds for m in judge._fleet.members]
    assert judge.held_seconds == pytest.approx(sum(held)) and held[0] > 0


async def test_the_cache_key_does_not_depend_on_the_endpoint(pair, tmp_path: Path) -> None:
    a, b = pair
    before = [len(a.chat_requests()), len(b.chat_requests())]
    cache = JudgeCache(tmp_path / "cache.sqlite3")
    async with Judge("fake-judge", base_url=[a.base_url, b.base_url], api_key="k", cache=cache,
                     limiter=Limiter(concurrency=8)) as fleet:
        await asyncio.gather(*(fleet.judge(EN, row) for row in rows(24, "cache")))
    sent = [len(a.chat_requests()) - before[0], len(b.chat_requests()) - before[1]]
    assert sent[1] > 0 and sum(sent) == 24  # the second endpoint answered some rows
    # The first endpoint alone, and the fleet in another make-up, find every reply, whoever gave it.
    for base_url in (a.base_url, [a.base_url, "http://127.0.0.1:9/v1"]):
        async with Judge("fake-judge", base_url=base_url, api_key="other-key", cache=cache, limiter=Limiter()) as again:
            verdicts = [await again.judge(EN, row) for row in rows(24, "cache")]
        assert all(v.ok and v.cached for v in verdicts)
    assert [len(a.chat_requests()) - before[0], len(b.chat_requests()) - before[1]] == sent
    assert fleet.base_url == a.base_url and cache_key(fleet.base_url, {"m": 1}) == cache_key(a.base_url, {"m": 1})
    cache.close()


def test_an_endpoint_killed_mid_run_hands_its_rows_to_the_others(tmp_path: Path) -> None:
    killed = threading.Event()

    async def until_killed(body: dict) -> None:
        """The others answer once the victim is dead: the run cannot end before it, however fast the wire."""
        while not killed.is_set():
            await asyncio.sleep(0.01)

    victim = FakeProvider(latency=0.05).start()

    def kill_once_busy() -> None:
        while len(victim.chat_requests()) < 20:  # not a timer: once it has taken its share of the run
            threading.Event().wait(0.01)
        victim.stop()
        killed.set()

    killer = threading.Thread(target=kill_once_busy, daemon=True)
    killer.start()
    try:
        with FakeProvider(responder=until_killed) as a, FakeProvider(responder=until_killed) as b:
            source, out = write_rows(tmp_path / "kill.jsonl", 300), tmp_path / "out.jsonl"
            result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                         "--base-url", a.base_url, "--base-url", b.base_url, "--base-url", victim.base_url, "--no-cache", "--json",
                         process=True)
    finally:
        killed.set()
        killer.join(timeout=30)
        victim.stop()
    assert result.returncode == 0, result.stderr
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(w["question"] for w in written) == sorted(r["question"] for r in rows(300, "kill"))  # each row once
    assert all(w["status"] == "ok" for w in written)
    summary = json.loads(result.stdout)
    endpoints = summary["endpoints"]
    assert [e["base_url"] for e in endpoints] == [a.base_url, b.base_url, victim.base_url]
    assert set(endpoints[0]) >= {"base_url", "requests", "ok", "rate_limited", "errors", "rps", "state"}
    assert endpoints[2]["requests"] >= 20 and endpoints[2]["state"] in ("down", "probing") and endpoints[2]["errors"] >= 1
    # Every row once; a hedge whose loser was answered in the same instant as its winner is a second 2xx at its endpoint.
    assert summary["ok"] == 300 <= sum(e["ok"] for e in endpoints) <= 300 + summary["hedges"]["sent"], (endpoints, summary["hedges"])
    assert endpoints[0]["state"] == endpoints[1]["state"] == "up"


def test_an_endpoint_that_hangs_past_the_timeout_is_shown_out_of_the_fleet(pair, tmp_path: Path) -> None:
    """Issue 48: one of three endpoints hanging past --timeout was still shown "up" after its request timed out."""
    from gradekit.judge.testing import Reply

    a, b = pair
    with FakeProvider(responder=lambda body: Reply(content="{}", delay=60)) as hung:
        source, out = write_rows(tmp_path / "hang.jsonl", 12), tmp_path / "out.jsonl"
        result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                     "--base-url", a.base_url, "--base-url", b.base_url, "--base-url", hung.base_url, "--no-cache", "--json",
                     "--timeout", "2", "--no-hedge")
        sent_to_hung = len(hung.chat_requests())
    assert result.returncode == 0, result.stderr
    endpoints = json.loads(result.stdout)["endpoints"]
    assert sent_to_hung >= 1 and endpoints[2]["errors"] >= 1, endpoints
    assert endpoints[2]["state"] in ("down", "probing") and "timeout" in (endpoints[2]["reason"] or ""), endpoints[2]
    assert endpoints[0]["state"] == endpoints[1]["state"] == "up"


def test_every_endpoint_dead_stops_the_run_naming_each(tmp_path: Path) -> None:
    source, out = write_rows(tmp_path / "dead.jsonl", 40), tmp_path / "out.jsonl"
    with DownJudge() as first, DownJudge() as second:
        result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                     "--base-url", first.base_url, "--base-url", second.base_url, "--no-cache", "--json")
    assert result.returncode == 3, result.stderr
    assert "every endpoint" in result.stderr and first.base_url in result.stderr and second.base_url in result.stderr
    stopped = json.loads(result.stdout)
    assert stopped["stopped"] == "breaker" and [e["state"] for e in stopped["endpoints"]] == ["down", "down"]
    assert first.accepted < 200 and second.accepted < 200  # stopped early, not after every row's retries


def test_a_single_dead_endpoint_is_reported_down_with_its_reason(tmp_path: Path) -> None:
    source, out = write_rows(tmp_path / "dead.jsonl", 40), tmp_path / "out.jsonl"
    with DownJudge() as only:
        result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                     "--base-url", only.base_url, "--no-cache", "--json")
    assert result.returncode == 3, result.stderr
    (entry,) = json.loads(result.stdout)["endpoints"]
    assert entry["base_url"] == only.base_url and entry["state"] == "down" and entry["reason"] and entry["ok"] == 0


def test_one_endpoint_reports_one_entry_and_key_counts_must_match(pair, tmp_path: Path) -> None:
    a, _ = pair
    source, out = write_rows(tmp_path / "one.jsonl", 3), tmp_path / "out.jsonl"
    result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                 "--base-url", a.base_url, "--no-cache", "--json")
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(result.stdout)["endpoints"]
    assert entry["base_url"] == a.base_url and entry["requests"] == entry["ok"] == 3 and entry["state"] == "up"
    mismatch = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", a.base_url,
                   "--base-url", a.base_url + "/", "--base-url", "http://127.0.0.1:9/v1", "--api-key", "k1", "--api-key", "k2")
    assert mismatch.returncode == 2
    assert "--api-key given 2 times but --base-url 3 times" in mismatch.stderr and "Traceback" not in mismatch.stderr


def test_a_grader_file_declares_its_fleet(pair, tmp_path: Path) -> None:
    a, b = pair
    config = tmp_path / "fleet.yaml"
    config.write_text(f"""type: llm
rubric: semantic_equivalence_en
map: {{question: prompt, references: references.answer, prediction: response}}
judge:
  endpoints:
    - {{base_url: "{a.base_url}", api_key: $FLEET_KEY_A}}
    - {{base_url: "{b.base_url}", api_key: key-b, weight: 2}}
""", encoding="utf-8")
    before = [len(a.chat_requests()), len(b.chat_requests())]
    source, out = tmp_path / "yaml.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"y-{i}", "response": "x", "answer": "x"}) + "\n" for i in range(30)),
                      encoding="utf-8")
    result = cli("grade", str(source), "--grader", str(config), "-o", str(out), "--model", "fake-judge", "--no-cache", "--json",
                 env={"FLEET_KEY_A": "key-a"})
    assert result.returncode == 0, result.stderr
    assert [e["base_url"] for e in json.loads(result.stdout)["endpoints"]] == [a.base_url, b.base_url]
    new_a, new_b = a.chat_requests()[before[0]:], b.chat_requests()[before[1]:]
    assert new_a and new_b and len(new_a) + len(new_b) == 30
    assert {r.headers.get("authorization") for r in new_a} == {"Bearer key-a"}
    assert {r.headers.get("authorization") for r in new_b} == {"Bearer key-b"}
    both = config.read_text(encoding="utf-8").replace("judge:\n", f"judge:\n  base_url: {a.base_url}\n")
    config.write_text(both, encoding="utf-8")
    refused = cli("grade", str(source), "--grader", str(config), "-o", str(tmp_path / "o2.jsonl"), "--no-cache")
    assert refused.returncode == 2 and "base_url or endpoints" in refused.stderr


def test_endpoints_given_wrong_fail_before_any_request() -> None:
    with pytest.raises(ValueError, match="3 API keys for 2 base URLs"):
        Judge("m", base_url=["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"], api_key=["a", "b", "c"])
    with pytest.raises(ValueError, match="FLEET_UNSET_KEY names an environment variable that is not set"):
        Judge("m", endpoints=[{"base_url": "http://127.0.0.1:9/v1", "api_key": "$FLEET_UNSET_KEY"}])
    with pytest.raises(ValueError, match="weight"):
        Judge("m", endpoints=[{"base_url": "http://127.0.0.1:9/v1", "weight": 0}])
    single = Judge("m", base_url="http://127.0.0.1:9/v1", api_key="k", limiter=(limiter := Limiter()))
    assert single.limiter is limiter and len(single.endpoints) == 1 and single.endpoints[0].requests == 0


def test_a_request_waiting_for_room_is_not_overtaken_by_newcomers(tmp_path: Path) -> None:
    # 10, 20 and 30 req/s with headers and 200 ms latency, 64 rows in flight: the fleet's queues fill past their
    # horizon and requests wait unrouted. They wait in line: before, a waiter polled while rows started later took
    # each freed place, so one early row waited ~11 s behind ~700 others in a 900-row run (the in-order output
    # stalled at row 34). A row is now passed only by what was in flight with it (its endpoint's queue, ~60 here).
    fakes = [FakeProvider(latency=0.2, rate_limit_rps=limit).start() for limit in (10.0, 20.0, 30.0)]
    try:
        source, out = write_rows(tmp_path / "line.jsonl", 150), tmp_path / "out.jsonl"
        flags = [x for f in fakes for x in ("--base-url", f.base_url)]
        result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                     *flags, "--no-cache", "--concurrency", "64", process=True)
        sent = sorted((r for f in fakes for r in f.chat_requests()), key=lambda r: r.time)
    finally:
        for fake in fakes:
            fake.stop()
    assert result.returncode == 0, result.stderr
    index = [int(re.search(r"line-(\d+)", json.dumps(r.body)).group(1)) for r in sent]
    refused = {i for i, r in zip(index, sent) if r.status != 200}  # a 429'd row is retried later: passed by design
    answered = [i for i, r in zip(index, sent) if r.status == 200]
    overtaken = max(sum(1 for j in answered[:k] if j > i) for k, i in enumerate(answered) if i not in refused)
    assert overtaken <= 75, overtaken


async def test_a_request_cancelled_while_it_waits_unrouted_leaves_no_turn_behind() -> None:
    """A hedged race cancels its loser; when that loser was waiting unrouted for the first time, its place in
    line stayed behind as a head nobody wakes, and every request after it waited for ever (a killed endpoint
    under load stopped a 300-row run at row 134)."""
    from gradekit.judge._fleet import Router

    router = Router([])
    head = await router.wait_turn(None, 0.01)  # the oldest waiting request: first in line
    loser = asyncio.ensure_future(router.wait_turn(None, 10.0))  # behind it
    await asyncio.sleep(0.01)
    loser.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loser
    router.leave(head)  # the head is routed
    later = await asyncio.wait_for(router.wait_turn(None, 0.01), 2.0)  # a newcomer is head now: it wakes on its own
    router.leave(later)


async def test_a_failed_over_rows_usage_counts_both_endpoints_requests() -> None:
    """Issue 47: the request the broken endpoint refused and the one that answered are both the row's."""
    from gradekit.judge.testing import Reply, auto_reply

    spent = {"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44}
    with FakeProvider(responder=lambda body: Reply(status=503)) as broken, \
            FakeProvider(responder=lambda body: auto_reply(body).model_copy(update={"usage": spent})) as working:
        judge = Judge("fake-judge", base_url=[broken.base_url, working.base_url], api_key="k", limiter=Limiter(concurrency=1))
        async with judge:
            verdicts = [await judge.judge(EN, row) for row in rows(12)]
        refused, answered = broken.chat_requests(), working.chat_requests()
    assert all(v.ok for v in verdicts) and refused and len(answered) == 12
    assert sum(v.usage.requests for v in verdicts) == len(refused) + len(answered)
    assert sum(v.usage.prompt_tokens for v in verdicts) == 40 * 12 and sum(v.usage.completion_tokens for v in verdicts) == 4 * 12
