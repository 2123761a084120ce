"""A file run as one value: which input, which output, how a row is graded, and the run's options.

Every front door (``grade_file``, ``grade_file_with``, the provider Batch API, pairwise, Ray)
resolves its input once and hands the loop a :class:`RunPlan`; the loop (``_file.run_file`` and
``stream_in_order``) reads nothing else, so the paths differ only in the plan they build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from ._io import RowError, RunInput


class Outcome(Protocol):
    """What grading one row gives: a Verdict, a Grade, a pair's verdict."""

    status: str
    error: str | None


O = TypeVar("O", bound=Outcome)
Reader = Callable[[RunInput, int], Iterator[dict[str, Any] | RowError]]  # the input's rows from a skip


@dataclass(frozen=True)
class Grading(Generic[O]):
    """How a row becomes an output row: what a rubric, a grader, a batch and a Ray run differ in.

    ``prepare`` turns an input row (and its number) into what ``judge_row`` takes, raising
    RowError for a row that lacks a variable; ``input_error`` is the outcome of a row that cannot
    be graded; ``to_row`` is the output row. ``columns`` and ``types`` are the result columns
    written after the input's; ``settings`` identify the grading for the checkpoint, so a
    checkpoint from other settings is not resumed; ``workers`` rows are graded at once.
    """

    columns: list[str]
    types: Mapping[str, str]
    settings: Mapping[str, Any]
    workers: int
    prepare: Callable[[dict[str, Any], int], Any]
    judge_row: Callable[[Any], Awaitable[O]]
    input_error: Callable[[str], O]
    to_row: Callable[[dict[str, Any], O], dict[str, Any]]


@dataclass(frozen=True)
class RunOptions:
    """The run's own options, apart from the judge: ``--restart``, ``--keep-going``, ``--retry-errors``, ``--group-by``.

    ``resume`` (the default) continues an interrupted run of the same command and leaves a
    finished one alone; ``keep_going`` turns the circuit breaker off; ``retry_errors`` grades
    again the rows an earlier run left with a transient error; ``group_by`` reports the reward
    spread within and across the groups that column names.
    """

    resume: bool = True
    keep_going: bool = False
    retry_errors: bool = False
    group_by: str | None = None


@dataclass(frozen=True)
class RunPlan(Generic[O]):
    """One run over one input: the resolved input, the output path, the grading and the options.

    ``on_row`` is told each outcome as its row is written (a progress bar); ``reader`` yields the
    input's rows from a skip (``--ray`` reads them with Ray Data); ``canary`` checks the judge did not
    change mid-run (runs._canary), adding a ``drift`` column.
    """

    input: RunInput
    output: Path
    grading: Grading[O]
    options: RunOptions = RunOptions()
    on_row: Callable[[O], None] | None = None
    reader: Reader = RunInput.read
    canary: Any = None

    def judged_by(self, judge_row: Callable[[Any], Awaitable[O]], workers: int | None = None) -> RunPlan[O]:
        """The same plan with another way to grade a prepared row (timed, or sent to a pool of actors)."""
        grading = dataclasses.replace(self.grading, judge_row=judge_row, workers=self.grading.workers if workers is None else workers)
        return dataclasses.replace(self, grading=grading)
