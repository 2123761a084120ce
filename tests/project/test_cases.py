"""The case files (tests/data/cases/): each loads, and each is read by the test its first line names.

A case file no test reads would be a corpus nobody checks; one whose header names another test sends the
next reader to the wrong place. The loader's refusals (an id twice, rows of two lengths) are what keep a
YAML table from losing a case in silence.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.cases import CASES, cases

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(CASES.glob("*.yaml"))
HEADER = re.compile(r"# Read by (tests/\S+\.py)::(\w+)\.")


def test_there_are_case_files() -> None:
    assert len(FILES) >= 20, FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_case_file_loads_and_is_read_by_the_test_it_names(path: Path) -> None:
    rows = cases(path.stem)
    assert rows and len({row.id for row in rows}) == len(rows)
    header = HEADER.match(path.read_text(encoding="utf-8").splitlines()[0])
    assert header, f"{path.name}: the first line names the test that reads it (# Read by tests/...py::test_name.)"
    test_file, test_name = header.groups()
    assert test_name in _readers(ROOT / test_file, path.stem), f"{test_file}: {test_name} does not read cases({path.stem!r})"


def _reads(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "cases"
               and [a.value for a in n.args if isinstance(a, ast.Constant)] == [name] for n in ast.walk(node))


def _readers(test_file: Path, name: str) -> set[str]:
    """The test functions whose parametrize reads ``cases(name)``, directly or through a module constant."""
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    constants = {t.id for node in tree.body if isinstance(node, ast.Assign) and _reads(node.value, name)
                 for t in node.targets if isinstance(t, ast.Name)}
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if any(_reads(d, name) or any(isinstance(n, ast.Name) and n.id in constants for n in ast.walk(d))
                   for d in node.decorator_list)}


@pytest.mark.parametrize(("text", "refusal"), [
    pytest.param("a: [1, 2]\na: [3, 4]\n", "the key 'a' is given twice", id="id_twice"),
    pytest.param("a: [1, 2]\nb: [3]\n", "the row 'b' has 1 values, the rows before it 2", id="rows_of_two_lengths"),
    pytest.param("yes: [1]\n", "is read as bool, not text", id="id_read_as_a_bool"),
    pytest.param("- [1]\n", "a mapping of id to row", id="a_list"),
])
def test_the_loader_refuses_what_yaml_would_let_pass(monkeypatch, tmp_path: Path, text: str, refusal: str) -> None:
    import tests.cases as module

    (tmp_path / "broken.yaml").write_text(text, encoding="utf-8")
    monkeypatch.setattr(module, "CASES", tmp_path)
    with pytest.raises(ValueError, match=re.escape(refusal)):
        module.cases("broken")
