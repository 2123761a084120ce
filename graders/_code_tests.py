"""The code_tests grader: run the model's program against test cases, in the sandbox.

The most common code reward in RL: the response's code (the last fenced block, or the whole
response) runs once per test case, each case in a fresh fork of a warm sandboxed zygote (the
same machinery as the python grader, :mod:`gradekit.graders.sandbox`), with a per-case timeout and
memory cap. A case is either stdin/stdout (the program reads the input, its output is compared
line by line, trailing whitespace ignored) or assert-style (test code appended to the program;
the case passes when it runs to the end). The program's own output is compared here, outside
the sandbox, so the program cannot report its own result.

A compile error, a timeout, a crash or a wrong answer is a failed case with its reason in the
Grade's debug lines, never an error of the grader. Only a sample without usable test cases is
``invalid`` and only a sandbox that cannot start is an ``error``.

Test cases come from ``references[tests]`` (default ``tests``), as a list or its JSON text:

- ``[{"input": "1 2\\n", "output": "3\\n"}, ...]`` (also ``stdin``/``stdout`` as keys)
- ``{"inputs": [...], "outputs": [...]}`` (the APPS/TACO layout)
- ``["assert add(1, 2) == 3", ...]``, or one string of test code: one case each.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from ._sample import Grade, Sample
from .sandbox import BACKSTOP, DEFAULT_FILE_MB, DEFAULT_PROCESSES, Limits, Policy, ZygotePool

Scoring = Literal["fraction", "all_or_nothing"]
DEFAULT_CASE_TIMEOUT = 5.0
DEFAULT_CASE_MEMORY_MB = 512
# Modules a contest program usually imports: loaded once in the zygote, so each case's fork is warm.
PRELOAD = ("collections", "itertools", "functools", "heapq", "bisect", "math", "re", "string", "typing", "fractions",
           "decimal", "statistics", "random", "json", "dataclasses", "operator", "copy", "array")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def extract_code(response: str) -> str:
    """The last fenced python (or untagged) block of the response; the whole response if it has none."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(response)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if python:
        return python[-1]
    return response if not blocks else blocks[-1][1]


def read_cases(value: Any) -> list[dict[str, str]]:
    """Test cases as ``{"stdin", "expected"}`` or ``{"tests"}`` dicts; ValueError says what is wrong."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("[", "{"):
            try:
                value = json.loads(text)
            except ValueError:
                value = [text]  # code that happens to start with a bracket
        else:
            value = [text] if text else []
    if isinstance(value, Mapping) and "inputs" in value:
        inputs, outputs = value.get("inputs") or [], value.get("outputs") or []
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        value = [{"input": i, "output": o} for i, o in zip(inputs, outputs)]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of cases, got {type(value).__name__}")
    cases: list[dict[str, str]] = []
    for i, case in enumerate(value, 1):
        if isinstance(case, str):
            cases.append({"tests": case})
        elif isinstance(case, Mapping) and ("input" in case or "stdin" in case or "output" in case or "stdout" in case):
            stdin = case.get("input", case.get("stdin", ""))
            expected = case.get("output", case.get("stdout"))
            cases.append({"stdin": _text(stdin), **({"expected": _text(expected)} if expected is not None else {})})
        else:
            raise ValueError(f"case {i} is neither test code nor an input/output pair")
    if not cases:
        raise ValueError("no test cases")
    return cases


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(map(str, value)) + "\n"
    return value if isinstance(value, str) else json.dumps(value)


def same_output(got: str, expected: str) -> bool:
    """Line by line, trailing whitespace and trailing blank lines ignored (what judges accept)."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(got) == lines(expected)


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


