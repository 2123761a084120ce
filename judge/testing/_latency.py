"""Latency distributions for the fake provider: ``FakeProvider(latency=Lognormal(...))``.

A real judge's latency is heavy-tailed: most answers come near the median, a few take ten times
as long. :class:`Lognormal` draws one delay per request, seeded, so a benchmark's contenders meet
the same delays: with ``key``, the n-th request for a key (a sample's id read from the body) gets
the same draw in every run and on every provider sharing the instance, whatever the order of
arrival; a second request for the same key (a retry, a hedge) gets a fresh draw.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Callable
from typing import Any

_Z99 = 2.326  # the standard normal's 99th percentile


class Lognormal:
    """Delays with the given median and 99th percentile (seconds): ``sigma = ln(p99 / median) / 2.326``."""

    def __init__(self, median: float, p99: float, *, seed: int = 0,
                 key: Callable[[dict[str, Any]], str] | None = None) -> None:
        if not 0 < median < p99:
            raise ValueError(f"Lognormal needs 0 < median < p99, got median={median}, p99={p99}")
        self.mu = math.log(median)
        self.sigma = math.log(p99 / median) / _Z99
        self.seed = seed
        self.key = key
        self._random = random.Random(seed)
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()  # providers sharing the instance answer on their own threads

    def draw(self, key: str, nth: int = 0) -> float:
        """The delay of the ``nth`` request (0: the first) for ``key``."""
        digest = hashlib.blake2b(f"{self.seed}|{key}|{nth}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big")).lognormvariate(self.mu, self.sigma)

    def __call__(self, body: dict[str, Any]) -> float:
        if self.key is None:
            with self._lock:
                return self._random.lognormvariate(self.mu, self.sigma)
        key = self.key(body)
        with self._lock:
            nth = self._seen.get(key, 0)
            self._seen[key] = nth + 1
        return self.draw(key, nth)
