"""Issue 48: without bubblewrap (root: the ``namespaces`` isolation), the sandbox mounts private tmpfs at /tmp,
/var/tmp and /dev/shm; what the graded code and the math checkers import must stay visible wherever it lives,
a venv under /tmp included. Real sandboxed workers, real packages in real folders under each place."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

PLACES = ("/tmp", "/var/tmp", "/dev/shm")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the namespaces isolation runs as root only (else rlimits, no private mounts)")


@pytest.fixture
def place_dir(request):
    made: list[Path] = []

    def make(place: str) -> Path:
        folder = Path(place) / f"gradekit-test-{uuid.uuid4().hex[:8]}" / "venv" / "site-packages"
        folder.mkdir(parents=True)
        made.append(folder.parents[1])
        return folder

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def _run(code: str, path_entry: Path, path_without_bwrap: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path_without_bwrap, "PYTHONPATH": str(path_entry)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.parametrize("place", PLACES)
def test_a_package_the_graded_code_imports_is_visible_from_a_private_place(place, place_dir, path_without_bwrap) -> None:
    folder = place_dir(place)
    (folder / "planted_helper").mkdir()
    (folder / "planted_helper" / "__init__.py").write_text("ANSWER = 42\n")
    done = _run("""
        import asyncio, warnings
        from gradekit.graders import Sample, python_grader
        warnings.simplefilter("ignore")
        grader = python_grader("import planted_helper\\ndef grade(sample, item):\\n    return planted_helper.ANSWER / 42\\n",
                               packages=["planted_helper"], workers=1, timeout=30)
        print(grader.isolation.kind)
        grade = asyncio.run(grader(Sample(messages="q", response="r")))
        print(grade.status, grade.score, grade.error)
        grader.close()
    """, folder, path_without_bwrap)
    assert done.returncode == 0, done.stderr[-3000:]
    kind, outcome = done.stdout.strip().splitlines()[-2:]
    assert kind == "namespaces", done.stdout
    assert outcome == "ok 1.0 None", done.stdout  # was: an ImportError, the package hidden under the private tmpfs


def test_the_math_checkers_import_their_libraries_from_a_venv_under_dev_shm(place_dir, path_without_bwrap) -> None:
    folder = place_dir("/dev/shm")
    import math_verify

    site = Path(math_verify.__file__).resolve().parents[1]
    for name in ("math_verify", "latex2sympy2_extended", "sympy", "mpmath", "antlr4"):
        shutil.copytree(site / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    done = _run("""
        import asyncio, warnings
        import math_verify
        from gradekit.graders import Sample, math_equivalence_grader
        warnings.simplefilter("ignore")
        assert math_verify.__file__.startswith("/dev/shm/"), math_verify.__file__
        grader = math_equivalence_grader(workers=1)
        grade = asyncio.run(grader(Sample(messages="q", response="\\\\boxed{\\\\frac{1}{2}}", references={"answer": "0.5"})))
        print(grader.isolation.kind, grade.status, grade.score, grade.error_kind)
        asyncio.run(grader.aclose())
    """, folder, path_without_bwrap)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "namespaces ok 1.0 None", done.stdout  # was: verifier_error on every check
