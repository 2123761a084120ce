"""The python grader: a user's ``evaluate(example, response)`` (Vertex) or ``grade(sample, item)``
(OpenAI) run in sandboxed workers, each call in a fresh fork of a warm one.

Why this shape:

- **A zygote per worker, a fork per call.** Each worker is one ``python -I -S`` started once
  (inside bubblewrap when it works, see :mod:`gradekit.graders.sandbox`) that loads the grader's code,
  imports included, and then forks a child for every call (:mod:`gradekit.graders.sandbox._zygote`). A call
  costs a fork and a pipe round trip, not an interpreter start, and nothing a sample changes
  (a patched ``json.dumps``, a global, a file, a process) reaches the next sample.
- **Limits the child cannot undo.** Address space, CPU time, process count and file size are
  rlimits set in the child before user code runs; the zygote enforces the wall-clock timeout
  and, at it, the host kills the whole sandbox (its pid namespace with it) and starts a fresh
  worker on the next call.
- **No credentials.** The child's environment is an allowlist (PATH, locale, TZ) plus what the
  caller passes explicitly; under bubblewrap the parent is not even visible in ``/proc``.
- **A result channel per call.** Only the call's own framed reply on its own pipe counts; what
  user code prints comes back as debug lines, and a write to the channel out of turn voids the
  call (``forged``) instead of shifting other samples' scores.

The workers, the zygote and the bubblewrap policy live in :mod:`gradekit.graders.sandbox`; this module is
the grader: its arguments, its flavours and how a reply becomes a Grade.
"""

from __future__ import annotations

import ast
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ._sample import Grade, Sample, to_openai_item, to_openai_sample, to_vertex_content, to_vertex_example
from .sandbox import BACKSTOP, DEFAULT_CPUS, DEFAULT_FILE_MB, DEFAULT_PROCESSES, Limits, Policy, ZygotePool

DEFAULT_TIMEOUT = 100.0  # Vertex: 100 s per evaluate call
DEFAULT_MEMORY_MB = 1024  # Vertex: 1 GB per invocation

Flavour = Literal["vertex", "openai"]
ENTRY = {"vertex": "evaluate", "openai": "grade"}


def detect_flavour(source: str, filename: str) -> Flavour:
    """Vertex or OpenAI, read from which function the file defines (without running it)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise ValueError(f"{filename}: line {e.lineno}: {e.msg}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = [flavour for flavour, entry in ENTRY.items() if entry in defined]
    if len(found) != 1:
        which = "both evaluate() and grade()" if found else "neither evaluate(example, response) nor grade(sample, item)"
        raise ValueError(f"{filename} defines {which}; pass flavour='vertex' or 'openai' to choose")
    return found[0]  # type: ignore[return-value]


class PythonGrader:
    """A python grader with its own pool of sandboxed zygotes; build it with :func:`python_grader`."""

    def __init__(self, source: str, *, filename: str, flavour: Flavour, entry: str, limits: Limits, workers: int,
                 env: Mapping[str, str] | None, name: str, sandbox: Policy = "auto", network: bool = False,
                 packages: tuple[str, ...] | list[str] = ()) -> None:
        self.source, self.filename, self.flavour, self.entry = source, filename, flavour, entry
        self.limits, self.workers, self.__name__ = limits, workers, name
        self.timeout, self.memory_mb = limits.timeout, limits.memory_mb
        self.sandbox, self.network, self.packages = sandbox, network, tuple(packages)
        self._pool = ZygotePool(name=f"python grader {name!r}", limits=limits, workers=workers, env=env, sandbox=sandbox,
                                network=network, packages=packages,
                                load={"source": source, "filename": filename, "entry": entry, "timeout": limits.timeout})
        self.isolation = self._pool.isolation

    @property
    def spawned(self) -> int:
        return self._pool.spawned

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.worker_pids

    def _label(self) -> str:
        return f"python grader {self.__name__!r} ({self.filename})"

    def _arguments(self, sample: Sample) -> list[Any]:
        if self.flavour == "vertex":
            return [to_vertex_example(sample), to_vertex_content(sample.response)]
        return [to_openai_sample(sample), to_openai_item(sample)]

    async def __call__(self, sample: Sample) -> Grade:
        if self._pool.closed:
            raise RuntimeError(f"{self._label()} is closed")
        args = json.loads(json.dumps(self._arguments(sample), ensure_ascii=False, default=str))
        started = time.perf_counter()
        reply = await self._pool.submit({"op": "call", "args": args, "timeout": self.timeout}, self.timeout + BACKSTOP)
        elapsed = time.perf_counter() - started
        logs = [line for line in (reply.get("logs") or "").splitlines() if line.strip()]
        if not reply.get("ok"):
            kind = reply.get("kind") or "exception"
            error = reply.get("error")
            if kind == "crashed" and self.memory_mb:
                error = f"{error} (memory cap {self.memory_mb} MiB)"
            if kind == "timeout":
                error = f"timed out after {self.timeout:g} s; the sandbox and every process in it were killed"
            return Grade.failed("invalid", f"{self._label()}: {error}", error_kind=kind, debug=logs,
                                metrics={"python_s": elapsed})
        value = float(reply["value"])
        note = "" if -1.0 <= value <= 1.0 else f", clamped to {max(-1.0, min(1.0, value)):g}"
        debug = [f"{self.__name__}: {self.entry}() returned {value:g}{note} (worker {reply.get('worker')}, {elapsed * 1000:.1f} ms)", *logs]
        return Grade.scored(value, debug=debug, metrics={"python_s": elapsed})

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Kill every worker (and its sandbox) and remove the scratch directory."""
        self._pool.close()


