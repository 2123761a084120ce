"""`--cache redis://HOST:PORT/DB`: the SQLite cache's keys and semantics in a Redis every node reaches.

A redis-server of its own on a free port (the fixture of tests/judge/test_shared_limiter.py), real
`gradekit grade` runs against the FakeProvider; no Ray needed.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge import JudgeCache, RedisJudgeCache, cache_key, open_cache
from gradekit.judge.testing import FakeProvider

from .test_shared_limiter import redis_url  # noqa: F401 -- the module's redis-server fixture

RUBRIC = "semantic_equivalence_en"


def _rows(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"question": f"c-{i}", "references": ["x"], "prediction": "y"}) + "\n" for i in range(n)),
                    encoding="utf-8")
    return path


def _grade(source: Path, output: Path, base_url: str, cache: str, *extra: str) -> dict:
    result = CliRunner().invoke(app, ["grade", str(source), "-r", RUBRIC, "-o", str(output), "--base-url", base_url, "--api-key", "k",
                                      "--model", "fake-judge", "--cache", cache, "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_rerun_against_the_redis_cache_sends_no_request(redis_url: str, tmp_path: Path) -> None:  # noqa: F811
    source = _rows(tmp_path / "in.jsonl", 6)
    url = redis_url.rsplit("/", 1)[0] + "/3"  # a database of its own
    with FakeProvider() as fake:
        first = _grade(source, tmp_path / "a.jsonl", fake.base_url, url)
        assert first["requests"] == 6 and first["cache_hits"] == 0
        second = _grade(source, tmp_path / "b.jsonl", fake.base_url, url)
        assert len(fake.chat_requests()) == 6  # nothing sent the second time
    assert second["cache_hits"] == 6 and second["requests"] == 0
    assert [json.loads(line)["score"] for line in (tmp_path / "b.jsonl").read_text().splitlines()] == \
        [json.loads(line)["score"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]


def test_the_redis_cache_keeps_the_sqlite_caches_interface_and_keys(redis_url: str, tmp_path: Path) -> None:  # noqa: F811
    url = redis_url.rsplit("/", 1)[0] + "/4"
    key = cache_key("http://x/v1", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    reply = {"choices": [{"message": {"content": "正确"}}], "usage": {"total_tokens": 3}}
    for cache in (open_cache(url), JudgeCache(tmp_path / "c.sqlite3")):
        assert cache.get(key) is None and cache.get_by_row("row") is None
        cache.put(key, reply, row_key="row")
        assert cache.get(key) == reply and cache.get_by_row("row") == reply
        cache.link("row2", key)
        assert cache.get_by_row("row2") == reply
        cache.set_mode("http://x/v1|m", "json_schema")
        assert cache.get_mode("http://x/v1|m") == "json_schema"
        assert len(cache) == 1 and cache.hits == 3 and cache.misses == 1
        cache.close()
    assert isinstance(open_cache(url), RedisJudgeCache)


def test_an_unreachable_redis_cache_exits_2_before_any_request(tmp_path: Path) -> None:
    source = _rows(tmp_path / "in.jsonl", 2)
    with FakeProvider() as fake:
        result = CliRunner().invoke(app, ["grade", str(source), "-r", RUBRIC, "-o", str(tmp_path / "o.jsonl"), "--base-url",
                                          fake.base_url, "--api-key", "k", "--cache", "redis://:secret@127.0.0.1:1/0"])
        assert fake.chat_requests() == []
    assert result.exit_code == 2
    assert "unreachable" in result.output and "secret" not in result.output
