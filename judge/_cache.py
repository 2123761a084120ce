"""On-disk judge response cache (SQLite): a re-run costs no request and no limiter slot."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import platformdirs

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS modes (endpoint TEXT PRIMARY KEY, mode TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS row_keys (row_key TEXT PRIMARY KEY, key TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dialects (endpoint TEXT PRIMARY KEY, dialect TEXT NOT NULL);
"""


logger = logging.getLogger("gradekit.cache")
T = TypeVar("T")
_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
_CORRUPT_WORDS = ("malformed", "not a database", "file is encrypted")


def _corrupt(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF in _CORRUPT_CODES) or any(word in str(error) for word in _CORRUPT_WORDS)


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
    if "messages" in request:  # an image's or clip's bytes go into the key as their digest, never as text
        from ._media import digest_media

        request = {**request, "messages": digest_media(request["messages"])}
    if "prompt_cache_key" in request or "service_tier" in request:
        # Where the provider caches the prompt and at which tier it answers do not change the reply: a flex run
        # and a standard one share their cached replies, and so do runs before and after prompt_cache_key.
        request = {k: v for k, v in request.items() if k not in ("prompt_cache_key", "service_tier")}
    canonical = json.dumps({"base_url": base_url.rstrip("/"), **request}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class JudgeCache:
    """Stores successful completions only; errors are never cached.

    The output mode that worked for an endpoint is stored too, so a re-run against a server that
    rejects json_schema asks in the mode that worked and hits the cache without a failed request;
    and what was learnt about it (:meth:`gradekit.judge._dialect.Dialect.record`: parameters it refuses,
    streaming, refused modes, parameters it accepts), so the next process sends no 400 and holds
    no request to learn.

    The cache can never break a run. The default file is shared by every run of a user, so it
    is opened in WAL mode with a busy timeout: concurrent runs read and write it safely. A file
    found corrupt (truncated, garbage, not SQLite), when opened or mid-run, is moved aside to
    ``<path>.corrupt-<time>`` with a warning and a new cache takes its place; any other SQLite
    failure (a lock held past the timeout, a full disk) is a miss, or a reply not stored.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._failed_once = False
        self.hits = 0
        self.misses = 0
        try:
            self._db, self._inode = self._open()
        except sqlite3.DatabaseError as e:
            if not _corrupt(e):
                raise
            self._move_aside(e, None)
            self._db, self._inode = self._open()

    def _open(self) -> tuple[sqlite3.Connection, int | None]:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error:
            db.close()
            raise
        try:
            inode = os.stat(self.path).st_ino
        except OSError:
            inode = None
        return db, inode

    def _move_aside(self, error: sqlite3.Error, inode: int | None) -> None:
        """Rename a corrupt cache file (and its WAL) out of the way, unless another process already replaced it."""
        try:
            current = os.stat(self.path).st_ino
        except OSError:
            current = None
        if inode is None or current == inode:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
            for suffix in ("", "-wal"):
                try:
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
                except FileNotFoundError:
                    pass
            try:
                os.remove(f"{self.path}-shm")
            except FileNotFoundError:
                pass
            logger.warning("warning: the judge cache %s is corrupt (%s); moved it to %s and started a new one",
                           self.path, error, aside)

    def _run(self, op: Callable[[sqlite3.Connection], T], fallback: T) -> T:
        """Run ``op`` on the connection; a corrupt file is replaced and ``op`` tried once more, any other failure is ``fallback``."""
        with self._lock:
            for attempt in range(2):
                try:
                    return op(self._db)
                except sqlite3.Error as e:
                    if attempt == 0 and isinstance(e, sqlite3.DatabaseError) and _corrupt(e):
                        try:
                            self._db.close()
                        except sqlite3.Error:
                            pass
                        self._move_aside(e, self._inode)
                        try:
                            self._db, self._inode = self._open()
                            continue
                        except sqlite3.Error as again:
                            e = again
                    if not self._failed_once:
                        self._failed_once = True
                        logger.warning("warning: the judge cache %s failed (%s); going on without it where it fails", self.path, e)
                    return fallback
            return fallback

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._run(lambda db: db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone(), None)
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return _loads(row[0])

    def get_by_row(self, row_key: str) -> dict[str, Any] | None:
        """The reply stored for a row-values key (see Judge._row_key): a hit without rendering."""
        row = self._run(lambda db: db.execute(
            "SELECT r.response FROM row_keys k JOIN responses r ON r.key = k.key WHERE k.row_key = ?", (row_key,)
        ).fetchone(), None)
        if row is None:
            return None
        self.hits += 1
        return _loads(row[0])

    def put(self, key: str, response: dict[str, Any], row_key: str | None = None) -> None:
        text = json.dumps(response, ensure_ascii=False)

        def store(db: sqlite3.Connection) -> None:
            # One transaction: a kill between the two rows never leaves a reply its row key cannot find.
            with db:
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT OR REPLACE INTO responses (key, response, created) VALUES (?, ?, ?)", (key, text, time.time()))
                if row_key is not None:
                    db.execute("INSERT OR REPLACE INTO row_keys (row_key, key) VALUES (?, ?)", (row_key, key))

        self._run(store, None)

    def link(self, row_key: str, key: str) -> None:
        self._run(lambda db: db.execute("INSERT OR REPLACE INTO row_keys (row_key, key) VALUES (?, ?)", (row_key, key)), None)

    def get_mode(self, endpoint: str) -> str | None:
        row = self._run(lambda db: db.execute("SELECT mode FROM modes WHERE endpoint = ?", (endpoint,)).fetchone(), None)
        return row[0] if row else None

    def set_mode(self, endpoint: str, mode: str) -> None:
        self._run(lambda db: db.execute("INSERT OR REPLACE INTO modes (endpoint, mode) VALUES (?, ?)", (endpoint, mode)), None)

    def get_dialect(self, endpoint: str) -> dict[str, Any] | None:
        """What an earlier process learnt about ``endpoint`` (``base_url|model``), or None."""
        row = self._run(lambda db: db.execute("SELECT dialect FROM dialects WHERE endpoint = ?", (endpoint,)).fetchone(), None)
        try:
            return _loads(row[0]) if row else None
        except ValueError:
            return None  # not ours (an older or foreign entry): learn again

    def set_dialect(self, endpoint: str, dialect: dict[str, Any]) -> None:
        text = json.dumps(dialect, sort_keys=True)
        self._run(lambda db: db.execute("INSERT OR REPLACE INTO dialects (endpoint, dialect) VALUES (?, ?)", (endpoint, text)), None)

    def __len__(self) -> int:
        return self._run(lambda db: db.execute("SELECT count(*) FROM responses").fetchone()[0], 0)

    def close(self) -> None:
        with self._lock:
            self._db.close()
