"""What the in-process adapters share: the grader they wrap, the failure policies and plain values."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from .._config import load_grader
from .._sample import Grade, Grader, Sample, aclose_grader

GraderSource = Grader | str | Path | Mapping[str, Any]
RaisePolicy = Literal["raise"]


class GradingError(RuntimeError):
    """A sample could not be graded and the adapter's policy says to raise rather than score it.

    ``grade`` is the failed Grade (status ``invalid`` or ``error``, with the reason).
    """

    def __init__(self, message: str, grade: Grade) -> None:
        super().__init__(message)
        self.grade = grade

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable with its grade: AReaL's process pool and Ray send it back to the trainer.
        return (type(self), (str(self), self.grade))


async def graded_within(grader: Grader, sample: Sample, deadline_s: float | None, *, what: str = "deadline_s") -> Grade:
    """The grade, or a ``timeout`` error once ``deadline_s`` passes: a trainer whose own timeout turns
    a late reward into 0 (AReaL) or an unscored trace (verifiers v1) gets an error first."""
    if deadline_s is None:
        return await grader(sample)
    try:
        return await asyncio.wait_for(grader(sample), deadline_s)
    except asyncio.TimeoutError:
        return Grade.failed("error", f"not graded within {deadline_s:g} s ({what})", error_kind="timeout")


def resolve_grader(grader: GraderSource) -> Grader:
    """A grader object as is; a path or a config mapping built with :func:`load_grader`."""
    if isinstance(grader, (str, Path, Mapping)):
        return load_grader(grader)
    if not callable(grader):
        raise TypeError(f"expected a grader (an async callable), a config file or a config mapping, got {type(grader).__name__}")
    return grader


class PrivateGrader:
    """A grader on one private event loop in a thread (judge's SyncRunner), started on first use:
    sync trainers call it from any thread, with or without a running loop of their own.

    A config file or mapping is kept as ``_source``, so that a pickled copy (Ray, process pools)
    can rebuild it.
    """

    def __init__(self, grader: GraderSource) -> None:
        self._source = grader if isinstance(grader, (str, Path, Mapping)) else None
        self.grader: Grader = resolve_grader(grader)
        self._runner: Any = None
        self._lock = threading.Lock()

    def run(self, coro: Any) -> Any:
        from gradekit.judge import SyncRunner

        with self._lock:
            if self._runner is None:
                self._runner = SyncRunner()
            runner = self._runner
        return runner.run(coro)

    def close(self) -> None:
        """Close the grader (python workers, a judge the config built) and stop the loop thread."""
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.run(aclose_grader(self.grader))
            runner.close()


def grader_name(grader: Any, default: str = "gradekit") -> str:
    name = getattr(grader, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else default


def check_fixed(value: Any, what: str) -> None:
    """A fixed-score policy must be a number in [-1, 1]; anything else is a configuration mistake."""
    if value is None or value == "raise":
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1.0 <= float(value) <= 1.0:
        raise ValueError(f"{what} must be 'raise' or a score in [-1, 1], got {value!r}")


def plain(value: Any) -> Any:
    """Numpy scalars and arrays (verl's non_tensor_batch, dataset columns) as plain Python values."""
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


ANSWER_KEY = "answer"


def reference_dict(value: Any, name: str, *, answer_key: str | None = ANSWER_KEY) -> dict[str, Any]:
    """One rule on every platform: a dict reference merges as is; a plain value (OpenRLHF's label,
    DashScope's or verl's ground truth) is stored under its platform's ``name`` and under
    ``answer``, so a grader written for ``{{references.answer}}`` works on every platform."""
    value = plain(value)
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if value is None:
        return {}
    references = {name: value}
    if answer_key:
        references[answer_key] = value
    return references


def as_row(value: Any, what: str) -> dict[str, Any]:
    """A platform object (a pydantic model from the platform's SDK) or a mapping, as a plain dict."""
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None) or getattr(value, "dict", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dict(dumped)
    raise TypeError(f"{what} must be a mapping or a pydantic model, got {type(value).__name__}")
