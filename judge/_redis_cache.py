"""The judge response cache in Redis: the SQLite cache's keys and semantics, reachable from every node.

A cluster run judges a row on whichever node has a free worker; a resumed run may judge it on
another. A cache every node reaches means only the requests that were in flight are sent again.
Same interface as :class:`JudgeCache` (``get``, ``get_by_row``, ``put``, ``link``, modes, dialects);
the same :func:`cache_key`, so moving a cache between backends changes nothing but the store.
Successful completions only, as JSON strings, without expiry (like the SQLite file; ``--db``
names a Redis database to keep them apart, FLUSHDB empties it).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from gradekit._extras import require

from ._cache import _loads

_PREFIX = "gradekit:cache"
_SCHEMES = ("redis", "rediss", "unix")


def is_redis_url(location: object) -> bool:
    return isinstance(location, str) and urllib.parse.urlsplit(location).scheme in _SCHEMES


class RedisJudgeCache:
    """A :class:`JudgeCache` kept in Redis (``redis://host:port/db``); needs the ``redis`` package."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        require("redis", "a redis:// cache")
        import redis

        self.url = url
        self.path = url  # what a summary or message names as the cache's place
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        from ._shared_limiter import _redact

        return f"RedisJudgeCache({_redact(self.url)!r})"

    def check(self) -> None:
        """PING now; raise ConnectionError naming the URL (password hidden) if Redis does not answer."""
        from ._shared_limiter import _redact

        try:
            self._redis.ping()
        except Exception as exc:  # noqa: BLE001 -- redis-py's errors all mean: no cache here
            raise ConnectionError(f"the cache's Redis at {_redact(self.url)} is unreachable: {exc}") from exc

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._redis.get(f"{_PREFIX}:r:{key}")
        if raw is None:
            self.misses += 1
            return None
        self.hits += 1
        return _loads(raw.decode("utf-8"))

    def get_by_row(self, row_key: str) -> dict[str, Any] | None:
        """The reply stored for a row-values key: a hit without rendering (as JudgeCache.get_by_row)."""
        key = self._redis.get(f"{_PREFIX}:row:{row_key}")
        if key is None:
            return None
        raw = self._redis.get(f"{_PREFIX}:r:{key.decode('ascii')}")
        if raw is None:
            return None
        self.hits += 1
        return _loads(raw.decode("utf-8"))

    def put(self, key: str, response: dict[str, Any], row_key: str | None = None) -> None:
        pipe = self._redis.pipeline(transaction=True)  # reply and row link land together or not at all
        pipe.set(f"{_PREFIX}:r:{key}", json.dumps(response, ensure_ascii=False))
        if row_key is not None:
            pipe.set(f"{_PREFIX}:row:{row_key}", key)
        pipe.execute()

    def link(self, row_key: str, key: str) -> None:
        self._redis.set(f"{_PREFIX}:row:{row_key}", key)

    def get_mode(self, endpoint: str) -> str | None:
        mode = self._redis.get(f"{_PREFIX}:mode:{endpoint}")
        return mode.decode("utf-8") if mode is not None else None

    def set_mode(self, endpoint: str, mode: str) -> None:
        self._redis.set(f"{_PREFIX}:mode:{endpoint}", mode)

    def get_dialect(self, endpoint: str) -> dict[str, Any] | None:
        """What a process learnt about ``endpoint`` (``base_url|model``), or None (see JudgeCache.get_dialect)."""
        raw = self._redis.get(f"{_PREFIX}:dialect:{endpoint}")
        try:
            return _loads(raw.decode("utf-8")) if raw is not None else None
        except ValueError:
            return None

    def set_dialect(self, endpoint: str, dialect: dict[str, Any]) -> None:
        self._redis.set(f"{_PREFIX}:dialect:{endpoint}", json.dumps(dialect, sort_keys=True))

    def __len__(self) -> int:
        return sum(1 for _ in self._redis.scan_iter(match=f"{_PREFIX}:r:*", count=1000))

    def close(self) -> None:
        self._redis.close()


def open_cache(location: str | None) -> Any:
    """The cache a cache location names: ``redis://host:port/db`` (checked now), else a SQLite path."""
    if is_redis_url(location):
        cache = RedisJudgeCache(location)  # type: ignore[arg-type]
        cache.check()
        return cache
    from pathlib import Path

    from ._cache import JudgeCache

    return JudgeCache(Path(location) if location else None)
