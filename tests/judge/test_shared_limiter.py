"""`--limiter redis://`: several real `gradekit grade` processes share one provider limit.

Real parts only: a redis-server started here on a free port, `gradekit grade` subprocesses and
the FakeProvider over HTTP. Every assertion counts requests the fake saw, on the fake's own
clock, so a slow machine changes the timing but not the verdict. Each test runs the shared
case next to a control with the in-process limiter, which must break the same rule, so a
test that passes is one that could have failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge import Limiter, SharedLimiter, estimate_tokens, limiter_from_url, load_rubric
from gradekit.judge._client import _COMPLETION_ALLOWANCE
from gradekit.judge.testing import FakeProvider, RecordedRequest, Reply

RUBRIC = "semantic_equivalence_en"
INSTALL = "apt-get install redis-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway redis-server: own port, no persistence, stopped after this module.

    Tests do not collide in it: each runs against its own fake provider, whose base URL is part
    of the budget's key.
    """
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail(f"redis-server is missing; CI must install it ({INSTALL})")
        pytest.skip(f"redis-server is not installed: {INSTALL}")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # a safety net only: the loop waits for the PONG
        while not _pings(port):
            assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
            assert time.monotonic() < deadline, "redis-server did not answer PING within 60 s"
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---- running real gradekit processes ------------------------------------------------------


def _env() -> dict[str, str]:
    # Nothing from the developer's shell decides the limiter, endpoint or cache of these runs.
    return {k: v for k, v in os.environ.items() if not k.startswith(("GRADEKIT_", "OPENAI_"))}