def python_grader(
    source: str | None = None,
    *,
    file: str | Path | None = None,
    flavour: Flavour | None = None,
    entry: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    workers: int | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    sandbox: Policy = "auto",
    network: bool = False,
    packages: tuple[str, ...] | list[str] = (),
    processes: int = DEFAULT_PROCESSES,
    file_mb: int = DEFAULT_FILE_MB,
    cpus: int = DEFAULT_CPUS,
) -> PythonGrader:
    """A grader that runs user python in a sandbox, each call forked from a warm, reused worker.

    Args:
        source: the code (Vertex's ``pythonCodeSnippet``, OpenAI's ``source``); or give ``file``.
        file: a ``.py`` file defining ``evaluate(example, response)`` or ``grade(sample, item)``.
        flavour: "vertex" (``evaluate`` gets a ReinforcementTuningExample and a Content) or
            "openai" (``grade`` gets OpenAI's sample and item); read from the code when omitted.
        entry: the function name, if not the flavour's default.
        timeout: wall-clock seconds per call; the call's sandbox is killed and replaced after it.
        memory_mb: the address-space cap of each call (None: no cap).
        workers: zygotes in the pool (default: up to 4, one per CPU).
        env: variables to give the child on top of the allowlist (PATH, locale, TZ).
        name: the grader's name in grades and errors.
        sandbox: "auto" (bubblewrap when it works, else rlimits only, with a warning),
            "strict" (bubblewrap or :class:`~graders.SandboxUnavailable`), "none".
        network: give the code the network (bubblewrap shares the host's network namespace).
        packages: top-level packages the code may import beyond the standard library.
        processes: RLIMIT_NPROC of each call; file_mb: RLIMIT_FSIZE; cpus: CPUs per call.

    A raised exception, a timeout, a crash or a non-number is an ``invalid`` Grade naming the
    reason; a number is clamped to [-1, 1].
    """
    if (source is None) == (file is None):
        raise ValueError("python_grader needs exactly one of source= or file=")
    if file is not None:
        path = Path(file)
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"python grader file {path}: {e.strerror or e}") from e
        filename = str(path)
    else:
        filename = f"<{name or 'python grader'}>"
    assert source is not None
    if flavour is None:
        flavour = detect_flavour(source, filename)
    elif flavour not in ENTRY:
        raise ValueError(f"{filename}: flavour must be 'vertex' or 'openai', not {flavour!r}")
    else:
        try:
            ast.parse(source, filename)
        except SyntaxError as e:
            raise ValueError(f"{filename}: line {e.lineno}: {e.msg}") from None
    limits = Limits(timeout=timeout, memory_mb=memory_mb, processes=processes, file_mb=file_mb, cpus=cpus)
    limits.check(filename)
    count = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    if count < 1:
        raise ValueError(f"{filename}: workers must be at least 1")
    return PythonGrader(source, filename=filename, flavour=flavour, entry=entry or ENTRY[flavour], limits=limits, workers=count,
                        env=env, name=name or (Path(file).stem if file else "python"), sandbox=sandbox, network=network,
                        packages=packages)
