"""The row-values cache shortcut: a warm re-run skips rendering, and never serves a stale prompt."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from gradekit.judge import JudgeCache, load_rubric

from ..conftest import verdict_json

ROW = {"question": "What is 2+2?", "references": ["4"], "prediction": "four"}


def _row_keys(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM row_keys").fetchone()[0]


def _copy_rubric(tmp_path: Path) -> Path:
    shipped = load_rubric("semantic_equivalence_en").directory
    for name in ("semantic_equivalence_en.yaml", "semantic_equivalence_en.j2"):
        shutil.copy(shipped / name, tmp_path / name)
    return tmp_path / "semantic_equivalence_en.yaml"


async def test_second_judge_hits_by_row_values(fake, make_judge, tmp_path) -> None:
    rubric = load_rubric("semantic_equivalence_en")
    cache = JudgeCache(tmp_path / "c.sqlite3")
    fake.push(verdict_json("correct"))
    first = await make_judge(cache=cache).judge(rubric, ROW)
    assert first.ok and not first.cached
    assert _row_keys(tmp_path / "c.sqlite3") == 1
    again = await make_judge(cache=cache).judge(rubric, dict(ROW))
    assert again.cached and again.label == "correct" and len(fake.chat_requests()) == 1


async def test_a_different_row_or_model_is_not_served(fake, make_judge, tmp_path) -> None:
    rubric = load_rubric("semantic_equivalence_en")
    cache = JudgeCache(tmp_path / "c.sqlite3")
    fake.push(verdict_json("correct"), verdict_json("incorrect"), verdict_json("incorrect"))
    await make_judge(cache=cache).judge(rubric, ROW)
    other = await make_judge(cache=cache).judge(rubric, {**ROW, "prediction": "five"})
    assert not other.cached and other.label == "incorrect"
    seeded = await make_judge(cache=cache, sampling={"seed": 7}).judge(rubric, ROW)
    assert not seeded.cached and len(fake.chat_requests()) == 3


async def test_editing_the_template_invalidates_the_shortcut(fake, make_judge, tmp_path) -> None:
    spec = _copy_rubric(tmp_path)
    cache = JudgeCache(tmp_path / "c.sqlite3")
    fake.push(verdict_json("correct"), verdict_json("incorrect"))
    assert (await make_judge(cache=cache).judge(load_rubric(spec), ROW)).label == "correct"
    template = spec.with_suffix(".j2")
    template.write_text(template.read_text(encoding="utf-8").replace("{% block user %}", "{% block user %}\nBe strict."), encoding="utf-8")
    edited = await make_judge(cache=cache).judge(load_rubric(spec), ROW)
    assert not edited.cached and edited.label == "incorrect"
    assert "Be strict." in fake.chat_requests()[-1].body["messages"][-1]["content"]


async def test_a_hit_by_prompt_links_the_row_for_next_time(fake, make_judge, tmp_path) -> None:
    rubric = load_rubric("semantic_equivalence_en")
    path = tmp_path / "c.sqlite3"
    fake.push(verdict_json("correct"))
    await make_judge(cache=JudgeCache(path)).judge(rubric, ROW)
    with sqlite3.connect(path) as db:  # a cache written before row keys existed
        db.execute("DELETE FROM row_keys")
    hit = await make_judge(cache=JudgeCache(path)).judge(rubric, ROW)
    assert hit.cached and _row_keys(path) == 1
