"""The sandboxed python grader, with real child processes: limits, environment, reuse, failure states."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gradekit.graders import Grade, PythonGrader, Sample, load_grader, python_grader

from ..cases import cases

DATA = Path(__file__).parents[1] / "data" / "graders"

SAMPLE = Sample(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
                response="It is Paris.", references={"answer": "Paris", "max_words": "5"})

PID_SOURCE = """
import os
def evaluate(example, response):
    print("pid", os.getpid())
    return 1.0
"""


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., PythonGrader]]:
    """Build python graders; every one is closed (its workers killed) after the test."""
    made: list[PythonGrader] = []

    def build(source: str | None = None, **kwargs) -> PythonGrader:
        kwargs.setdefault("workers", 1)
        made.append(python_grader(source, **kwargs))
        return made[-1]

    yield build
    for grader in made:
        grader.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pids_in(grade: Grade) -> set[int]:
    return {int(line.split()[1]) for line in grade.debug if line.startswith("pid ")}


# ---- the two flavours -------------------------------------------------------------------------


async def test_vertex_evaluate_gets_the_example_and_the_content(make) -> None:
    grader = make(file=DATA / "reward_vertex.py")
    assert grader.flavour == "vertex"
    grade = await grader(SAMPLE)
    assert grade.status == "ok" and grade.score == 1.0
    assert "comparing 'It is Paris.' with 'Paris'" in grade.debug, "print output comes back as debug lines"
    assert (await grader(SAMPLE.with_response("Lyon"))).score == -1.0


async def test_openai_grade_gets_sample_and_item(make) -> None:
    grader = make(file=DATA / "reward_openai.py")
    assert grader.flavour == "openai"
    assert (await grader(SAMPLE)).score == 1.0  # 3 words <= 5
    long = SAMPLE.with_response("one two three four five six seven")
    assert (await grader(long)).score == pytest.approx(1.0 - (7 - 5) / 5)


async def test_the_child_sees_the_platform_shapes(make) -> None:
    grader = make("""
def evaluate(example, response):
    assert example["systemInstruction"] == {"parts": [{"text": "Be brief."}]}, example
    assert example["contents"] == [{"role": "user", "parts": [{"text": "Capital of France?"}]}], example
    assert example["references"]["answer"] == "Paris"
    assert response == {"role": "model", "parts": [{"text": "It is Paris."}]}, response
    return 0.25
""")
    grade = await grader(SAMPLE)
    assert grade.score == 0.25, grade.error


# ---- limits ----------------------------------------------------------------------------------------


async def test_endless_loop_is_stopped_by_the_timeout_and_the_worker_replaced(make) -> None:
    grader = make("""
import os
def evaluate(example, response):
    print("pid", os.getpid())
    if example["references"]["answer"] == "loop":
        while True:
            pass
    return 1.0
""", timeout=1.5)
    await grader(SAMPLE)
    (before,) = grader.worker_pids  # the worker's pid on the host (pids printed inside are the sandbox's own)
    grade = await grader(Sample(messages="q", response="x", references={"answer": "loop"}))
    assert grade.status == "invalid" and grade.score is None
    assert grade.error_kind == "timeout" and "timed out after 1.5 s" in (grade.error or "")
    assert not alive(before), "the looping call's whole sandbox was killed"
    after = await grader(SAMPLE)
    assert after.score == 1.0
    assert grader.worker_pids != [before], "a fresh worker took its place"
    assert grader.spawned == 2


async def test_memory_hog_is_stopped_by_the_cap(make) -> None:
    grader = make("""
def evaluate(example, response):
    blocks = []
    while True:
        blocks.append(bytearray(16 * 2**20))  # touched pages, 16 MiB at a time
""", memory_mb=200)
    grade = await grader(SAMPLE)
    assert grade.status == "invalid" and grade.error_kind == "memory"
    assert "200 MiB" in (grade.error or "")


async def test_default_memory_cap_is_one_gib(make) -> None:
    grader = make("""
def evaluate(example, response):
    return 1.0 if len(bytes(1200 * 2**20)) else 0.0  # calloc: no pages touched
""")
    assert grader.memory_mb == 1024
    grade = await grader(SAMPLE)
    assert grade.status == "invalid" and grade.error_kind == "memory"
    uncapped = make("""
def evaluate(example, response):
    return 1.0 if len(bytes(1200 * 2**20)) else 0.0  # calloc: no pages touched
""", memory_mb=None)
    assert (await uncapped(SAMPLE)).score == 1.0, "the same code runs without the cap: the cap is what stopped it"


async def test_child_environment_has_no_credentials(make, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.setenv(name, "secret-value-123")
    assert os.environ["OPENAI_API_KEY"] == "secret-value-123"
    grader = make("""
import os
def evaluate(example, response):
    print("env", " ".join(sorted(os.environ)))
    with open("/proc/self/environ", "rb") as f:
        raw = f.read()
    leaked = b"secret-value-123" in raw or "OPENAI_API_KEY" in os.environ
    return -1.0 if leaked else 1.0
