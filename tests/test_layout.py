"""The house stays in order: the README's Layout table matches the folders (nested packages too), every module
imports on its own in a fresh interpreter, no import circle exists, the README stays a newcomer's page
(under 10,000 characters) and every relative link in README.md and docs/*.md resolves."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("judge", "graders")
README_LIMIT = 10_000


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
    subpackages = {p.parent.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*/__init__.py")}
    missing = (top | subpackages) - listed
    assert not missing, f"folders missing from the README's Layout: {sorted(missing)}"


def _project_modules() -> list[str]:
    """Every importable module of the packages; ``__main__`` modules run a program when imported, so they are left out."""
    names = [_module_name(p) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if p.stem != "__main__"]
    return sorted(set(names))


# Run in one fresh interpreter: third-party libraries are loaded once, then each project module is
# imported first in a forked child, whose sys.modules holds none of the project: the same first-import
# order a user's ``import`` meets, without paying an interpreter and pandas per module.
_FORK_IMPORTS = r"""
import importlib, json, os, sys, traceback
for lib in ("openai", "pydantic", "jinja2", "tenacity", "aiolimiter", "typer", "orjson", "yaml", "pandas", "numpy", "pyarrow", "httpx"):
    try:
        importlib.import_module(lib)
    except Exception:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in ("judge", "graders")], "the preload imported the project"
failed = {}
for module in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write, traceback.format_exc()[-1500:].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed[module] = err or f"exit status {status}"
print(json.dumps(failed))
"""


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """The static read misses circles made at run time (a lazily loaded public name, ``importlib``); importing each
    module first, in an interpreter that holds none of the project, meets them in the order a user's ``import`` would.
    """
    import json

    modules = _project_modules()
    done = subprocess.run([sys.executable, "-c", _FORK_IMPORTS, json.dumps(modules)], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(modules) > 50 and not failed, "modules that do not import on their own:\n" + "\n".join(f"{m}:\n{e}" for m, e in failed.items())


def test_readme_stays_a_newcomers_page() -> None:
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size < README_LIMIT, f"README.md is {size:,} characters (limit {README_LIMIT:,}): move reference to docs/*.md, figures to docs/benchmarks.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters of any script kept), spaces to dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M)}


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not this test's to check offline
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
