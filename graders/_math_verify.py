"""Symbolic answer checks: math_verify in sandboxed, long-lived workers, under a deadline from outside.

:class:`MathVerifier` is the engine the ``math_equivalence`` grader (and the hybrid judge
fallback) use. It sends each (gold, response) pair to a checker worker
(:mod:`gradekit.graders.sandbox._checker`, math_verify preloaded) through a :class:`CheckerPool`, which
holds every check's hard deadline and replaces a worker that passes it. What it adds to the bare
``verify(parse(gold), parse(response))``, and why:

- **A timeout is never "wrong".** math_verify's own timeouts return False; here a check that ran
  out of time (inside the worker or at the host's deadline) is ``error`` / ``timeout``, and a
  library exception is ``error`` / ``verifier_error``: a reward that could not be computed is
  the trainer's to mask, never 0.
- **The last ``\\boxed{}`` counts.** A draft ``\\boxed{3}``, prose, then ``\\boxed{5}`` is 5
  (math_verify reads the set {3, 5}); boxes joined only by "and", "or" or commas stay a set.
- **Look-alikes are normalised** in plain text and LaTeX alike: U+2212 and the other dashes,
  fullwidth digits and signs, ×, ÷, ·, non-breaking and zero-width spaces, superscript digits.
- **Nothing a row writes can hang the caller**: no signal in the caller's process (threads,
  asyncio, uvloop, Ray workers are all fine), a memory cap per worker, and responses longer than
  ``max_chars`` are cut to their last ``max_chars`` characters (the final answer is at the end).
- **Each (gold, response, settings) is checked once**: concurrent requests for the same pair wait
  on one check, and results are kept in a bounded LRU.

The library is imported only inside the workers: importing this module costs nothing.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gradekit._extras import require

from .sandbox import Policy
from .sandbox._checkers import CheckerPool

Outcome = Literal["equal", "different", "invalid_gold", "error"]
CheckErrorKind = Literal["timeout", "verifier_error"]
ParseMode = Literal["auto", "boxed", "latex", "expr"]
PARSE_MODES: tuple[str, ...] = ("auto", "boxed", "latex", "expr")
DEFAULT_TIMEOUT = 5.0  # seconds per check, as math_verify's own default
DEFAULT_MAX_CHARS = 1_000_000  # longer than any model's answer (~250k tokens): a bound on what reaches a worker, not a reading rule
DEFAULT_MEMORY_MB = 1024  # address space of a checker worker (math_verify and sympy take ~250 MiB of it)
CACHE_SIZE = 65_536  # checked pairs remembered
# What the worker must be able to import (bound read-only into its sandbox).
PACKAGES = ("math_verify", "latex2sympy2_extended", "sympy", "mpmath", "antlr4")


class MathCheck(BaseModel):
    """The result of one symbolic check: what was decided, and what each side was read as."""

    model_config = ConfigDict(frozen=True)

    outcome: Outcome
    error_kind: CheckErrorKind | None = None
    detail: str = ""  # what was parsed on each side, or the error
    gold_parsed: str | None = None  # the text math_verify extracted from the gold answer
    answer_parsed: str | None = None  # ... and from the response

    @property
    def equal(self) -> bool:
        return self.outcome == "equal"


def parse_modes(parse: str | Sequence[str]) -> tuple[str, ...]:
    """``parse`` as the ordered readings the worker tries (``auto`` = boxed, latex, expr)."""
    modes = [parse] if isinstance(parse, str) else list(parse)
    if not modes:
        raise ValueError("parse: give auto, boxed, latex, expr or a list of them")
    out: list[str] = []
    for mode in modes:
        if mode not in PARSE_MODES:
            raise ValueError(f"parse: {mode!r} is not one of {', '.join(PARSE_MODES)}")
        for m in (("boxed", "latex", "expr") if mode == "auto" else (mode,)):
            if m not in out:
                out.append(m)
    return tuple(out)


def _default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class MathVerifier:
    """Checks (gold, response) pairs with math_verify in sandboxed workers; safe from any thread or loop.

    Args:
        timeout: seconds per check; past it (plus a 0.5 s margin) the worker is killed and replaced
            and the check is ``error`` / ``timeout``.
        workers: checker processes (default: one per CPU, up to 4).
        parse: how the response is read: ``auto`` (the last ``\\boxed{}`` first, then LaTeX, then a
            plain expression, as math_verify extracts), ``boxed``, ``latex``, ``expr`` or a list.
            The gold answer is always read the ``auto`` way.
        max_chars: a longer response is cut to its last ``max_chars`` characters (None: never cut);
            a longer gold answer is ``invalid_gold``.
        memory_mb: each worker's address-space cap (None: none).
        sandbox: the sandbox policy of the workers (``auto``: the best isolation this machine has;
            the checker runs a library on data, so without any sandbox it runs as a plain process).
        cache_size: checked pairs remembered (an LRU).
    """

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT, workers: int | None = None, parse: str | Sequence[str] = "auto",
                 max_chars: int | None = DEFAULT_MAX_CHARS, memory_mb: int | None = DEFAULT_MEMORY_MB, sandbox: Policy = "auto",
                 cache_size: int = CACHE_SIZE) -> None:
        require("math", "the math check (type: math_equivalence)")
        if not timeout > 0:
            raise ValueError("timeout must be positive (seconds per check)")
        if max_chars is not None and max_chars < 1:
            raise ValueError("max_chars must be at least 1 (or None: never cut)")
        if memory_mb is not None and memory_mb < 256:
            raise ValueError(f"memory_mb={memory_mb} is too small for math_verify and sympy (use >= 256 or None)")
        self.timeout, self.max_chars, self.memory_mb = float(timeout), max_chars, memory_mb
        self.modes = parse_modes(parse)
        self.workers = workers if workers is not None else _default_workers()
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        self._pool = CheckerPool(name="math checker", workers=self.workers, memory_mb=memory_mb, sandbox=sandbox, packages=PACKAGES)
        self.isolation = self._pool.isolation
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, str], MathCheck] = collections.OrderedDict()
        self._cache_size = cache_size
        self._inflight: dict[tuple[str, str], Future] = {}
        self._stats = collections.Counter()
        self._cpu_ms = 0.0  # CPU time the workers spent on checks, as they report it

    # ---- checks -----------------------------------------------------------------------------------

    def submit(self, gold: str, response: str) -> Future:
        """A Future of the pair's :class:`MathCheck`; the same pair is checked once."""
        gold, response = str(gold), str(response)
        key = (gold, response)
        with self._lock:
            self._stats["requests"] += 1
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._stats["cache_hits"] += 1
                done: Future = Future()
                done.set_result(hit)
                return done
            waiting = self._inflight.get(key)
            if waiting is not None:
                self._stats["joined"] += 1
                return waiting
            future: Future = Future()
            self._inflight[key] = future
            self._stats["checks"] += 1
        early = self._refuse(gold)
        if early is not None:
            self._finish(key, future, early)
            return future
        cut = ""
        if self.max_chars is not None and len(response) > self.max_chars:
            cut = f"; the response ({len(response):,} characters) was cut to its last {self.max_chars:,}"
            response = response[-self.max_chars:]
        reply = self._pool.submit({"gold": gold, "response": response, "parse": list(self.modes)}, self.timeout)
        reply.add_done_callback(lambda f: self._finish(key, future, *self._to_check(f, cut)))
        return future

    def _refuse(self, gold: str) -> MathCheck | None:
        if self.max_chars is not None and len(gold) > self.max_chars:
            return MathCheck(outcome="invalid_gold", detail=f"the gold answer is {len(gold):,} characters, above max_chars={self.max_chars:,}")
        return None

    @staticmethod
    def _to_check(reply: Future, cut: str) -> tuple[MathCheck, float, bool]:
        """The check, the worker's CPU milliseconds on it, and whether it is about the pair at all."""
        try:
            data: dict[str, Any] = reply.result()
            check = MathCheck(outcome=data["outcome"], error_kind=data.get("error_kind"), detail=str(data.get("detail") or "") + cut,
                              gold_parsed=data.get("gold_parsed"), answer_parsed=data.get("answer_parsed"))
            return check, float(data.get("cpu_ms") or 0.0), bool(data.get("transient"))
        except Exception as e:  # noqa: BLE001 - a malformed reply is this check's error, never a silent score
            check = MathCheck(outcome="error", error_kind="verifier_error", detail=f"unreadable checker reply: {type(e).__name__}: {e}")
            return check, 0.0, True

    def _finish(self, key: tuple[str, str], future: Future, check: MathCheck, cpu_ms: float = 0.0, transient: bool = False) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            self._stats[check.outcome if check.error_kind is None else check.error_kind] += 1
            self._cpu_ms += cpu_ms
            # A worker that died under a check (killed from outside, a crash) says nothing about the pair: not kept.
            if not transient:
                self._cache[key] = check
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        future.set_result(check)

    async def check(self, gold: str, response: str) -> MathCheck:
        """Check one pair from any event loop (a new loop per call too)."""
        return await asyncio.wrap_future(self.submit(gold, response))

    async def check_many(self, pairs: Sequence[tuple[str, str]]) -> list[MathCheck]:
        """Check many pairs at once, in order; duplicates are checked once."""
        futures = [asyncio.wrap_future(self.submit(g, r)) for g, r in pairs]
        return list(await asyncio.gather(*futures))

    def check_sync(self, gold: str, response: str) -> MathCheck:
        """Check one pair from any thread, with or without a running loop (it blocks only this thread)."""
        return self.submit(gold, response).result()

    # ---- state ------------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters: requests, checks (pairs sent), cache_hits, joined (waited on a check in flight),
        per outcome (equal, different, invalid_gold, timeout, verifier_error), the workers' CPU
        milliseconds on checks, and the pool's spawned / killed / died / resent workers and requests."""
        keys = ("requests", "checks", "cache_hits", "joined", "equal", "different", "invalid_gold", "timeout", "verifier_error")
        with self._lock:
            out = {key: self._stats.get(key, 0) for key in keys}
            out["worker_cpu_ms"] = round(self._cpu_ms)
        pool = self._pool.counts
        out.update({f"workers_{k}": pool.get(k, 0) for k in ("spawned", "sent", "answered", "killed", "died", "memory", "resent")})
        return out

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.worker_pids

    def settings(self) -> dict[str, Any]:
        """What decides a check's result, for a run's checkpoint identity."""
        return {"timeout": self.timeout, "parse": list(self.modes), "max_chars": self.max_chars, "memory_mb": self.memory_mb}

    def close(self) -> None:
        self._pool.close()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
