"""Every fenced shell command in README.md and docs/*.md runs, offline, against the fake judge, and exits as documented.

A doc cannot drift from the tool: a renamed flag, a moved file or a changed exit status fails here.
Each page's ``bash`` blocks run in order in one temporary folder (so a block may use what an earlier
one wrote), each block as one ``bash -e`` script, with ``gradekit`` and ``python`` being this
checkout's, the judge a loopback ``FakeProvider`` (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` point at it)
and the placeholders the pages use (``rows.jsonl``, ``human.jsonl``, ``sk-...``, the fake's example
URL) made real.

A block that cannot run offline (a real provider, a Ray cluster or Redis, ``pip install``, a server
that runs until Ctrl-C, a synopsis with ``[...]``) is skipped only when it says why: a
``<!-- no-test: why -->`` line right before its fence, or an entry in ``REVIEWED`` below (for pages
whose fences are shared with other readers). A block documented to exit otherwise than 0 says
``<!-- exits: N -->`` before its fence. Nothing else is skipped and no failure is ignored.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.judge.testing import FakeProvider

from ..conftest import reference_judge

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:^<!-- (?P<kind>no-test|exits): (?P<note>.*?) -->\n)?^```(?:bash|sh|shell)\n(?P<body>.*?)^```", re.M | re.S)
EXAMPLE_URL = "http://127.0.0.1:40123/v1"  # the fake judge's URL as README.md shows it

# Blocks that cannot run offline, each with the reason, reviewed: (page, a text the block contains) -> why.
REVIEWED: dict[tuple[str, str], str] = {
    ("README.md", "pip install"): "installs into a fresh venv and runs the whole suite: what .ci/run itself does",
    ("docs/grading.md", "https://api.openai.com/v1"): "a real provider and a key",
    ("docs/judge-trust.md", "[--json]"): "a synopsis: [...] marks optional flags",
    ("docs/large-runs.md", "big.parquet"): "a million-row file, killed and resumed by hand",
    ("docs/large-runs.md", "--max-cost 5"): "a real model's prices and a user's rubric file",
    ("docs/large-runs.md", "redis://"): "a Redis server",
    ("docs/ray.md", "ray start"): "a Ray cluster and a Redis cache host",
    ("docs/server.md", "gradekit serve"): "serves until stopped",
    ("docs/server.md", "curl -s localhost:8000"): "requests to the server the block above starts",
    ("docs/view.md", "pip install"): "pip install",
}

ROWS = [{"id": "q1", "question": "What is 2+2?", "prediction": "4", "references": ["4"], "prompt_id": "p1"},
        {"id": "q2", "question": "Capital of Canada?", "prediction": "Toronto", "references": ["Ottawa"], "prompt_id": "p1"},
        {"id": "q3", "question": "Who wrote Hamlet?", "prediction": "Shakespeare", "references": ["William Shakespeare", "Shakespeare"],
         "prompt_id": "p2"}]
# "grader.yaml": a grader every export target takes (scores 0..1).
GRADER = """type: string_match
name: exact_answer
expression: "{{references.answer}}"
operation: EXACT_MATCH
correct: 1
wrong: 0
"""
HUMAN = [{"id": "q1", "label": "correct"}, {"id": "q2", "label": "incorrect"}, {"id": "q3", "label": "correct"}]


def blocks(page: Path) -> list[tuple[str, str | None, str | None]]:
    """``(body, kind, note)`` of each shell block of ``page``, in order."""
    return [(m["body"], m["kind"], m["note"]) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def _workspace(tmp_path: Path, fake_url: str, graded: Path) -> tuple[Path, dict[str, str]]:
    """A folder that looks like the repository a reader has open, with the files the pages assume, and its env."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("eval_sets", "prompts", "benchmarks", "docs"):  # read only: linked
        (work / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "examples", work / "examples")  # a block may cd there and write: copied
    for folder in (work, work / "examples" / "graders"):  # the placeholders, where a page's commands run
        for name in ("rows.jsonl", "data.jsonl"):  # not samples.jsonl: examples/graders ships it, and a page must not run a missing file
            (folder / name).write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
        (folder / "human.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HUMAN), encoding="utf-8")
        (folder / "human.csv").write_text("id,label\n" + "".join(f"{r['id']},{r['label']}\n" for r in HUMAN), encoding="utf-8")
        for name in ("out.jsonl", "graded.jsonl"):  # "a graded file": the rows above, graded by the fake judge
            shutil.copy(graded, folder / name)
    for path in (ROOT / "examples" / "graders").iterdir():  # "math_answer.yaml" and its files, as from examples/graders
        shutil.copy(path, work / path.name)
    (work / "grader.yaml").write_text(GRADER, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, run in (("gradekit", f'exec "{sys.executable}" -m gradekit "$@"'), ("python", f'exec "{sys.executable}" "$@"'),
                      ("python3", f'exec "{sys.executable}" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{run}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADEKIT_", "OPENAI_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), OPENAI_BASE_URL=fake_url,
               OPENAI_API_KEY="fake", HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"), NO_COLOR="1",
               COLUMNS="120")
    return work, env


def _reviewed(page: str, body: str) -> str | None:
    return next((why for (name, text), why in REVIEWED.items() if name == page and text in body), None)


def _runnable(body: str, fake_url: str) -> str:
    """The block as a script: placeholders made real (the example URL becomes the fake's, ``sk-...`` a key)."""
    return body.replace(EXAMPLE_URL, fake_url).replace("sk-...", "fake")


def test_every_block_is_run_or_says_why_not() -> None:
    """The skip list holds no stale entry: each names a block that exists."""
    texts = {page.relative_to(ROOT).as_posix(): [b for b, _, _ in blocks(page)] for page in PAGES}
    stale = [key for key in REVIEWED if not any(key[1] in b for b in texts.get(key[0], []))]
    assert not stale, f"REVIEWED entries that match no block (the doc changed): {stale}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The placeholder rows graded once by the fake judge, for the pages that start from "a graded file"."""
    folder = tmp_path_factory.mktemp("graded")
    rows = folder / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    with FakeProvider(responder=reference_judge) as fake:
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(rows), "-r", "semantic_equivalence_en", "-o",
                               str(folder / "out.jsonl"), "--no-cache"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "fake",
                                   "XDG_CACHE_HOME": str(folder / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / "out.jsonl"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documented_commands_run(page: Path, tmp_path: Path, graded: Path) -> None:
    name = page.relative_to(ROOT).as_posix()
    ran = 0
    with FakeProvider(responder=reference_judge) as fake:
        work, env = _workspace(tmp_path, fake.base_url, graded)
        for number, (body, kind, note) in enumerate(blocks(page), 1):
            if kind == "no-test" or _reviewed(name, body):
                continue
            expected = int(note) if kind == "exits" else 0
            script = "set -e -o pipefail\ntrap 'echo \"failed: $BASH_COMMAND\" >&2' ERR\n" + _runnable(body, fake.base_url)
            done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == expected, (
                f"{name}, shell block {number}: exit {done.returncode}, documented {expected}\n{body}\n"
                f"stdout:\n{done.stdout[-1500:]}\nstderr:\n{done.stderr[-2500:]}")
            ran += 1
    if name == "README.md":
        assert ran >= 2, "README.md: the newcomer's offline path (grade against the fake judge, report) no longer runs"


def test_readme_fake_judge_script_answers_as_documented(tmp_path: Path) -> None:
    """The README's no-key path, whose server block cannot run in the loop above: its ``echo`` writes a script that
    ``python -m gradekit.judge.testing --script`` takes, and the judge then answers with the script's reply, not its default."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b, _, _ in blocks(ROOT / "README.md") if "python -m gradekit.judge.testing --script" in b)
    echo = next(line for line in block.splitlines() if line.startswith("echo "))
    row = re.search(r"```json\n(\{.*\})\n```", readme.split("## Grade your own file", 1)[1]).group(1)
    (tmp_path / "rows.jsonl").write_text(row + "\n", encoding="utf-8")
    subprocess.run(["bash", "-c", echo], cwd=tmp_path, check=True, timeout=30)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    server = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--script", "replies.jsonl"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()  # the documented first line: its URL
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), (url, server.stderr.read() if server.poll() is not None else "")
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", "rows.jsonl", "-r", "semantic_equivalence_en", "-o", "out.jsonl"],
                              cwd=tmp_path, env={**env, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "fake"}, capture_output=True,
                              text=True, timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    graded = json.loads((tmp_path / "out.jsonl").read_text(encoding="utf-8"))
    scripted = json.loads(json.loads(Path(tmp_path / "replies.jsonl").read_text(encoding="utf-8"))["content"])
    assert (graded["label"], graded["rationale"]) == (scripted["judgement"], scripted["rationale"]) != ("correct", "auto reply")
    assert server.returncode == 0  # SIGTERM ends it cleanly, as Ctrl-C does
