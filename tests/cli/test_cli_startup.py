"""The CLI starts without the heavy libraries: which modules each command imports, read from -X importtime.

Times are not asserted (the machine is shared and noisy); the import list is what makes start-up
fast, and it is exact. benchmarks/cli_startup.py measures the time as a ratio.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider

from ..conftest import reference_judge

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("openai", "numpy", "pandas", "scipy", "sklearn", "matplotlib", "pyarrow", "uvicorn", "fastapi", "starlette", "ray", "duckdb")
SERVER = ("uvicorn", "fastapi", "starlette")
# Every registered command, so a new one is checked without anyone remembering to add it here.
COMMANDS = tuple(command.name for command in app.registered_commands)


def imported(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[set[str], subprocess.CompletedProcess]:
    """Top-level packages a ``python -m gradekit ARGS`` process imported, and the finished process."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "gradekit", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})}, cwd=cwd)
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            module = line.rsplit("|", 1)[1].strip()
            if module != "imported package":
                names.add(module.split(".")[0])
    return names, done


# Everything a help or --version process may import beyond the standard library. A new entry here is a
# start-up cost someone chose: adding `import vcr` to the CLI entry fails the test below, as would any
# library a refactor pulls in at the top of a module.
HELP_ALLOWED = {
    "gradekit",  # gradekit itself (gradekit.graders.cli and the modules it names)
    "typer", "annotated_doc", "shellingham",  # the command line (shellingham: typer's shell detection)
    "rich", "pygments", "markdown_it", "mdurl", "linkify_it", "attr",  # typer's rich help (rich.pretty tries attrs)
    "_distutils_hack", "sitecustomize", "usercustomize", "org",  # the interpreter's site start-up; copy's Jython probe
}
# Standard-library packages that mean a heavy path was taken: the network stack, the event loop, processes.
STDLIB_NOT_ALLOWED = {"asyncio", "ssl", "http", "concurrent", "multiprocessing", "sqlite3", "xml", "unittest", "tkinter", "ctypes"}


def not_allowed(names: set[str]) -> set[str]:
    """The imported top-level names outside the allow-list (an editable install's finder is the installer's)."""
    stdlib = set(sys.stdlib_module_names) - STDLIB_NOT_ALLOWED
    return {n for n in names if n not in stdlib and n not in HELP_ALLOWED and not n.startswith("__editable__")}


@pytest.mark.parametrize("args", [("--help",), ("-h",), ("--version",)] + [(c, "--help") for c in COMMANDS], ids=" ".join)
def test_help_imports_only_the_allow_list(args: tuple[str, ...]) -> None:
    names, done = imported(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert names, "no import lines: -X importtime did not report"
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    assert not not_allowed(names), f"{' '.join(args)} imports {sorted(not_allowed(names))}: outside the allow-list (HELP_ALLOWED)"


def test_h_is_help_and_version_prints_the_version() -> None:
    _, short = imported("-h")
    _, long = imported("--help")
    assert short.stdout == long.stdout and "grade" in short.stdout
    _, version = imported("--version")
    assert version.stdout.startswith("gradekit ")


def test_rubrics_and_render_need_neither_pandas_nor_the_server_stack() -> None:
    names, done = imported("rubrics")
    assert done.returncode == 0 and "semantic_equivalence_zh" in done.stdout
    assert not names & {"pandas", "pyarrow", "numpy", *SERVER}, names
    names, done = imported("render", "-r", "semantic_equivalence_en", "--row", '{"question": "q", "prediction": "p", "references": ["r"]}')
    assert done.returncode == 0 and "<prediction>" in done.stdout, done.stderr[-2000:]
    assert not names & {"pandas", "pyarrow", "numpy", *SERVER}, names


@pytest.mark.parametrize("args", [("rubrics",), ("rubrics", "--json")], ids=" ".join)
def test_rubrics_lists_without_pydantic_or_jinja(args: tuple[str, ...]) -> None:
    """Listing reads the specs as data: no validated models (pydantic costs more than typer and rich together), no templates."""
    names, done = imported(*args)
    assert done.returncode == 0 and "group_rank" in done.stdout, done.stderr[-2000:]
    assert not names & {"pydantic", "pydantic_core", "jinja2", *HEAVY}, sorted(names & {"pydantic", "pydantic_core", "jinja2", *HEAVY})


def test_grade_on_jsonl_loads_no_calibration_or_server_stack(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "q", "prediction": "the answer is 4", "references": ["4"]}\n', encoding="utf-8")
    with FakeProvider(responder=reference_judge) as fake:
        names, done = imported("grade", str(rows), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "out.jsonl"), "--no-cache",
                               env={"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "openai" in names  # the run really reached the judge client
    assert not names & {"scipy", "sklearn", "matplotlib", *SERVER}, sorted(names & {"scipy", "sklearn", "matplotlib", *SERVER})


# Modules in sys.modules when `gradekit --help` has printed (347 at 2026-12-02, this venv). The count is exact and
# repeatable, not a time: a refactor that pulls a few dozen modules into the help path (+19% was 354 -> 392)
# fails here even when every module it pulls is on the allow-list above. Lower it when start-up gets lighter.
HELP_MODULES_BOUND = 365
_COUNT = """
import atexit, sys
atexit.register(lambda: print("MODULES", len(sys.modules), file=sys.stderr))
sys.argv = ["gradekit", "--help"]
from gradekit.graders.cli import main
main()
"""


def test_help_loads_a_bounded_number_of_modules() -> None:
    done = subprocess.run([sys.executable, "-c", _COUNT], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("GRADEKIT_")})
    assert done.returncode == 0 and "grade" in done.stdout, done.stderr[-2000:]
    count = int(done.stderr.rsplit("MODULES", 1)[1].split()[0])
    assert count <= HELP_MODULES_BOUND, f"`gradekit --help` loads {count} modules, more than {HELP_MODULES_BOUND}: what joined its path?"