""", env={"GRADER_MODE": "strict"})
    grade = await grader(SAMPLE)
    assert grade.score == 1.0, grade.debug
    (env_line,) = [line for line in grade.debug if line.startswith("env ")]
    names = set(env_line.split()[1:])
    assert "OPENAI_API_KEY" not in names and "AWS_SECRET_ACCESS_KEY" not in names
    assert "GRADER_MODE" in names, "variables passed explicitly do reach the child"


# ---- reuse ---------------------------------------------------------------------------------------


async def test_workers_are_reused(make) -> None:
    grader = make(PID_SOURCE, workers=1)
    started = time.perf_counter()
    first = await grader(SAMPLE)
    cold = time.perf_counter() - started
    warm = []
    pids = set(pids_in(first))
    for _ in range(30):
        started = time.perf_counter()
        grade = await grader(SAMPLE)
        warm.append(time.perf_counter() - started)
        pids |= pids_in(grade)
    assert grader.spawned == 1 and len(grader.worker_pids) == 1, "31 calls, one worker"
    assert len(pids) == 31, "each call ran in a fresh fork of it"
    # Measured, not asserted (timing depends on the machine): see the report with -s.
    print(f"\npython grader: first call (process start + load) {cold * 1000:.1f} ms, reused worker median {statistics.median(warm) * 1000:.2f} ms")


async def test_pool_runs_calls_in_parallel_on_at_most_its_size(make) -> None:
    grader = make("""
import os, time
def evaluate(example, response):
    print("pid", os.getpid())
    time.sleep(0.2)
    return 1.0
""", workers=2)
    grades = await asyncio.gather(*(grader(SAMPLE) for _ in range(6)))
    workers = {line.split("(worker ")[1].split(",")[0] for g in grades for line in g.debug if "(worker " in line}
    assert all(g.score == 1.0 for g in grades)
    assert len(workers) == 2 and grader.spawned == 2


# ---- what comes back -----------------------------------------------------------------------------

RETURNS = cases("python_return_values")


@pytest.mark.parametrize(("expression", "score", "error"), RETURNS)
async def test_return_values(make, expression: str, score: float | None, error: str | None) -> None:
    grade = await make(f"def grade(sample, item):\n    return {expression}\n")(SAMPLE)
    assert grade.score == score
    if error is None:
        assert grade.status == "ok"
    else:
        assert grade.status == "invalid" and grade.error_kind == "not_a_number" and error in (grade.error or "")


async def test_exception_is_invalid_with_the_reason_and_the_worker_survives(make) -> None:
    grader = make("""
import os
def grade(sample, item):
    print("pid", os.getpid())
    if item["answer"] == "boom":
        raise KeyError("no such field")
    if item["answer"] == "exit":
        raise SystemExit(3)
    return 1.0
""")
    first = await grader(SAMPLE)
    grade = await grader(Sample(messages="q", response="x", references={"answer": "boom"}))
    assert grade.status == "invalid" and grade.error_kind == "exception"
    assert "KeyError: 'no such field' (line 6, in grade)" in (grade.error or "")
    exited = await grader(Sample(messages="q", response="x", references={"answer": "exit"}))
    assert exited.status == "invalid" and "SystemExit" in (exited.error or "")
    last = await grader(SAMPLE)
    assert last.score == first.score == 1.0 and grader.spawned == 1


async def test_output_on_file_descriptor_one_cannot_corrupt_the_protocol(make) -> None:
    grader = make("""
import os
def grade(sample, item):
    os.write(1, b'{"ok": true, "value": -1.0}\\n')
    return 0.5
""")
    assert (await grader(SAMPLE)).score == 0.5


async def test_load_failures(make, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def evaluate(example, response)\n    return 1\n")
    with pytest.raises(ValueError, match=r"broken\.py: line 1"):
        python_grader(file=broken)
    with pytest.raises(ValueError, match="neither evaluate"):
        python_grader("def score(x):\n    return 1\n")
    with pytest.raises(ValueError, match="both"):
        python_grader("def evaluate(e, r):\n    return 1\ndef grade(s, i):\n    return 1\n")
    grade = await make("import not_a_module_anywhere\ndef evaluate(e, r):\n    return 1\n", name="imports")(SAMPLE)
    assert grade.status == "invalid" and grade.error_kind == "load"
    assert "ModuleNotFoundError" in (grade.error or "") and "'imports'" in (grade.error or "")


async def test_close_kills_the_workers(make) -> None:
    grader = make(PID_SOURCE)
    await grader(SAMPLE)
    (pid,) = grader.worker_pids
    assert alive(pid)
    grader.close()
    assert not alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        await grader(SAMPLE)


async def test_python_grader_from_config() -> None:
    grader = load_grader({"type": "python", "file": str(DATA / "reward_vertex.py"), "timeout": 5, "memory_mb": 512, "workers": 1})
    try:
        assert (await grader(SAMPLE)).score == 1.0
    finally:
        await grader.aclose()
