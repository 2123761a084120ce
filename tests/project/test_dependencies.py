"""Every import is declared, each extra is what gradekit._extras says, and a missing extra is one line and exit 2.

A green suite can hide a broken install: the test extra installs every optional library, so a core
module that imports one (or a package nobody declared) passes here and fails on `pip install gradekit`.
deptry reads the imports against pyproject.toml; the subprocess tests below hide each extra's libraries
(``sys.modules[name] = None``, which import and ``importlib.util.find_spec`` both honour) and drive the
command line as a user without that extra would. CI also installs the core alone in a fresh venv and
runs the README's first command there (.ci/run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import packages_distributions, requires
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gradekit._extras import EXTRAS, MissingExtra, as_missing_extra, extra_of, require
from gradekit.judge.testing import FakeProvider

from ..cases import cases

ROOT = Path(__file__).resolve().parents[2]
# gradekit's own metadata, as pip reads it: Requires-Dist lines, an extra's behind `extra == "NAME"`.
REQUIRES = [Requirement(r) for r in requires("gradekit") or []]


def _core() -> list[Requirement]:
    return [r for r in REQUIRES if r.marker is None or r.marker.evaluate({"extra": ""})]


def _extra(name: str) -> list[Requirement]:
    return [r for r in REQUIRES if r.marker is not None and r.marker.evaluate({"extra": name})]


def _names(requirements: list[Requirement]) -> set[str]:
    return {r.name.lower().replace("_", "-") for r in requirements}


def test_deptry_finds_every_import_declared() -> None:
    done = subprocess.run([sys.executable, "-m", "deptry", "."], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_the_extras_table_is_pyprojects() -> None:
    """Each module gradekit._extras names is installed by a distribution of the extra it names, and `all` has them all."""
    owners = packages_distributions()  # module -> distributions, from what the test venv installed
    for extra, modules in EXTRAS.items():
        declared = _names(_extra(extra))
        assert declared, f"gradekit._extras names an extra {extra!r} that pyproject.toml does not declare"
        for module in modules:
            dists = {d.lower().replace("_", "-") for d in owners.get(module, [])}
            assert dists & declared, f"{module} comes from {sorted(dists)}, not from gradekit[{extra}] ({sorted(declared)})"
    everything = {name for r in _extra("all") for name in r.extras}
    assert set(EXTRAS) <= everything, sorted(set(EXTRAS) - everything)


def test_the_core_declares_none_of_an_extras_libraries() -> None:
    core = _names(_core())
    heavy = {"scipy", "scikit-learn", "matplotlib", "pyarrow", "math-verify", "ray", "duckdb", "fastapi", "redis", "limits"}
    assert core and not core & heavy, sorted(core & heavy)
    # No pin on antlr: Hydra/omegaconf (verl, NeMo-RL, skyrl-train) need 4.9.*, math-verify's extra pins 4.13.2.
    assert not [r for r in REQUIRES if "antlr" in str(r).lower()], "an antlr pin breaks Hydra beside gradekit"


@pytest.mark.parametrize(("error", "extra"), [
    pytest.param(ModuleNotFoundError("No module named 'scipy'", name="scipy.stats"), "calibration", id="dotted"),
    pytest.param(ModuleNotFoundError("No module named 'coredis'", name="coredis"), "redis", id="a dependency of limits"),
    pytest.param(ModuleNotFoundError("No module named 'yaml'", name="yaml"), None, id="core: a bug, not an extra"),
    pytest.param(ImportError("cannot import name 'x' from 'scipy'"), None, id="no name: not guessed"),
])
def test_an_import_error_stands_for_an_extra_only_when_it_names_one(error: ImportError, extra: str | None) -> None:
    missing = as_missing_extra(error, "a feature")
    assert (missing.extra if missing else None) == extra
    if missing:
        assert str(missing) == f"a feature needs {missing.module}, which is not installed: pip install 'gradekit[{extra}]'"


def test_require_names_the_extra_and_finds_installed_ones() -> None:
    require("calibration", "anything")  # installed in the test venv: no error
    assert extra_of("sklearn.metrics") == "calibration" and extra_of("pandas") is None
    with pytest.raises(KeyError):
        require("no-such-extra", "x")


# The command line, with one extra's libraries hidden: (extra, arguments, files the command needs).
DRIVER = r"""
import json, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None  # what an uninstalled package looks like to import and to find_spec
sys.argv = ["gradekit", *json.loads(sys.argv[2])]
from gradekit.graders.cli import main
main()
"""


def _hidden(extra: str) -> list[str]:
    return list(EXTRAS[extra])


def _run(extra: str, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER, json.dumps(_hidden(extra)), json.dumps(args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with FakeProvider() as provider:
        yield provider.base_url


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory, judge_url: str) -> Path:
    """A folder with rows, a graded file and human labels, graded against the loopback fake provider (once per module)."""
    tmp_path = tmp_path_factory.mktemp("extras")
    (tmp_path / "rows.jsonl").write_text('{"id": "q1", "question": "2+2?", "prediction": "4", "references": ["4"]}\n', encoding="utf-8")
    (tmp_path / "human.jsonl").write_text('{"id": "q1", "label": "correct"}\n', encoding="utf-8")
    (tmp_path / "math.yaml").write_text('type: math_equivalence\nexpression: "{{references.answer}}"\n', encoding="utf-8")
    (tmp_path / "server.yaml").write_text("reward:\n  grader: math.yaml\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "gradekit", "grade", "rows.jsonl", "-r", "semantic_equivalence_en", "-o", "out.jsonl",
                           "--base-url", judge_url, "--api-key", "k", "--no-cache"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tmp_path


CASES = cases("missing_extras")


@pytest.mark.parametrize(("extra", "args"), CASES)
def test_a_missing_extra_is_one_line_and_exit_2(graded: Path, extra: str, args: list[str]) -> None:
    done = _run(extra, args, graded, {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"pip install 'gradekit[{extra}]'"), done.stderr
    assert "Traceback" not in done.stderr


def test_grading_needs_no_extra(graded: Path, judge_url: str) -> None:
    """The main job with every extra hidden: a file graded against the judge, every row scored."""
    hidden = sorted({m for modules in EXTRAS.values() for m in modules})
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(hidden),
                           json.dumps(["grade", "rows.jsonl", "-r", "semantic_equivalence_en", "-o", "core.jsonl", "--base-url",
                                       judge_url, "--api-key", "k", "--no-cache"])],
                          cwd=graded, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((graded / "core.jsonl").read_text(encoding="utf-8"))
    assert row["status"] == "ok" and row["score"] is not None


def test_missing_extra_is_an_import_error() -> None:
    """Code that guards an optional import with ``except ImportError`` keeps working."""
    assert issubclass(MissingExtra, ImportError)
