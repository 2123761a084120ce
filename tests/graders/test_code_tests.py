"""The code_tests grader and the sandbox policy, with real sandboxed processes and the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gradekit.graders._code_tests import CodeTestsGrader, code_tests_grader, extract_code, read_cases
from gradekit.graders import GraderConfigError, Sample, load_grader
from gradekit.graders.cli import app

ROOT = Path(__file__).resolve().parents[2]
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
CASES = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"}, {"input": "2 2", "output": "5"}]


def program(response: str, tests=CASES) -> Sample:
    return Sample(messages="Add two numbers.", response=response, references={"tests": tests})


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., CodeTestsGrader]]:
    made: list[CodeTestsGrader] = []

    def build(**kwargs) -> CodeTestsGrader:
        kwargs.setdefault("workers", 1)
        made.append(code_tests_grader(**kwargs))
        return made[-1]

    yield build
    for grader in made:
        grader.close()


@pytest.mark.parametrize(("response", "code"), [
    pytest.param("print(1)", "print(1)", id="whole_response"),
    pytest.param("Here:\n```python\nprint(2)\n```\nand better:\n```py\nprint(3)\n```", "print(3)\n", id="last_python_block"),
    pytest.param("```text\nout\n```\n```\nprint(4)\n```", "print(4)\n", id="untagged_over_other_language"),
])
def test_extract_code(response: str, code: str) -> None:
    assert extract_code(response) == code


@pytest.mark.parametrize(("value", "cases"), [
    pytest.param([{"input": "1", "output": "2"}], [{"stdin": "1", "expected": "2"}], id="pairs"),
    pytest.param('{"inputs": ["1"], "outputs": ["2"]}', [{"stdin": "1", "expected": "2"}], id="apps_json"),
    pytest.param(["assert f(1) == 2"], [{"tests": "assert f(1) == 2"}], id="asserts"),
    pytest.param("assert f(1) == 2\nassert f(2) == 3", [{"tests": "assert f(1) == 2\nassert f(2) == 3"}], id="one_test_string"),
])
def test_read_cases(value, cases) -> None:
    assert read_cases(value) == cases


async def test_stdin_stdout_cases_give_the_fraction_mapped_to_the_reward_range(make) -> None:
    grade = await make()(program(ADD))
    assert grade.status == "ok" and grade.score == pytest.approx(2 * (2 / 3) - 1)
    assert grade.debug[1:] == ["case 1: passed", "case 2: passed", "case 3: failed: wrong output: expected '5', got '4\\n'"]
    assert grade.metrics["passed"] == 2 and grade.metrics["cases"] == 3


async def test_all_or_nothing(make) -> None:
    grader = make(scoring="all_or_nothing")
    assert (await grader(program(ADD))).score == -1.0
    assert (await grader(program(ADD, CASES[:2]))).score == 1.0


async def test_assert_cases_and_early_exit_does_not_skip_them(make) -> None:
    grader = make()
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]
    assert (await grader(program("def add(a, b):\n    return a + b\n", tests))).score == 0.0
    for cheat in ("import sys\ndef add(a, b):\n    return 0\nsys.exit(0)\n", "import os\ndef add(a, b):\n    return 0\nos._exit(0)\n"):
        grade = await grader(program(cheat, tests))
        assert grade.score == -1.0, grade.debug


async def test_compile_error_timeout_and_crash_are_failed_cases_not_grader_errors(make) -> None:
    grader = make(timeout=1)
    broken = await grader(program("print(", CASES[:1]))
    assert broken.status == "ok" and broken.score == -1.0 and "does not compile: SyntaxError" in broken.debug[1]
    spin = await grader(program("while True:\n    pass\n", CASES[:1]))
    assert spin.status == "ok" and spin.score == -1.0 and "timed out after 1 s" in spin.debug[1]
    crash = await grader(program("raise ValueError('nope')", CASES[:1]))
    assert crash.score == -1.0 and "ValueError: nope (line 1" in crash.debug[1]
    hog = await make(memory_mb=100)(program("x = bytearray(400 * 2**20)", CASES[:1]))
    assert hog.score == -1.0 and "MemoryError" in hog.debug[1]
    assert (await grader(program(ADD, CASES[:2]))).score == 1.0, "the grader goes on after all that"


async def test_missing_or_broken_cases_are_invalid(make) -> None:
    grader = make()
    missing = await grader(Sample(messages="q", response=ADD))
    assert missing.status == "invalid" and missing.error_kind == "no_tests"
    broken = await grader(program(ADD, {"inputs": ["1"], "outputs": []}))
    assert broken.status == "invalid" and "1 inputs but 0 outputs" in (broken.error or "")


async def test_each_case_starts_clean(make) -> None:
    """State a case leaves (a file, a patched module) is gone in the next case."""
    leaky = "import os, json\nprint('seen' if os.path.exists('/tmp/mark') or hasattr(json, 'mark') else 'clean')\n" \
            "json.mark = 1\ntry:\n    open('/tmp/mark', 'w').write('1')\nexcept OSError:\n    pass\nopen('mark', 'w').write('1')\n"
    grade = await make()(program(leaky, [{"input": "", "output": "clean"}] * 3))
    assert grade.score == 1.0, grade.debug


async def test_code_tests_from_config(tmp_path: Path) -> None:
    config = tmp_path / "code.yaml"
    config.write_text(yaml.safe_dump({"type": "code_tests", "timeout": 3, "workers": 1, "scoring": "fraction"}))
    grader = load_grader(config)
    try:
        assert set(grader.sandboxes) == {"code_tests"}
        assert (await grader(program(ADD, CASES[:2]))).score == 1.0
    finally:
        await grader.aclose()
    with pytest.raises(GraderConfigError, match="scoring"):
        load_grader({"type": "code_tests", "scoring": "half"})
    with pytest.raises(GraderConfigError, match="sandbox"):
        load_grader({"type": "code_tests", "sandbox": "maybe"})


async def test_declared_packages_are_importable_and_others_are_not(make) -> None:
    grader = make(packages=["yaml"])
    ok = await grader(program("import yaml\nprint(yaml.safe_load('a: 1')['a'])", [{"input": "", "output": "1"}]))
    assert ok.score == 1.0, ok.debug
    undeclared = await make()(program("import yaml\nprint(1)", [{"input": "", "output": "1"}]))
    assert undeclared.score == -1.0 and "ModuleNotFoundError" in undeclared.debug[1]


# ---- the sandbox policy on the command line --------------------------------------------------------


def cli_files(tmp_path: Path) -> tuple[Path, Path]:
    example = tmp_path / "example.json"
    example.write_text(json.dumps({"contents": [{"role": "user", "parts": [{"text": "Add."}]}], "references": {"tests": json.dumps(CASES[:2])}}))
    response = tmp_path / "response.txt"
    response.write_text(ADD)
    return example, response


def validate_in_process(config: Path, tmp_path: Path) -> tuple[int, str, str]:
    example, response = cli_files(tmp_path)
    result = CliRunner().invoke(app, ["validate", "--grader", str(config), "--example", str(example), "--response", str(response)])
    return result.exit_code, result.stdout, result.stderr


def run_validate(config: Path, tmp_path: Path, *, path: str | None = None) -> subprocess.CompletedProcess[str]:
    example, response = cli_files(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "gradekit", "validate", "--grader", str(config), "--example", str(example),
                           "--response", str(response)], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)


def test_strict_without_bubblewrap_exits_2_naming_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "strict.yaml"
    config.write_text("type: code_tests\nsandbox: strict\nworkers: 1\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no bwrap on the PATH: the probe finds none
    code, _, err = validate_in_process(config, tmp_path)
    assert code == 2, err
    assert "sandbox: strict needs bubblewrap" in err and "apt-get install bubblewrap" in err


def test_auto_without_bubblewrap_warns_once_and_still_grades(tmp_path: Path, path_without_bwrap: str) -> None:
    config = tmp_path / "auto.yaml"
    config.write_text("type: code_tests\nworkers: 1\n")
    done = run_validate(config, tmp_path, path=path_without_bwrap)
    assert done.returncode == 0, done.stderr
    assert "reward: 1" in done.stdout
    gap = "filesystem isolation for reads" if os.geteuid() == 0 else "network isolation"
    assert done.stderr.count("SandboxWarning") == 1 and f"not enforced: {gap}" in done.stderr
    assert "WARNING: code_tests runs without bubblewrap" in done.stdout
    if os.geteuid() == 0:
        assert "code_tests  namespaces without bubblewrap (as nobody" in done.stdout, done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is for root: not root, auto runs with rlimits (and says so)")
def test_auto_as_root_without_bubblewrap_or_namespaces_exits_2(tmp_path: Path) -> None:
    """Root with neither bwrap nor util-linux's unshare/setpriv: graded code would run as root in the
    host's namespaces, so auto refuses, naming both ways out."""
    config = tmp_path / "auto.yaml"
    config.write_text("type: code_tests\nworkers: 1\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    done = run_validate(config, tmp_path, path=str(empty))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "apt-get install bubblewrap" in done.stderr and "sandbox: none" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_validate_says_none_loudly(tmp_path: Path) -> None:
    config = tmp_path / "none.yaml"
    config.write_text("type: code_tests\nsandbox: none\nworkers: 1\n")
    code, out, err = validate_in_process(config, tmp_path)
    assert code == 0, err
    assert out.startswith("WARNING: code_tests runs with sandbox: none: its code is NOT isolated"), out
    assert "sandbox:\n  code_tests  NONE" in out


# ---- export to a standalone Vertex evaluate() ----------------------------------------------------


async def test_exported_vertex_evaluate_gives_the_same_rewards(make, tmp_path: Path) -> None:
    from gradekit.graders.platforms import ExportError, export_openai_grader, export_vertex_evaluate, export_vertex_spec

    exported = tmp_path / "reward.py"
    exported.write_text(export_vertex_evaluate({"type": "code_tests", "timeout": 2}))
    programs = [ADD, "print(", "a, b = map(int, input().split())\nprint(a * b)\n", "import os\nprint(3)\nos._exit(0)\n"]
    asserts = ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]
    rows = [(p, CASES) for p in programs] + [("def add(a, b):\n    return a + b\n", asserts), ("import sys\nsys.exit(0)\n", asserts)]
    grader = make(timeout=2)
    expected = [(await grader(program(code, tests))).score for code, tests in rows]
    driver = (f"ns = {{}}\nexec(open({str(exported)!r}).read(), ns)\nimport json\n"
              f"for code, tests in json.loads({json.dumps(json.dumps(rows))}):\n"
              "    example = {'contents': [{'role': 'user', 'parts': [{'text': 'q'}]}], 'references': {'tests': json.dumps(tests)}}\n"
              "    print(ns['evaluate'](example, {'role': 'model', 'parts': [{'text': code}]}))\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", driver], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [float(x) for x in done.stdout.split()] == pytest.approx(expected), (expected, done.stdout)
    spec = export_vertex_spec({"type": "code_tests"})
    assert "def evaluate(example, response)" in spec["reinforcementTuningSpec"]["singleRewardConfig"]["codeExecutionRewardScorer"]["pythonCodeSnippet"]
    with pytest.raises(ExportError, match="Vertex's evaluate\\(\\) only"):
        export_openai_grader({"type": "code_tests"})