class CodeTestsGrader:
    """Runs a response's program against its test cases; build it with :func:`code_tests_grader`."""

    def __init__(self, *, tests: str, scoring: Scoring, limits: Limits, workers: int, name: str, sandbox: Policy,
                 network: bool, packages: tuple[str, ...]) -> None:
        self.tests, self.scoring, self.limits, self.__name__ = tests, scoring, limits, name
        self.sandbox = sandbox
        self._pool = ZygotePool(name=f"code_tests grader {name!r}", limits=limits, workers=workers, env=None, sandbox=sandbox,
                                network=network, packages=packages, load={"source": None, "preload": [*PRELOAD, *packages]})
        self.isolation = self._pool.isolation

    @property
    def spawned(self) -> int:
        return self._pool.spawned

    async def __call__(self, sample: Sample) -> Grade:
        if self._pool.closed:
            raise RuntimeError(f"code_tests grader {self.__name__!r} is closed")
        if self.tests not in sample.references:
            return Grade.failed("invalid", f"{self.__name__}: the sample has no references.{self.tests} (its test cases)",
                                error_kind="no_tests")
        try:
            cases = read_cases(sample.references[self.tests])
        except ValueError as e:
            return Grade.failed("invalid", f"{self.__name__}: references.{self.tests}: {e}", error_kind="no_tests")
        program = extract_code(sample.response_text)
        timeout = self.limits.timeout
        started = time.perf_counter()
        reply = await self._pool.submit({"op": "run", "program": program, "timeout": timeout,
                                         "cases": [{k: v for k, v in c.items() if k != "expected"} for c in cases]},
                                        timeout * len(cases) + BACKSTOP)
        elapsed = time.perf_counter() - started
        if reply.get("kind") == "load":
            return Grade.failed("error", f"{self.__name__}: the sandbox could not start: {reply.get('error')}", error_kind="load")
        debug: list[str] = []
        if "compile_error" in reply:
            results = [{"ok": False, "error": f"does not compile: {reply['compile_error']}"}] * len(cases)
        elif "cases" in reply:
            results = reply["cases"]
        else:  # the sandbox itself died or hung during this program (the program's doing): its cases fail
            results = [{"ok": False, "error": reply.get("error") or "the sandbox died"}] * len(cases)
        passed = 0
        for i, (case, result) in enumerate(zip(cases, results), 1):
            if not result.get("ok"):
                reason = result.get("error") or "failed"
            elif "expected" in case and not same_output(result.get("stdout", ""), case["expected"]):
                reason = f"wrong output: expected {_short(case['expected'])}, got {_short(result.get('stdout', ''))}"
            else:
                passed += 1
                debug.append(f"case {i}: passed")
                continue
            debug.append(f"case {i}: failed: {reason}")
        fraction = passed / len(cases)
        score = 2 * fraction - 1 if self.scoring == "fraction" else (1.0 if passed == len(cases) else -1.0)
        debug.insert(0, f"{self.__name__}: {passed}/{len(cases)} cases passed -> {score:g} ({elapsed * 1000:.0f} ms)")
        return Grade.scored(score, debug=debug, metrics={"cases": float(len(cases)), "passed": float(passed), "code_s": elapsed})

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._pool.close()


def code_tests_grader(
    *,
    tests: str = "tests",
    scoring: Scoring = "fraction",
    timeout: float = DEFAULT_CASE_TIMEOUT,
    memory_mb: int | None = DEFAULT_CASE_MEMORY_MB,
    workers: int | None = None,
    sandbox: Policy = "auto",
    network: bool = False,
    packages: tuple[str, ...] | list[str] = (),
    processes: int = DEFAULT_PROCESSES,
    file_mb: int = DEFAULT_FILE_MB,
    cpus: int = 1,
    name: str | None = None,
) -> CodeTestsGrader:
    """A grader that runs the response's python program against the sample's test cases.

    Args:
        tests: the references key holding the cases (see the module docstring for the layouts).
        scoring: "fraction" (passed/total mapped to [-1, 1]) or "all_or_nothing" (1 or -1).
        timeout: wall-clock seconds per case; memory_mb: address-space cap per case.
        workers: sandboxed zygotes running programs at once (default: up to 4, one per CPU).
        sandbox, network, packages, processes, file_mb, cpus: as for :func:`graders.python_grader`.
        name: the grader's name in grades.
    """
    if scoring not in ("fraction", "all_or_nothing"):
        raise ValueError(f"scoring must be 'fraction' or 'all_or_nothing', not {scoring!r}")
    limits = Limits(timeout=timeout, memory_mb=memory_mb, processes=processes, file_mb=file_mb, cpus=cpus)
    limits.check(name or "code_tests")
    count = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    if count < 1:
        raise ValueError("workers must be at least 1")
    return CodeTestsGrader(tests=tests, scoring=scoring, limits=limits, workers=count, name=name or "code_tests",
                           sandbox=sandbox, network=network, packages=tuple(packages))
