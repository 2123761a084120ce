"""A broken judge stops a run early (the circuit breaker), and what the run says while it goes.

Against the fake provider and real sockets: a judge answering 500 or 401 to everything, one that
dies mid-run, a port where nothing listens. Request counts are asserted, never times.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders import BreakerTripped, load_grader
from gradekit.graders.runs import grade_file, grade_file_with
from gradekit.graders.cli import app
from gradekit.judge import Judge, JudgeCache, Limiter, RetryPolicy, load_rubric
from gradekit.judge.testing import DownJudge, FakeProvider, Reply

from ..conftest import Waits, reference_judge

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
EN = "semantic_equivalence_en"


def write_rows(path: Path, n: int) -> Path:
    rows = [{"id": f"r{i}", "question": f"question {i}", "references": [f"a{i}"], "prediction": f"a{i}" if i % 3 else "no"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def judge_at(base_url: str, tmp_path: Path, *, concurrency: int = 16, cache: bool = True, timeout: float = 5.0) -> Judge:
    # The default retry policy (6 attempts); its waits are recorded, not slept.
    return Judge("fake-judge", base_url=base_url, api_key="k", timeout=timeout, limiter=Limiter(concurrency=concurrency, sleep=Waits()),
                 cache=JudgeCache(tmp_path / "cache.sqlite3") if cache else None, retry=RetryPolicy(), sleep=Waits())


def failing(status: int):
    return lambda body: Reply(status=status, error_message=f"scripted {status}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the judge client: no format fallback for a wrong key or model, URLs in connection errors --


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_auth_and_model_errors_fail_the_row_at_once_without_trying_other_formats(fake, make_judge, status) -> None:
    fake.set_responder(failing(status))
    verdict = await make_judge().judge(load_rubric(EN), {"question": "q", "references": ["a"], "prediction": "a"})
    assert (verdict.status, verdict.error_kind, verdict.usage.requests) == ("error", "bad_request", 1)
    assert f"HTTP {status}" in verdict.error
    assert len(fake.chat_requests()) == 1  # before: one request per output format of the chain


async def test_an_unsupported_format_still_falls_back(make_judge) -> None:
    with FakeProvider(responder=reference_judge, reject_json_schema=True) as fake:
        verdict = await make_judge(base_url=fake.base_url).judge(load_rubric(EN), {"question": "q", "references": ["a"], "prediction": "a"})
    assert verdict.status == "ok" and verdict.read.mode != "json_schema"


async def test_a_connection_error_names_the_url_it_tried(make_judge) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    verdict = await make_judge(base_url=url, retry=RetryPolicy(max_attempts=1)).judge(
        load_rubric(EN), {"question": "q", "references": ["a"], "prediction": "a"})
    assert verdict.error_kind == "server_error"
    assert f"{url}/chat/completions" in verdict.error


# ---- the breaker in the library API -------------------------------------------------------


async def test_a_500_row_run_against_a_judge_answering_500_stops_after_about_50_requests(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 500), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    mapping = {v: v for v in rubric.variables}
    with FakeProvider(responder=failing(500)) as fake:
        async with judge_at(fake.base_url, tmp_path) as judge:
            with pytest.raises(BreakerTripped) as caught:
                await grade_file(judge, rubric, source, out, mapping)
        sent = len(fake.chat_requests())
        # 50 failed requests trip it; at most the 16 in flight then finish. Before: 3,000 requests.
        assert 50 <= sent <= 50 + 16
        trip = caught.value.trip
        assert (trip.kind, trip.base_url, trip.model) == ("server_error", fake.base_url, "fake-judge")
        assert "HTTP 500" in trip.example and "fix it and run the same command again to resume" in str(caught.value)
        assert read(out) == []  # an outage leaves no error rows behind
        assert out.with_name(out.name + ".checkpoint.json").exists()


async def test_a_hanging_judge_trips_on_timeouts(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 500), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    with FakeProvider(responder=lambda body: Reply(delay=30)) as fake:  # never answers within the timeout
        async with judge_at(fake.base_url, tmp_path, timeout=0.2) as judge:
            with pytest.raises(BreakerTripped) as caught:
                await grade_file(judge, rubric, source, out, {v: v for v in rubric.variables})
        assert len(fake.chat_requests()) <= 50 + 16  # before: 3,000 requests of a minute each
    assert caught.value.trip.kind == "timeout" and read(out) == []


async def test_an_outage_mid_run_leaves_only_good_rows_and_the_resume_sends_each_request_once(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 150), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    mapping = {v: v for v in rubric.variables}
    answered = 0

    def flaky(body: dict) -> Reply:
        nonlocal answered
        answered += 1
        return reference_judge(body) if answered <= 60 else Reply(status=503, error_message="overloaded")

    with FakeProvider(responder=flaky) as fake:
        async with judge_at(fake.base_url, tmp_path) as judge:
            with pytest.raises(BreakerTripped) as caught:
                await grade_file(judge, rubric, source, out, mapping)
        written = read(out)
        assert 0 < len(written) < 150 and all(r["status"] == "ok" for r in written)
        assert [r["id"] for r in written] == [f"r{i}" for i in range(len(written))]
        assert caught.value.summary.results.rows == len(written) and caught.value.summary.results.errors == 0
        fake.reset()
        fake.set_responder(reference_judge)
        async with judge_at(fake.base_url, tmp_path) as judge:
            summary = await grade_file(judge, rubric, source, out, mapping)
        # The 60 rows answered before the outage come from the cache, written or not.
        assert len(fake.chat_requests()) == 90
    assert summary.results.errors == 0 and [r["status"] for r in read(out)] == ["ok"] * 150


async def test_the_same_401_on_the_first_rows_stops_the_run_before_most_rows_are_sent(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 200), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    with FakeProvider(responder=failing(401)) as fake:
        async with judge_at(fake.base_url, tmp_path) as judge:
            with pytest.raises(BreakerTripped) as caught:
                await grade_file(judge, rubric, source, out, {v: v for v in rubric.variables})
        assert len(fake.chat_requests()) <= 16 + 3  # the first rows, and those already in flight; before: 800
    assert caught.value.trip.kind == "bad_request" and "HTTP 401" in caught.value.trip.example
    assert read(out) == []


async def test_keep_going_grades_every_row_whatever_the_judge_answers(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 40), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    with FakeProvider(responder=failing(401)) as fake:
        async with judge_at(fake.base_url, tmp_path) as judge:
            summary = await grade_file(judge, rubric, source, out, {v: v for v in rubric.variables}, keep_going=True)
        assert len(fake.chat_requests()) == 40
    assert summary.results.errors == 40 and [r["error_kind"] for r in read(out)] == ["bad_request"] * 40


async def test_a_grader_run_has_the_breaker_too(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 300), tmp_path / "out.jsonl"
    config = tmp_path / "grader.yaml"
    config.write_text(f"type: llm\nrubric: {EN}\nmap: {{references: references.references, prediction: response}}\n", encoding="utf-8")
    with DownJudge() as down:
        grader = load_grader(config, judge=lambda: judge_at(down.base_url, tmp_path, cache=False))
        with pytest.raises(BreakerTripped) as caught:
            await grade_file_with(grader, source, out, {"prompt": "question", "response": "prediction"}, concurrency=16)
        await grader.aclose()
    assert 50 <= down.accepted <= 50 + 16
    assert caught.value.trip.base_url == down.base_url and read(out) == []


# ---- the command line -----------------------------------------------------------------------


def test_a_dead_endpoint_exits_3_naming_url_model_and_how_to_resume(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 500), tmp_path / "out.jsonl"
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    result = runner.invoke(app, ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", url, "--api-key", "k",
                                 "--model", "judge-x", "--no-cache"])
    assert result.exit_code == 3, result.output
    message = " ".join(result.output.split())
    for part in (url, "judge-x", "server_error", "connection to", "fix it and run the same command again to resume"):
        assert part in message
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert out.read_text() == ""


def test_keep_going_on_the_command_line_writes_error_rows_and_exits_1(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 30), tmp_path / "out.jsonl"
    with FakeProvider(responder=failing(403)) as fake:
        args = ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", fake.base_url, "--api-key", "k", "--no-cache"]
        stopped = runner.invoke(app, args)
        assert stopped.exit_code == 3 and "HTTP 403" in stopped.output
        kept_going = runner.invoke(app, [*args, "--keep-going", "--restart"])
    assert kept_going.exit_code == 1, kept_going.output
    assert len(read(out)) == 30


def test_error_rows_keep_the_raw_reply_and_the_attempts(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    rambling = "I think " + "x" * 5000  # no verdict in it
    with FakeProvider(responder=lambda body: Reply(content=rambling)) as fake:
        result = runner.invoke(app, ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache"])
    assert result.exit_code == 1, result.output
    for row in read(out):
        assert row["error_kind"] == "parse_failure"
        assert row["raw_reply"] == rambling[:2000]
        assert row["attempts"] == 3  # the first ask and two re-asks


# ---- progress and Ctrl-C ------------------------------------------------------------------------


# `python -m gradekit` as a terminal starts it: with Python's own SIGINT handler. Where this test
# runs with SIGINT ignored (a background job of a non-interactive shell passes SIG_IGN on to its
# children, and Python keeps an ignored SIGINT ignored), the interrupted run never saw its Ctrl-C.
AT_A_TERMINAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "runpy.run_module('gradekit', run_name='__main__', alter_sys=True)")


def _grade_process(source: Path, out: Path, base_url: str, *extra: str, cache: bool = True) -> subprocess.Popen:
    caching = ["--cache", str(out.with_suffix(".sqlite3"))] if cache else ["--no-cache"]
    return subprocess.Popen([sys.executable, "-c", AT_A_TERMINAL, "grade", str(source), "-r", EN, "-o", str(out), "--base-url", base_url,
                             "--api-key", "k", *caching, "--concurrency", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _interrupt_under_way(process: subprocess.Popen) -> str:
    """Ctrl-C once the run prints its first progress line (it is under way); the stderr it ends with."""
    assert process.stderr is not None
    first = process.stderr.readline()
    assert first.startswith("graded "), first
    process.send_signal(signal.SIGINT)
    return process.communicate(timeout=120)[1]


def test_without_a_terminal_a_progress_line_comes_every_few_seconds(tmp_path) -> None:
    import re

    source, out = write_rows(tmp_path / "in.jsonl", 20), tmp_path / "out.jsonl"
    with FakeProvider(responder=reference_judge, latency=0.05) as fake:  # 20 rows, 2 at a time: half a second
        result = runner.invoke(app, ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                                     "--no-cache", "--concurrency", "2", "--progress-every", "0.05"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("graded ")]
    assert lines, result.output
    for line in lines:
        assert re.fullmatch(r"graded \d+/20 rows, \d+\.\d rows/s, \d+ errors?, ETA (\d+ s|unknown|\d+ min \d+ s)", line), line


def test_ctrl_c_says_how_to_resume_and_the_same_command_finishes(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 40), tmp_path / "out.jsonl"
    stuck = True

    def judge(body: dict) -> Reply:
        # After the first rows the judge hangs, so the interrupt surely lands mid-run.
        return Reply(delay=60) if stuck and "question 1" not in str(body["messages"]) else reference_judge(body)

    with FakeProvider(responder=judge) as fake:
        process = _grade_process(source, out, fake.base_url, "--progress-every", "0.05")
        err = _interrupt_under_way(process)
        assert process.returncode == 130, err
        assert "run the same command again to resume" in err and "Traceback" not in err
        stuck = False
        again = _grade_process(source, out, fake.base_url)
        _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert [r["id"] for r in read(out)] == [f"r{i}" for i in range(40)]


# ---- --retry-errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_retry_errors_grades_again_only_the_transient_error_rows_in_place(tmp_path, suffix) -> None:
    import re

    from gradekit.graders.runs._io import written_rows

    def read(path: Path) -> list[dict]:
        return list(written_rows(path))

    source, out = write_rows(tmp_path / "in.jsonl", 30), tmp_path / f"out{suffix}"
    down = {"7", "17", "27"}  # rows whose requests fail during the first run
    healthy = False

    def judge(body: dict) -> Reply:
        number = re.search(r"question (\d+)", body["messages"][-1]["content"]).group(1)
        if number == "5":
            return Reply(content="no verdict here")  # a parse failure: the judge answered, so it is kept
        if number in down and not healthy:
            return Reply(status=502, error_message="bad gateway")
        return reference_judge(body)

    with FakeProvider(responder=judge) as fake:
        # The first run through the library, so its retries' waits are recorded rather than slept;
        # the same settings as the command line below (model, URL, rubric, mapping), so it is the same run.
        rubric = load_rubric(EN)
        async def first_run() -> None:
            async with judge_at(fake.base_url, tmp_path) as j:
                await grade_file(j, rubric, source, out, {v: v for v in rubric.variables})
        asyncio.run(first_run())
        args = ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                "--model", "fake-judge", "--cache", str(tmp_path / "cache.sqlite3"), "--json"]
        before = read(out)
        assert [r["id"] for r in before if r["error_kind"] == "server_error"] == ["r7", "r17", "r27"]
        again = runner.invoke(app, args)
        assert json.loads(again.stdout)["already_complete"] is True  # before --retry-errors, all a user could get
        healthy = True
        fake.reset()
        retried = runner.invoke(app, [*args, "--retry-errors"])
        assert retried.exit_code == 1, retried.output  # the parse failure is still there
        assert len(fake.chat_requests()) == 3
    after = read(out)
    assert [r["id"] for r in after] == [f"r{i}" for i in range(30)]
    for old, new in zip(before, after):
        if old["id"] in ("r7", "r17", "r27"):
            assert new["status"] == "ok" and new["error"] in (None, "")
        else:
            assert new == old
    summary = json.loads(retried.stdout)
    assert (summary["rows"], summary["ok"], summary["errors"], summary["errors_by_kind"]) == (30, 29, 1, {"parse_failure": 1})
    assert not list(tmp_path.glob("*.retrying*"))
    assert runner.invoke(app, args).exit_code == 1 and json.loads(runner.invoke(app, args).stdout)["already_complete"]


def test_retry_errors_without_an_earlier_run_of_the_command_says_so(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 3), tmp_path / "out.jsonl"
    out.write_text("{}\n", encoding="utf-8")
    result = runner.invoke(app, ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", "http://127.0.0.1:9/v1",
                                 "--api-key", "k", "--retry-errors"])
    assert result.exit_code == 2 and "no checkpoint" in result.output


def test_retry_errors_before_any_output_grades_every_row(tmp_path) -> None:
    # docs/broken-judge.md: with no OUTPUT yet there is nothing to retry, so the run is a first run (exit 0).
    source, out = write_rows(tmp_path / "in.jsonl", 3), tmp_path / "out.jsonl"
    with FakeProvider(responder=reference_judge) as fake:
        result = runner.invoke(app, ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache", "--retry-errors"])
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in read(out)] == ["ok"] * 3


def test_calibrate_lists_disagreements_by_the_on_key(tmp_path) -> None:
    graded = tmp_path / "graded.jsonl"
    graded.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q1", "label": "correct", "score": 1, "status": "ok"},
        {"id": "q2", "label": "incorrect", "score": 0, "status": "ok"},
        {"id": "q3", "label": None, "score": None, "status": "error", "error_kind": "parse_failure", "raw_reply": "hmm"}]))
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"id": f"q{i}", "label": "correct"}) + "\n" for i in (3, 2, 1)))
    result = runner.invoke(app, ["calibrate", str(graded), "--labels", str(labels), "--on", "id", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    listed = result.output.split("disagreements")[1]
    assert "id=q2: human 'correct', judge 'incorrect'" in listed and "id=q3: human 'correct', judge '<parse_failure>'" in listed
    assert "id=q1" not in listed


def test_ctrl_c_under_no_cache_promises_no_cache_hits(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 40), tmp_path / "out.jsonl"

    def judge(body: dict) -> Reply:
        return Reply(delay=60) if "question 1" not in str(body["messages"]) else reference_judge(body)

    with FakeProvider(responder=judge) as fake:
        process = _grade_process(source, out, fake.base_url, "--progress-every", "0.05", cache=False)
        err = _interrupt_under_way(process)
    assert process.returncode == 130, err
    assert "run the same command again to resume" in err and "cache hits" not in err and "come back from the cache" not in err
    assert "judged again" in err


# ---- issue 20/21: every trip names the endpoint and model; a 400 storm and a parse-failure storm ----


async def test_a_400_storm_writes_no_bad_request_rows_and_the_rerun_after_the_fix_grades_them(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 60), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    mapping = {v: v for v in rubric.variables}
    with FakeProvider(responder=failing(400)) as fake:
        async with judge_at(fake.base_url, tmp_path, cache=False) as judge:
            with pytest.raises(BreakerTripped) as caught:
                await grade_file(judge, rubric, source, out, mapping)
        url = fake.base_url
    assert caught.value.trip.kind == "bad_request"
    assert read(out) == []  # before: the first rows written as bad_request error rows
    message = str(caught.value)
    assert url in message and "fake-judge" in message and "unknown" not in message  # before: "(unknown URL) (model unknown)"
    with FakeProvider(responder=reference_judge) as fixed:
        async with judge_at(fixed.base_url, tmp_path, cache=False) as judge:
            summary = await grade_file(judge, rubric, source, out, mapping)
    assert summary.results.errors == 0 and [r["status"] for r in read(out)] == ["ok"] * 60


async def test_a_judge_that_never_answers_in_the_format_trips_the_breaker_on_the_first_rows(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 200), tmp_path / "out.jsonl"
    rubric = load_rubric(EN)
    with FakeProvider(responder=lambda body: Reply(content="I would rather talk about the weather.")) as fake:
        async with judge_at(fake.base_url, tmp_path, cache=False, concurrency=4) as judge:
            with pytest.raises(BreakerTripped) as caught:
                await grade_file(judge, rubric, source, out, {v: v for v in rubric.variables})
        sent = len(fake.chat_requests())
        url = fake.base_url
    assert sent <= 3 * (3 + 4 + 2)  # the first rows and those in flight; before: 3 per row, 600
    assert caught.value.trip.kind == "parse_failure"
    message = str(caught.value)
    assert url in message and "fake-judge" in message and "talk about the weather" in message
    assert read(out) == []


def test_a_parse_failure_storm_exits_3_on_the_command_line(tmp_path) -> None:
    source, out = write_rows(tmp_path / "in.jsonl", 100), tmp_path / "out.jsonl"
    with FakeProvider(responder=lambda body: Reply(content="No idea.")) as fake:
        result = runner.invoke(app, ["grade", str(source), "-r", EN, "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                                     "--model", "judge-y", "--no-cache", "--concurrency", "2"])
        sent = len(fake.chat_requests())
    assert result.exit_code == 3, result.output
    message = " ".join(result.output.split())
    for part in (fake.base_url, "judge-y", "parse_failure", "No idea."):
        assert part in message
    assert sent < 40


def test_a_row_trip_names_the_endpoint_and_model_even_when_no_request_failed_as_broken() -> None:
    from gradekit.judge import Breaker

    breaker = Breaker(first_rows=3)
    for _ in range(3):
        breaker.request(None, base_url="http://judge.example/v1", model="m-1")  # a 400: the client reports it as None
        breaker.row("error", "bad_request", "HTTP 400: bad")
    assert breaker.tripped is not None
    assert "http://judge.example/v1" in breaker.tripped.describe() and "model m-1" in breaker.tripped.describe()
