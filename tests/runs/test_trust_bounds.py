"""Issue 48, inputs and bounds: a lone surrogate and a 100,000-deep criteria cell are each one row's error, a number
where /verify takes text is a 422 naming the field, and a row's total time is bounded (a row deadline), not only
each attempt's. Real parts: the sandboxed checker workers, ``gradekit grade`` and ``gradekit serve`` as subprocesses,
the loopback fake provider streaming for ever."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradekit.judge.testing import FakeProvider, Reply

LONE = "\ud800"  # a lone surrogate: a Python str may hold it, no UTF-8 text can


async def test_a_lone_surrogate_in_a_response_is_the_rows_error_at_once_every_time() -> None:
    from gradekit.graders import Sample, math_equivalence_grader

    grader = math_equivalence_grader(workers=1)
    try:
        for _ in range(2):  # the second time too: was a UnicodeEncodeError, then a 20 s TimeoutError for the same pair
            started = time.monotonic()
            grade = await asyncio.wait_for(grader(Sample(messages="q", response=f"\\boxed{{2}}{LONE}", references={"answer": "2"})), 60)
            assert grade.status == "invalid" and grade.error_kind == "input", grade
            assert "surrogate" in grade.error and time.monotonic() - started < 10, (grade.error, time.monotonic() - started)
        fine = await grader(Sample(messages="q", response="\\boxed{2}", references={"answer": "2"}))
        assert fine.status == "ok" and fine.score == 1.0, fine  # the checker is unharmed
    finally:
        await grader.aclose()


def test_a_sandboxed_python_grader_gets_a_lone_surrogate_as_it_was_given() -> None:
    from gradekit.graders import Sample, load_grader

    grader = load_grader({"type": "python", "name": "surrogate", "source": "def grade(sample, item):\n"
                                                                            "    return 1.0 if '\\ud800' in sample['output_text'] else 0.0\n"})
    try:
        grade = asyncio.run(grader(Sample(messages="q", response=f"a{LONE}b")))
    finally:
        asyncio.run(grader.aclose()) if hasattr(grader, "aclose") else None
    assert grade.status == "ok" and grade.score == 1.0, grade  # was: UnicodeEncodeError out of the worker's pipe


def test_a_criteria_cell_nested_100000_deep_is_that_rows_error(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    rows = [{"prompt": "p", "response": "r", "criteria": ["It is short."]},
            {"prompt": "p", "response": "r", "criteria": deep},
            {"prompt": "p", "response": "r", "criteria": ["It is short."]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with FakeProvider() as fake:
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "instruction_checklist", "-o",
                               str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache"],
                              capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-2000:]  # was: RecursionError, exit 1, 0 rows written
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["status"] for r in out] == ["ok", "error", "ok"], out
    assert out[1]["error_kind"] == "input" and "too deeply" in out[1]["error"], out[1]


# ---- a row's deadline: every attempt, retry and re-ask of one row, together ------------------------------------


def _endless(body: dict) -> Reply:
    return Reply(endless="deltas", endless_every=0.2)  # reasoning deltas for ever: no request ever ends on its own


@pytest.mark.timeout(300)
def test_six_never_ending_streams_at_timeout_5_end_within_45_s_each_row_by_its_deadline(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["x"], "prediction": "x"}) + "\n" for i in range(6)))
    with FakeProvider(dialect="vllm-reasoning-parser") as fake:
        fake.set_responder(_endless)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en", "-o",
                               str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache",
                               "--timeout", "5", "--judge-param", "stream=true"], capture_output=True, text=True, timeout=280)
        elapsed = time.monotonic() - started
        sent = len(fake.chat_requests())
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["status"], r["error_kind"]) for r in rows] == [("error", "timeout")] * 6, rows
    assert all("row deadline" in r["error"] and "15 s" in r["error"] for r in rows), rows[0]["error"]
    # Each row stops at its deadline (3 x --timeout = 15 s on the wire): 3 attempts, not 6 (36 requests, 51 s before).
    assert sent <= 6 * 3, sent
    assert elapsed < 45, elapsed  # the issue's bound; the rows' own deadline is 15 s, far below it


def test_a_row_deadline_given_on_the_command_line_or_in_a_file_holds(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"question": "q?", "references": ["x"], "prediction": "x"}) + "\n")
    with FakeProvider(dialect="vllm-reasoning-parser") as fake:
        fake.set_responder(_endless)
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en", "-o",
                               str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache",
                               "--timeout", "2", "--row-deadline", "2", "--judge-param", "stream=true"],
                              capture_output=True, text=True, timeout=120)
        sent = len(fake.chat_requests())
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert done.returncode == 1 and row["error_kind"] == "timeout" and "row deadline (2 s" in row["error"], (row, done.stderr)
    assert sent == 1, sent


@pytest.mark.timeout(300)
def test_serve_bounds_each_rows_time_too(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from ..conftest import serve_in
    from ..server.test_server import call

    with FakeProvider(dialect="vllm-reasoning-parser") as fake:
        fake.set_responder(_endless)
        (tmp_path / "grader.yaml").write_text(json.dumps({
            "type": "llm", "rubric": "semantic_equivalence_en",
            "map": {"question": "prompt", "references": "references.answer", "prediction": "response"},
            "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 5, "params": {"stream": True}}}))
        (tmp_path / "config.yaml").write_text("reward:\n  grader: grader.yaml\nlogging:\n  enable: false\nserver:\n"
                                              "  request_timeout_s: 280\n")
        proc, url = serve_in(tmp_path)
        try:
            started = time.monotonic()
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(lambda i: call(url, "/compute_reward", {"prompt": f"q{i}?", "response": "x",
                                                                                "extra_params": {"answer": "x"}}, timeout=280), range(6)))
            elapsed = time.monotonic() - started
            sent = len(fake.chat_requests())
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
    assert all(status == 200 and body["status"] == "fail" and "row deadline" in body["detail"] for status, _, body in answers), answers
    assert sent <= 6 * 3, sent
    assert elapsed < 45, elapsed
