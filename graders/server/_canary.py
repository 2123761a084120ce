"""``canary:`` in the server config: the grader's judge asked a canary on a schedule, its drift in ``/metrics``.

A reward server runs for days while its judge's provider may move an alias to a new snapshot or a
vLLM replica may be redeployed. Every ``every_s`` seconds it judges the canary's rows (rows with
known verdicts, asked from the wire as its judge serves them) and tests their agreement against
the server's start with the same sequential test a file run uses (:mod:`gradekit.graders.runs._canary`).
A server cannot stop a run: it exposes what it saw (``/metrics``: ``gradekit_canary_*``; ``/stats``:
``canary``) and logs the change once; with ``on_drift: fail`` every reward after it is answered
``fail`` with ``error_kind: drift`` (each contract's failure, which a trainer masks) instead of a
reward from a judge that is not the one the run started with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("gradekit.server")


class ServedCanary:
    """The server's canary: the check loop, and what ``/metrics`` and ``/stats`` read off it."""

    def __init__(self, canary: Any, every_s: float, on_drift: str) -> None:
        self.canary, self.every_s, self.on_drift = canary, every_s, on_drift
        self.last_check: float | None = None  # wall-clock time of the last check that ran
        self.failed = 0  # checks that could not run (every canary row failed: the judge is down)
        self.problem: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def drifted(self) -> bool:
        return self.canary.drift is not None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        number = 0
        while True:
            try:
                if self.canary.baseline is None:
                    await self.canary.start(None)  # the server's start: what later checks are compared with
                else:
                    number += 1
                    await self.canary.check(number)
                self.last_check, self.problem = time.time(), None
                if self.drifted:
                    logger.warning("canary: %s; %s", self.canary.finding(), "every reward now fails with error_kind drift"
                                   if self.on_drift == "fail" else "the server goes on serving (on_drift: report)")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a check that cannot run (the judge is down) is counted, never fatal
                self.failed += 1
                self.problem = f"{type(e).__name__}: {e}"
                logger.warning("canary: the check could not run: %s", self.problem)
            if self.drifted:
                return  # the change is seen: later checks would only compare the new judge with the old one again
            await asyncio.sleep(self.every_s)

    def report(self) -> dict[str, Any]:
        return {**self.canary.report(), "every_s": self.every_s, "on_drift": self.on_drift, "last_check": self.last_check,
                "failed_checks": self.failed, "problem": self.problem}


def build_canary(section: Any, base: Path | None, computer: Any, source: str) -> ServedCanary:
    """The canary a server config's ``canary:`` describes, on the judge the computer's grader made; ValueError naming the key."""
    from gradekit.judge import RubricError, load_rubric

    from ..calibration._judging import read_labelled
    from ..runs._canary import Canary
    from ..runs._file import resolve_mapping
    from ._metrics import _judges

    def where(path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() or base is None else base / p

    judges = _judges(computer)
    if not judges:
        raise ValueError(f"{source}: canary: the grader makes no judge (a canary checks an LLM grader's judge)")
    try:
        rubric = load_rubric(where(section.rubric) if section.rubric.endswith((".yaml", ".yml")) else section.rubric)
        variables = resolve_mapping(rubric, [f"{k}={v}" for k, v in section.map.items()])
        rows = read_labelled(where(section.file), rubric, variables, section.label_column)
    except (RubricError, ValueError) as e:
        raise ValueError(f"{source}: canary: {e}") from e
    canary = Canary(rows.rows, rows.human, rubric, judges[0], every_rows=None, every_seconds=section.every_s,
                    alpha=section.alpha, source={"name": rows.name, "sha256": rows.sha256})
    return ServedCanary(canary, section.every_s, section.on_drift)
