"""The cache cannot break a run: a corrupt file is moved aside, and concurrent runs share one cache safely."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge import JudgeCache
from gradekit.judge.testing import FakeProvider

from ..conftest import reference_judge


def _write_input(path: Path, n: int, start: int = 0) -> None:
    path.write_text("".join(json.dumps({"id": i, "question": f"question {i}?", "references": [f"answer {i}"],
                                        "prediction": f"answer {i}"}) + "\n" for i in range(start, start + n)), encoding="utf-8")


def _args(source: Path, output: Path) -> list[str]:
    return ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(output), "--concurrency", "8", "--json"]


def _moved_aside(cache: Path) -> list[Path]:
    return sorted(p for p in cache.parent.glob(cache.name + ".corrupt-*") if not p.name.endswith(("-wal", "-shm")))


def _fill(cache: Path, n: int) -> None:
    store = JudgeCache(cache)
    for i in range(n):
        store.put(f"key {i}", {"choices": [{"message": {"content": "x" * 400}}], "i": i})
    store.close()
    with sqlite3.connect(cache) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_cache_is_moved_aside_with_a_warning_and_the_run_goes_on(tmp_path, damage) -> None:
    source, output, cache = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "cache.sqlite3"
    _write_input(source, 20)
    if damage == "garbage":
        cache.write_bytes(os.urandom(64 * 1024))
    else:  # a real cache cut short: it opens, and fails when a page past the cut is read
        _fill(cache, 2000)
        with cache.open("r+b") as handle:
            handle.truncate(cache.stat().st_size // 2)
    with FakeProvider(responder=reference_judge) as fake:
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(cache)}
        result = CliRunner().invoke(app, _args(source, output), env=env)
        assert result.exit_code == 0, result.output
        assert "is corrupt" in result.output and "moved it to" in result.output and "Traceback" not in result.output
        assert len(_moved_aside(cache)) == 1
        again = CliRunner().invoke(app, _args(source, output) + ["--restart"], env=env)  # the new cache serves the re-run
        assert again.exit_code == 0 and json.loads(again.output)["cache_hits"] == 20
        assert len(fake.chat_requests()) == 20


def test_a_cache_damaged_mid_run_is_replaced_and_no_call_raises(tmp_path) -> None:
    cache = tmp_path / "cache.sqlite3"
    _fill(cache, 2000)
    store = JudgeCache(cache)
    assert store.get("key 0") is not None
    with cache.open("r+b") as handle:  # another process (or a disk) damages the file under the open cache
        handle.seek(4096)
        handle.write(os.urandom(cache.stat().st_size - 4096))
    for i in range(0, 2000, 50):
        store.get(f"key {i}")  # never raises: a miss, or the fresh cache's answer
    store.put("after", {"ok": True}, row_key="row")
    assert store.get_by_row("row") == {"ok": True}
    store.close()
    assert len(_moved_aside(cache)) == 1


def test_two_runs_sharing_one_cache_at_once_both_finish(tmp_path) -> None:
    cache = tmp_path / "cache.sqlite3"
    sources = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    _write_input(sources[0], 150)
    _write_input(sources[1], 150, start=75)  # half the rows are the other run's too: both write the same keys
    with FakeProvider(responder=reference_judge) as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(cache)}
        runs = [subprocess.Popen([sys.executable, "-m", "gradekit", *_args(source, source.with_suffix(".out.jsonl"))], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for source in sources]
        results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    for code, out, err in results:
        assert code == 0, (out, err)
        assert json.loads(out)["ok"] == 150 and "cache" not in err
    with sqlite3.connect(cache) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT count(*) FROM responses").fetchone()[0] == 225
    assert not _moved_aside(cache)