def _rows(path: Path, tag: str, n: int) -> Path:
    """n rows of equal size whose question names the process that grades them."""
    path.write_text("".join(json.dumps({"question": f"{tag}-{i:03d}", "references": ["x"], "prediction": "y"}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _start(tmp_path: Path, tag: str, n: int, base_url: str, *options: str) -> subprocess.Popen[str]:
    source = _rows(tmp_path / f"{tag}.jsonl", tag, n)
    command = [sys.executable, "-m", "gradekit", "grade", str(source), "-r", RUBRIC, "-o", str(tmp_path / f"{tag}-out.jsonl"),
               "--base-url", base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache", "--json", *options]
    return subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str], codes: tuple[int, ...] = (0,)) -> dict:
    """The run's --json summary; exit 1 (some rows are errors) is allowed only where ``codes`` says."""
    out, err = proc.communicate(timeout=300)  # a safety net against a hang, not a speed requirement
    assert proc.returncode in codes, f"exit {proc.returncode}\n{out}\n{err}"
    return json.loads(out)


def _stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=10)


def _who(request: RecordedRequest) -> str:
    """The tag of the process that sent a request, read from the rendered question."""
    text = "".join(m.get("content") or "" for m in (request.body or {}).get("messages", []))
    match = re.search(r"<question>\n(\w+)-\d+\n", text)
    assert match, text[:200]
    return match.group(1)


def _together(*tags: str, then: Callable[[str], Reply | None] = lambda tag: None):
    """A responder that holds each request until every process in ``tags`` has sent one.

    Start-up times differ (more so on a busy machine); held at the fake, the early process cannot
    finish before the late one begins, so the processes always compete. ``then(tag)`` answers.
    """
    seen: set[str] = set()
    everyone: list[asyncio.Event] = []  # made on the fake's event loop, at the first request

    async def respond(body: dict) -> Reply | None:
        if not everyone:
            everyone.append(asyncio.Event())
        tag = _who(RecordedRequest(time=0.0, path="", body=body, headers={}))
        seen.add(tag)
        if seen >= set(tags):
            everyone[0].set()
        await everyone[0].wait()
        return then(tag)

    return respond


def _busiest_second(requests: list[RecordedRequest]) -> int:
    """The most requests the fake received within any one second (its own monotonic clock)."""
    times = sorted(r.time for r in requests)
    return max((sum(1 for u in times if t <= u < t + 1.0) for t in times), default=0)


def _overlap(requests: list[RecordedRequest], a: str, b: str) -> int:
    """Requests received while both processes were sending (proof that the two really competed)."""
    first = {tag: min(r.time for r in requests if _who(r) == tag) for tag in (a, b)}
    last = {tag: max(r.time for r in requests if _who(r) == tag) for tag in (a, b)}
    start, end = max(first.values()), min(last.values())
    return sum(1 for r in requests if start <= r.time <= end)


# ---- requests per second and Retry-After: one run, four processes --------------------------

RPS, ROWS = 10, 20
# What one second of the fake's clock may hold above RPS without the limit being broken: the
# client's pacing bucket, and arrival jitter on a busy machine (a few hundred ms at the pair's
# pace). The provider's own token bucket, never answering 429, is the strict judge; the control
# pair reaches about twice RPS, plus its retries.
SLACK = RPS // 2
HOLD = 2.0  # Retry-After of the one 429 the shared pair's fake injects
CONCURRENCY = 4  # requests in flight per process


@dataclasses.dataclass
class Run:
    together: list[RecordedRequest]  # A and B: --limiter redis://
    apart: list[RecordedRequest]  # C and D: the in-process limiter
    summaries: dict[str, dict]
    injected_at: float  # the fake's clock when it answered A with 429 + Retry-After


@pytest.fixture(scope="module")
def rps_run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Two processes sharing Redis and two on their own, each pair against a fake enforcing RPS req/s.

    Once A and B have both had two answers, the shared pair's fake answers A once with a 429
    carrying Retry-After: 2, as a provider would.
    """
    tmp = tmp_path_factory.mktemp("rps")
    injected: list[float] = []
    answered = {"A": 0, "B": 0}

    def answer(tag: str) -> Reply | None:
        answered[tag] += 1  # the fake answers on one event loop thread: no lock needed
        if tag == "A" and min(answered.values()) >= 2 and not injected:
            injected.append(time.monotonic())  # the fake's clock: RecordedRequest.time is monotonic too
            return Reply(status=429, error_message="slow down", headers={"Retry-After": f"{HOLD:g}"})
        return None

    # A small concurrency: while the fake holds an early starter's requests for its partner, the early
    # one can send only that many, so both have most of their rows left when they compete. (With the
    # default 16, a process that started a second early had sent 16 of its 20 rows into the hold, and
    # the control pair, barely overlapping, sometimes met no 429 at all.)
    # --no-adapt: the told --rps alone paces them. Self-pacing would learn the fake's limit from its
    # rate headers and slow each process down on its own, so the control could meet no 429 (it did).
    pace = ("--rps", str(RPS), "--concurrency", str(CONCURRENCY), "--no-adapt")
    with FakeProvider(rate_limit_rps=RPS, responder=_together("A", "B", then=answer)) as shared, \
            FakeProvider(rate_limit_rps=RPS, responder=_together("C", "D")) as alone:
        procs = {"A": _start(tmp, "A", ROWS, shared.base_url, *pace, "--limiter", redis_url),
                 "B": _start(tmp, "B", ROWS, shared.base_url, *pace, "--limiter", redis_url),
                 "C": _start(tmp, "C", ROWS, alone.base_url, *pace),
                 "D": _start(tmp, "D", ROWS, alone.base_url, *pace)}
        try:
            # Without Redis a row may run out of retries on 429s (exit 1): that is what the control shows.
            summaries = {tag: _finish(proc, (0,) if tag in "AB" else (0, 1)) for tag, proc in procs.items()}
        finally:
            _stop(*procs.values())
        assert injected, "A and B never both sent two requests"
        return Run(shared.chat_requests(), alone.chat_requests(), summaries, injected[0])


def test_processes_sharing_redis_stay_within_the_providers_limit_together(rps_run: Run) -> None:
    together = rps_run.together
    assert _overlap(together, "A", "B") >= RPS  # they really competed, for more than a second's worth
    for tag in "AB":
        summary = rps_run.summaries[tag]
        assert summary["errors"] == 0 and summary["ok"] == ROWS, summary  # nothing rate_limited
    # The provider never had to refuse one: the only 429 is the one injected for the hold test.
    assert sorted(r.status for r in together) == [200] * (2 * ROWS) + [429]
    assert _busiest_second(together) <= RPS + SLACK


def test_the_same_limit_in_each_process_without_redis_exceeds_it(rps_run: Run) -> None:
    """The control: what the shared limiter prevents does happen without it."""
    apart = rps_run.apart
    assert _overlap(apart, "C", "D") >= RPS
    assert sum(r.status == 429 for r in apart) > 0
    assert _busiest_second(apart) > RPS + SLACK


# Requests that may still reach the fake during the hold without the pause being broken: those
# granted before A's hold reached Redis, or sent just before the 429 and read late by the fake. A
# loaded machine delays them by a scheduling slice or two, not by a fixed time, so they are counted,
# not timed. Without the shared pause B alone would send about RPS a second through the hold.
LATE = RPS // 2


def test_a_429_seen_by_one_process_pauses_every_process_sharing_redis(rps_run: Run) -> None:
    together, at = rps_run.together, rps_run.injected_at
    for tag in "AB":
        times = [r.time for r in together if _who(r) == tag]
        # Both were mid-run: each sent before the 429 and after the pause (B had no reason to stop)...
        assert min(times) < at and max(times) > at + HOLD, tag
        # ...and neither sent during it, but for what was already under way (a margin at the end for
        # the hold's millisecond rounding: it started after the 429, so it cannot end before at + HOLD).
        during = [round(t - at, 3) for t in times if at < t < at + HOLD - 0.25]
        assert len(during) <= LATE, (tag, during)


# ---- tokens per minute --------------------------------------------------------------------


def test_tokens_per_minute_are_one_budget_across_processes(redis_url, tmp_path) -> None:
    rubric = load_rubric(RUBRIC)
    messages = rubric.render({"question": "A-000", "references": ["x"], "prediction": "y"}, rubric.ask_modes[0])
    cost = sum(estimate_tokens(m["content"]) for m in messages) + _COMPLETION_ALLOWANCE  # what Judge charges a request
    # The tpm admits 4 requests a minute; each process has 3 rows. On its own budget (in memory)
    # each would send all 3, 6 in all; sharing one budget, the two send 4 and one waits.
    budget, rows = 4, 3
    tpm = budget * cost + cost // 2
    with FakeProvider() as fake:
        procs = [_start(tmp_path, tag, rows, fake.base_url, "--tpm", str(tpm), "--limiter", redis_url) for tag in "AB"]
        try:
            # Wait until both processes have spent tokens, then give a surplus time to show.
            deadline = time.monotonic() + 120  # a safety net only
            while {_who(r) for r in fake.chat_requests()} != {"A", "B"} and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)
            sent = fake.chat_requests()
            waiting = [p.poll() is None for p in procs]
        finally:
            _stop(*procs)  # the rest of the run would wait for the next minute's tokens

    assert {sum(estimate_tokens(m["content"]) for m in r.body["messages"]) for r in sent} == {cost - _COMPLETION_ALLOWANCE}
    assert {_who(r) for r in sent} == {"A", "B"}  # both competed for the tokens
    assert len(sent) == budget < 2 * rows
    assert any(waiting)  # the one short of tokens waits for them; it does not fail rows


# ---- the factory and fail-fast start ------------------------------------------------------


def test_limiter_from_url_builds_the_in_process_limiter_by_default_and_redis_on_request(redis_url) -> None:
    assert type(limiter_from_url(None, rps=3)) is Limiter
    assert type(limiter_from_url("memory://", tpm=1000)) is Limiter
    shared = limiter_from_url(redis_url, rps=3, concurrency=4, key="k")
    assert isinstance(shared, SharedLimiter) and shared.concurrency == 4
    with pytest.raises(ValueError, match="redis://"):
        limiter_from_url("http://127.0.0.1:1", rps=3)


def test_an_unreachable_redis_stops_the_run_before_any_request_and_names_the_url(tmp_path) -> None:
    source = _rows(tmp_path / "in.jsonl", "A", 2)
    url = f"redis://:s3cret@127.0.0.1:{_free_port()}/0"  # nothing listens there
    with FakeProvider() as fake:
        # Through the environment this time (the other tests pass --limiter): GRADEKIT_LIMITER.
        result = CliRunner().invoke(app, ["grade", str(source), "-r", RUBRIC, "-o", str(tmp_path / "o.jsonl"), "--base-url",
                                          fake.base_url, "--api-key", "k", "--no-cache", "--rps", "5"], env={"GRADEKIT_LIMITER": url})
        assert result.exit_code == 2, result.output
        assert "s3cret" not in result.output and "127.0.0.1" in result.output  # the URL is named, its password redacted
        assert "unreachable" in result.output
        assert fake.chat_requests() == []


def test_the_reachability_check_gives_redis_its_timeout_however_slow_the_client_loads(redis_url: str) -> None:
    """On a busy machine importing the Redis client alone can take seconds: the check must not count it.

    The import of coredis is made slower (3.5 s) than the whole check may take (timeout 2 s, joined
    after 3 s); a Redis that answers at once must still be found reachable. It used to be imported on
    the probe's thread, on its clock: four `gradekit grade --limiter redis://` processes starting
    together on a loaded machine exited 2, "unreachable".
    """
    code = f"""
import importlib.abc, sys, time

class SlowImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "coredis":
            time.sleep(3.5)
        return None

sys.meta_path.insert(0, SlowImport())
from gradekit.judge import SharedLimiter
SharedLimiter({redis_url!r}).check(timeout=2)
print("reachable")
"""
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "reachable", done.stderr


def test_server_replicas_take_the_shared_limiter_from_their_config(redis_url: str, tmp_path: Path) -> None:
    """A reward server's limiter.url makes every judge of the replica pace through Redis; a dead URL stops it starting."""
    from gradekit.graders.server import ServerConfigError, build_computer, load_server_config
    from gradekit.judge import SharedLimiter, configure_limiter, process_limiter

    grader = tmp_path / "grader.yaml"
    grader.write_text("type: string_match\nexpression: '{{references.answer}}'\n", encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(f"reward: {{grader: grader.yaml}}\nlimiter: {{rps: 5, url: '{redis_url}', key: replicas}}\n", encoding="utf-8")
    try:
        build_computer(load_server_config(config))
        assert isinstance(process_limiter(), SharedLimiter)
        config.write_text("reward: {grader: grader.yaml}\nlimiter: {rps: 5, url: 'redis://127.0.0.1:1/0'}\n", encoding="utf-8")
        with pytest.raises(ServerConfigError, match=r"limiter: .*redis://127\.0\.0\.1:1/0"):
            build_computer(load_server_config(config))
    finally:
        configure_limiter()  # the next test's judges get an in-process limiter again
