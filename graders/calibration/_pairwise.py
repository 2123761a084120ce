"""A labelled file of pairs: the pairwise run (``runs._pairwise``) with LLMBar's Acc and Agr against the gold labels.

The pairs are judged by :func:`gradekit.graders._pairwise.pairwise_grader` (both orders, the pair rule, the
module's table of rules); the run (``runs._pairwise``) writes the rows and counts them, and this front door
builds its plan; the figures against gold labels are calibration's (:func:`pairwise_report`), made here from
each order's winners.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from gradekit.judge import Judge, JudgeProtocol, Rubric

from .._pairwise import ConflictRule, PairVerdict, Winner
from ..runs._io import RunInput
from ..runs._lock import output_lock
from ..runs._pairwise import PairwiseRunSummary, pairwise_grading, run_pairwise
from ..runs._plan import RunPlan
from ._agreement import PairwiseReport, as_label, pairwise_report


async def grade_pairwise_file(
    judge: JudgeProtocol,
    rubric: Rubric,
    source: Path | RunInput,
    destination: Path,
    mapping: Mapping[str, str],
    *,
    swap: bool = True,
    on_conflict: ConflictRule = "tie",
    tiebreak: Judge | None = None,
    label_column: str | None = "label",
    convention: Literal["llmbar", "skip"] = "llmbar",
    on_row: Callable[[PairVerdict], None] | None = None,
    encoding: str | None = None,
) -> PairwiseRunSummary:
    """Grade every pair in ``source`` into ``destination``: one output row per input row, in order.

    When the rows carry ``label_column`` (the gold winner, 1 or 2), the record's ``results.report`` has
    LLMBar's Acc and Agr and the position-bias figures, computed with :func:`pairwise_report`.
    The output is locked while it is written, as for any file run.
    """
    def report(winner_ab: Sequence[Winner | None], winner_ba: Sequence[Winner | None], gold: Sequence[Any]) -> PairwiseReport | None:
        labels = [as_label(label) for label in gold]
        if not all(label is not None for label in labels):
            return None
        return pairwise_report(winner_ab, winner_ba, labels, convention=convention)

    source = RunInput.resolve(source, encoding)  # the run's door: past it the input is this RunInput
    with output_lock(source, destination):
        grading = pairwise_grading(judge, rubric, source, mapping, swap=swap, on_conflict=on_conflict, tiebreak=tiebreak)
        # Acc / Agr need both orders: without the swap there is nothing to compare.
        return await run_pairwise(RunPlan(source, destination, grading, on_row=on_row), label_column=label_column,
                                  report=report if swap else None)
