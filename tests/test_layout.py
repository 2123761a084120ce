"""The house stays in order: the README's Layout table matches the folders, and no import circle exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("judge", "graders")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Project modules ``name`` imports, at module level or inside functions (TYPE_CHECKING blocks excluded).

    A deferred import still makes a dependency: ``_limiter`` importing ``_shared_limiter`` inside a
    function while ``_shared_limiter`` imports ``_limiter`` is a circle all the same.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def test_no_import_circle() -> None:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)


def test_readme_layout_names_every_folder_and_only_real_ones() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)/` \|", section, re.M))
    for folder in listed:
        assert (ROOT / folder).is_dir(), f"README Layout lists {folder}/, which does not exist"
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_")) and p.name not in {"build", "dist", "venv"}
           and not p.name.endswith(".egg-info")}
    subpackages = {str(p.parent.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).glob("*/__init__.py")}
    missing = (top | subpackages) - listed
    assert not missing, f"folders missing from the README's Layout: {sorted(missing)}"
