"""Verified answers: math_verify and the answer rules in sandboxed, long-lived workers, under a deadline from outside.

:class:`MathVerifier` is the engine the ``math_equivalence`` / ``verified_answer`` grader (and the
hybrid judge fallback) use, for every kind of answer (``number``, ``expression``, ``choice``,
``string``, or ``auto``: told from the gold). It sends each (gold, response) pair to a checker
worker (:mod:`gradekit.graders.sandbox._checker`, math_verify preloaded, the text rules of
:mod:`gradekit.graders.sandbox._answer_rules` before it) through a :class:`CheckerPool`, which holds
every check's hard deadline and replaces a worker that passes it. What it adds to the bare
``verify(parse(gold), parse(response))``, and why:

- **An answer is read as what it is.** A gold (and a boxed or already-extracted response) is read
  whole, with or without ``$...$``: ``1 \\pm \\sqrt{19}`` is a set of two, ``5:8`` a ratio,
  ``a = -2, b = -2`` two unknowns in order, ``five`` and ``五`` the number 5, ``listen`` a word;
  a gold only the library's extraction can read, and only as a fragment, is ``invalid_gold``.

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
import json
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gradekit._extras import require

from .sandbox import Policy
from .sandbox._answer_rules import KINDS
from .sandbox._checkers import CheckerPool

Outcome = Literal["equal", "different", "invalid_gold", "error"]
CheckErrorKind = Literal["timeout", "verifier_error", "input"]  # input: the response is no text to check (a lone surrogate)
ParseMode = Literal["auto", "boxed", "answer", "latex", "expr"]
PARSE_MODES: tuple[str, ...] = ("auto", "boxed", "answer", "latex", "expr")
AUTO_MODES: tuple[str, ...] = ("boxed", "answer", "latex", "expr")
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
    gold_parsed: str | None = None  # what the gold answer was read as (its items, the option, the normalised string)
    answer_parsed: str | None = None  # ... and the response
    kind: str | None = None  # the kind compared: number, expression, choice or string (auto resolved)

    @property
    def equal(self) -> bool:
        return self.outcome == "equal"


def _not_text(text: str) -> int | None:
    """The position of the first lone surrogate in ``text`` (a str Python holds but no encoding writes), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def parse_modes(parse: str | Sequence[str]) -> tuple[str, ...]:
    """``parse`` as the ordered readings the worker tries (``auto`` = boxed, answer, latex, expr)."""
    modes = [parse] if isinstance(parse, str) else list(parse)
    if not modes:
        raise ValueError("parse: give auto, boxed, answer, latex, expr or a list of them")
    out: list[str] = []
    for mode in modes:
        if mode not in PARSE_MODES:
            raise ValueError(f"parse: {mode!r} is not one of {', '.join(PARSE_MODES)}")
        for m in (AUTO_MODES if mode == "auto" else (mode,)):
            if m not in out:
                out.append(m)
    return tuple(out)


