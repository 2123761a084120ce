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
