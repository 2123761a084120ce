"""Case tables kept as data: ``tests/data/cases/<name>.yaml`` read as ``pytest.param`` rows.

A long table of literal cases (input -> expected) is a corpus, not code: its home is a file the test
reads, while the test function keeps the assertion. A file is one YAML mapping ``id: [arg, arg, ...]``
in order (``id: value`` where the test takes one argument; a one-argument list is ``id: [[a, b]]``),
opened by a comment naming the test that reads it and its columns. Anything PyYAML would let pass
quietly is refused here instead: an id given twice, a row of another length than the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

CASES = Path(__file__).resolve().parent / "data" / "cases"


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the last, silently)."""

    path: Path

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise ValueError(f"{self.path}:{key_node.start_mark.line + 1}: the key {key!r} is given twice")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def cases(name: str) -> list[Any]:
    """The rows of ``tests/data/cases/<name>.yaml`` as ``pytest.param(*args, id=id)``, in the file's order."""
    path = CASES / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no case file named {name!r}")
    loader = _Loader(path.read_text(encoding="utf-8"))
    loader.path = path
    try:
        table = loader.get_single_data()
    finally:
        loader.dispose()
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path}: a case file is a mapping of id to row, and not empty")
    rows, arity = [], None
    for key, row in table.items():
        if not isinstance(key, str):
            raise ValueError(f"{path}: the id {key!r} is read as {type(key).__name__}, not text; quote it")
        args = row if isinstance(row, list) else [row]
        if arity is None:
            arity = len(args)
        elif len(args) != arity:
            raise ValueError(f"{path}: the row {key!r} has {len(args)} values, the rows before it {arity}")
        rows.append(pytest.param(*args, id=key))
    return rows