def check_kind(kind: str) -> str:
    """``kind`` if it is one (auto, number, expression, choice, string); ValueError naming them if not."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    return kind


def _default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class MathVerifier:
    """Checks (gold, response) pairs in sandboxed workers, every kind of answer; safe from any thread or loop.

    Args:
        timeout: seconds per check; past it (plus a 0.5 s margin) the worker is killed and replaced
            and the check is ``error`` / ``timeout``.
        workers: checker processes (default: one per CPU, up to 4).
        parse: how the response is read: ``auto`` (the last ``\\boxed{}`` first; then, for a short
            response, the response as the answer itself; then what it states after "the answer is";
            then LaTeX and a plain expression, as math_verify extracts), ``boxed``, ``answer`` (the
            response is the answer already: read whole, no extraction), ``latex``, ``expr`` or a list.
            The gold answer is always read whole (its last ``\\boxed{}`` if it has one).
        kind: what the answers are when a check does not say: ``auto`` (told from the gold),
            ``number``, ``expression``, ``choice`` or ``string``.
        max_chars: a longer response is cut to its last ``max_chars`` characters (None: never cut);
            a longer gold answer is ``invalid_gold``.
        memory_mb: each worker's address-space cap (None: none).
        sandbox: the sandbox policy of the workers (``auto``: the best isolation this machine has;
            the checker runs a library on data, so without any sandbox it runs as a plain process).
        cache_size: checked pairs remembered (an LRU).
    """

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT, workers: int | None = None, parse: str | Sequence[str] = "auto",
                 max_chars: int | None = DEFAULT_MAX_CHARS, memory_mb: int | None = DEFAULT_MEMORY_MB, sandbox: Policy = "auto",
                 cache_size: int = CACHE_SIZE, kind: str = "auto") -> None:
        require("math", "the answer check (type: verified_answer / math_equivalence)")
        if not timeout > 0:
            raise ValueError("timeout must be positive (seconds per check)")
        if max_chars is not None and max_chars < 1:
            raise ValueError("max_chars must be at least 1 (or None: never cut)")
        if memory_mb is not None and memory_mb < 256:
            raise ValueError(f"memory_mb={memory_mb} is too small for math_verify and sympy (use >= 256 or None)")
        self.timeout, self.max_chars, self.memory_mb = float(timeout), max_chars, memory_mb
        self.modes = parse_modes(parse)
        self.kind = check_kind(kind)
        self.workers = workers if workers is not None else _default_workers()
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        self._pool = CheckerPool(name="math checker", workers=self.workers, memory_mb=memory_mb, sandbox=sandbox, packages=PACKAGES)
        self.isolation = self._pool.isolation
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[Any, ...], MathCheck] = collections.OrderedDict()
        self._cache_size = cache_size
        self._inflight: dict[tuple[Any, ...], Future] = {}
        self._stats = collections.Counter()
        self._cpu_ms = 0.0  # CPU time the workers spent on checks, as they report it

    # ---- checks -----------------------------------------------------------------------------------

    def submit(self, gold: str, response: str, *, kind: str | None = None, question: str = "",
               options: Sequence[Any] | dict[str, Any] | str | None = None, aliases: Sequence[str] | None = None) -> Future:
        """A Future of the pair's :class:`MathCheck`; the same pair (and settings) is checked once.

        Args:
            kind: this check's kind (default: the verifier's).
            question: the question the response answers: where ``choice`` finds its options (``A. Paris``
                lines, ``(A) ... (B) ...``) and a math answer the unit it is asked in (``in km``).
            options: a choice question's options as data ({letter: text}, a list of texts) instead.
            aliases: more answers that count as the gold (a gold that is a JSON list of strings is one too).
        """
        gold, response = str(gold), str(response)
        kind = check_kind(kind) if kind is not None else self.kind
        question = str(question or "")
        if self.max_chars is not None and len(question) > self.max_chars:
            question = question[:self.max_chars]  # options follow the question's opening; a bound, not a reading rule
        extra: dict[str, Any] = {}
        if kind != "auto":
            extra["kind"] = kind
        if question:
            extra["question"] = question
        if options is not None:
            extra["options"] = options if isinstance(options, str) else _plain(options)
        if aliases:
            extra["aliases"] = [str(a) for a in aliases]
        key = (gold, response, json.dumps(extra, sort_keys=True, ensure_ascii=False) if extra else "")
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
        early = self._refuse(gold, response)
        if early is not None:
            self._finish(key, future, early)
            return future
        cut = ""
        if self.max_chars is not None and len(response) > self.max_chars:
            cut = f"; the response ({len(response):,} characters) was cut to its last {self.max_chars:,}"
            response = response[-self.max_chars:]
        try:
            reply = self._pool.submit({"gold": gold, "response": response, "parse": list(self.modes), **extra}, self.timeout)
        except Exception as e:  # noqa: BLE001 - never a pair left in flight for ever (a later caller would wait on it)
            self._finish(key, future, MathCheck(outcome="error", error_kind="verifier_error", detail=f"{type(e).__name__}: {e}"), 0.0, True)
            return future
        reply.add_done_callback(lambda f: self._finish(key, future, *self._to_check(f, cut)))
        return future

    def _refuse(self, gold: str, response: str) -> MathCheck | None:
        if self.max_chars is not None and len(gold) > self.max_chars:
            return MathCheck(outcome="invalid_gold", detail=f"the gold answer is {len(gold):,} characters, above max_chars={self.max_chars:,}")
        for side, text in (("gold answer", gold), ("response", response)):
            where = _not_text(text)
            if where is not None:
                detail = f"the {side} holds a lone surrogate ({text[where]!r} at {where}), which no Unicode text holds: it cannot be checked"
                return MathCheck(outcome="invalid_gold", detail=detail) if side == "gold answer" else \
                    MathCheck(outcome="error", error_kind="input", detail=detail)
        return None

    @staticmethod
    def _to_check(reply: Future, cut: str) -> tuple[MathCheck, float, bool]:
        """The check, the worker's CPU milliseconds on it, and whether it is about the pair at all."""
        try:
            data: dict[str, Any] = reply.result()
            check = MathCheck(outcome=data["outcome"], error_kind=data.get("error_kind"), detail=str(data.get("detail") or "") + cut,
                              gold_parsed=data.get("gold_parsed"), answer_parsed=data.get("answer_parsed"), kind=data.get("kind"))
            return check, float(data.get("cpu_ms") or 0.0), bool(data.get("transient"))
        except Exception as e:  # noqa: BLE001 - a malformed reply is this check's error, never a silent score
            check = MathCheck(outcome="error", error_kind="verifier_error", detail=f"unreadable checker reply: {type(e).__name__}: {e}")
            return check, 0.0, True

    def _finish(self, key: tuple[Any, ...], future: Future, check: MathCheck, cpu_ms: float = 0.0, transient: bool = False) -> None:
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

    async def check(self, gold: str, response: str, **context: Any) -> MathCheck:
        """Check one pair from any event loop (a new loop per call too); ``context``: :meth:`submit`'s keywords."""
        return await asyncio.wrap_future(self.submit(gold, response, **context))

    async def check_many(self, pairs: Sequence[tuple[str, str]], **context: Any) -> list[MathCheck]:
        """Check many pairs at once, in order; duplicates are checked once."""
        futures = [asyncio.wrap_future(self.submit(g, r, **context)) for g, r in pairs]
        return list(await asyncio.gather(*futures))

    def check_sync(self, gold: str, response: str, **context: Any) -> MathCheck:
        """Check one pair from any thread, with or without a running loop (it blocks only this thread)."""
        return self.submit(gold, response, **context).result()

    # ---- state ------------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters: requests, checks (pairs sent), cache_hits, joined (waited on a check in flight),
        per outcome (equal, different, invalid_gold, timeout, verifier_error), the workers' CPU
        milliseconds on checks, and the pool's spawned / killed / died / stopped / resent workers and requests."""
        keys = ("requests", "checks", "cache_hits", "joined", "equal", "different", "invalid_gold", "timeout", "verifier_error")
        with self._lock:
            out = {key: self._stats.get(key, 0) for key in keys}
            out["worker_cpu_ms"] = round(self._cpu_ms)
        pool = self._pool.counts
        out.update({f"workers_{k}": pool.get(k, 0) for k in ("spawned", "sent", "answered", "killed", "died", "stopped", "memory", "resent")})
        return out

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.worker_pids

    def settings(self) -> dict[str, Any]:
        """What decides a check's result, for a run's checkpoint identity."""
        return {"timeout": self.timeout, "parse": list(self.modes), "kind": self.kind, "max_chars": self.max_chars, "memory_mb": self.memory_mb}

    def close(self) -> None:
        self._pool.close()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """Options as JSON data (a mapping or a list; anything else as its text)."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return [str(v) if not isinstance(v, (list, tuple)) else [str(x) for x in v] for v in value]
