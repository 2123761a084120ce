"""docs/platforms.md's failure table held to the conformance tests: every row names the tests that drive the
trainer's own code path, each of those tests exists, and every version or commit a row says it read is the
one its tests copied or installed (the test file names it). A trainer the docs promise is never untested."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "platforms.md"
SECTION = "## What a failed reward becomes, per trainer"
# Every trainer issue 43 names: each must have a row, and each row tests.
TRAINERS = ("slime", "miles", "NeMo Gym", "NeMo-RL", "TRL", "OpenRLHF", "AReaL", "SkyRL", "verl", "ROLL", "verifiers v1", "prime-rl")
VERSION = re.compile(r"(?<![\w.])(\d+\.\d+\.\d+)(?![\w.])|(?<![\w/])([0-9a-f]{7})(?![\w])")


def rows() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[: section.index("\n## ", len(SECTION))]
    table = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in table[1:]]


def defined_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_the_table_has_the_four_columns_and_every_trainer() -> None:
    table = rows()
    assert table and all(len(row) == 4 for row in table), [row[0] for row in table if len(row) != 4]
    names = " ".join(row[0] for row in table)
    assert [t for t in TRAINERS if t not in names] == []


@pytest.mark.parametrize("row", rows(), ids=lambda row: re.sub(r"\W+", "-", row[0]).strip("-"))
def test_each_row_names_existing_tests_that_cite_what_it_read(row: list[str]) -> None:
    trainer, _what, read_from, tested_by = row
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", tested_by)
    assert cited, f"{trainer}: no `tests/<file>.py::<test>` in its tested-by cell"
    files = {}
    for file, name in cited:
        path = ROOT / file
        assert path.is_file(), f"{trainer}: {file} does not exist"
        assert name in defined_in(path), f"{trainer}: {file} has no test {name}"
        files[file] = path.read_text(encoding="utf-8")
    for match in VERSION.finditer(read_from):
        token = match.group(1) or match.group(2)
        assert any(token in text for text in files.values()), \
            f"{trainer}: the docs read {token}, which none of its tests ({', '.join(files)}) copies or names"
