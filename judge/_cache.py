"""On-disk judge response cache (SQLite): a re-run costs no request and no limiter slot."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import platformdirs

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS modes (endpoint TEXT PRIMARY KEY, mode TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS row_keys (row_key TEXT PRIMARY KEY, key TEXT NOT NULL);
"""


def _loads(text: str) -> dict[str, Any]:
    """orjson on the hot path of a warm re-run; the standard library for what orjson refuses (NaN, huge ints)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def default_cache_path() -> Path:
    return platformdirs.user_cache_path("gradekit") / "judge-cache.sqlite3"


def cache_key(base_url: str, request: dict[str, Any]) -> str:
    """Hash of everything that decides the completion: endpoint, model, messages, format, sampling, n."""
    canonical = json.dumps({"base_url": base_url.rstrip("/"), **request}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class JudgeCache:
    """Stores successful completions only; errors are never cached.

    The output mode that worked for an endpoint is stored too, so a re-run against a server that
    rejects json_schema asks in the mode that worked and hits the cache without a failed request.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return _loads(row[0])

    def get_by_row(self, row_key: str) -> dict[str, Any] | None:
        """The reply stored for a row-values key (see Judge._row_key): a hit without rendering."""
        with self._lock:
            row = self._db.execute(
                "SELECT r.response FROM row_keys k JOIN responses r ON r.key = k.key WHERE k.row_key = ?", (row_key,)
            ).fetchone()
        if row is None:
            return None
        self.hits += 1
        return _loads(row[0])

    def put(self, key: str, response: dict[str, Any], row_key: str | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, response, created) VALUES (?, ?, ?)",
                (key, json.dumps(response, ensure_ascii=False), time.time()),
            )
            if row_key is not None:
                self._db.execute("INSERT OR REPLACE INTO row_keys (row_key, key) VALUES (?, ?)", (row_key, key))

    def link(self, row_key: str, key: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO row_keys (row_key, key) VALUES (?, ?)", (row_key, key))

    def get_mode(self, endpoint: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT mode FROM modes WHERE endpoint = ?", (endpoint,)).fetchone()
        return row[0] if row else None

    def set_mode(self, endpoint: str, mode: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO modes (endpoint, mode) VALUES (?, ?)", (endpoint, mode))

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
