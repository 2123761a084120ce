"""Pairwise judging: ask a judge which of two outputs is better, in both orders, and settle conflicts.

A pairwise rubric (``pairwise: {first, second}`` in its spec) scores a label from the side of the
output shown first. Asked again with the two outputs swapped, the verdict is mapped back to the
input's numbering, so each pair carries two comparable verdicts. When they disagree the judge
has shown position bias on that pair, and a configured rule decides the final verdict. A file of pairs is
graded by ``runs._pairwise``; its Acc / Agr against gold labels are calibration's (``calibration._pairwise``).

The rules (``on_conflict``), in one place:

========  ===============================================================================
rule      a pair whose two orders name different winners (or, for ``vote``, any pair)
========  ===============================================================================
tie       winner "tie", score 0. A pair with an unreadable order is an error row.
first     the input-order verdict stands. A pair with an unreadable order is an error row.
third     a ``tiebreak`` judge is asked once more in input order and its verdict stands.
vote      JudgeBench / Arena-Hard: each readable order votes +1 for the output it prefers
          (strength ignored), a tie or an unreadable order (parse failure, refusal,
          truncation) votes 0; the side with the positive sum wins, a zero sum is a tie.
          A pair read from one order only is kept and marked ``orders_read = 1``.
========  ===============================================================================
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from gradekit.judge import Judge, JudgeProtocol, Jury, Rubric, Verdict

Winner = Literal["1", "2", "tie"]  # in the input's numbering: "1" is output_1 (the rubric's ``first`` variable)
ConflictRule = Literal["tie", "first", "third", "vote"]
CONFLICT_RULES: tuple[str, ...] = ("tie", "first", "third", "vote")
Decision = Literal["agree", "single", "tie", "first", "third", "vote", "jury"]
# The judge answered but nothing offered could be read: under ``vote`` such an order abstains.
# Transport failures (timeouts, 5xx, budget) are not the judge's opinion and keep the pair an error.
UNREADABLE = frozenset({"parse_failure", "refusal", "truncated", "abstained"})  # abstained: a cascade trusted no judge with it


class PairVerdict(BaseModel):
    """Both orders of one pair and the final verdict.

    ``ab`` shows the outputs in input order, ``ba`` swapped. Winners and scores are in the input's
    numbering: winner "1" means output_1 (the rubric's ``first`` variable) is better, and a score
    > 0 favours output_1. ``status == "error"`` always has ``score is None``.
    """

    ab: Verdict
    ba: Verdict | None = None
    third: Verdict | None = None
    winner_ab: Winner | None = None
    winner_ba: Winner | None = None
    score_ab: float | None = None
    score_ba: float | None = None
    agree: bool | None = None
    winner: Winner | None = None
    score: float | None = None
    decided_by: Decision | None = None
    orders_read: int = 0  # orders whose verdict was read; 1 with ``vote`` marks a pair scored from one order
    status: Literal["ok", "error"] = "ok"
    error_kind: str | None = None
    error: str | None = None
    # A jury's pair: each juror's own pair (its conflict rule applied), and how many agree with the decision.
    members: list[PairVerdict] = Field(default_factory=list)
    jurors: list[dict[str, Any]] | None = None
    agreement: float | None = None

    @property
    def verdicts(self) -> list[Verdict]:
        if self.members:
            return [v for m in self.members for v in m.verdicts]
        return [v for v in (self.ab, self.ba, self.third) if v is not None]


def _winner(score: float) -> Winner:
    return "1" if score > 0 else "2" if score < 0 else "tie"


def swapped(rubric: Rubric, values: Mapping[str, Any]) -> dict[str, Any]:
    """The same row with the rubric's two compared variables traded."""
    pair = _pair_spec(rubric)
    out = dict(values)
    out[pair.first], out[pair.second] = values.get(pair.second), values.get(pair.first)
    return out


def _pair_spec(rubric: Rubric):  # -> PairwiseSpec
    if rubric.pairwise is None:
        raise ValueError(f"rubric {rubric.name!r} is not pairwise: its spec has no 'pairwise: {{first, second}}'")
    return rubric.pairwise


def pairwise_grader(
    judge: JudgeProtocol,
    rubric: Rubric,
    *,
    swap: bool = True,
    on_conflict: ConflictRule = "tie",
    tiebreak: Judge | None = None,
) -> Callable[[Mapping[str, Any]], Awaitable[PairVerdict]]:
    """Build ``async def grade(row) -> PairVerdict`` for a pairwise rubric.

    Args:
        judge: the judge asked in both orders (the two requests run concurrently).
        rubric: a rubric with a ``pairwise`` spec.
        swap: ask the swapped order too (default). Without it the single verdict is final.
        on_conflict: when the two orders name different winners: ``"tie"`` (winner "tie",
            score 0), ``"first"`` (keep the input-order verdict) or ``"third"`` (ask
            ``tiebreak`` once more in input order and keep its verdict) or ``"vote"``
            (JudgeBench's sum of per-order votes; see the module docstring's table).
        tiebreak: the judge for ``"third"``, typically a stronger model. It must be given:
            the same judge at temperature 0 would answer from its cache with the first verdict.
    """
    _pair_spec(rubric)
    if isinstance(judge, Jury):  # each juror judges both orders under the rule, then the jury's rule decides the pair
        return _jury_pairs(judge, rubric, swap=swap, on_conflict=on_conflict, tiebreak=tiebreak)
    if on_conflict not in CONFLICT_RULES:
        raise ValueError(f"on_conflict must be one of {', '.join(CONFLICT_RULES)}, not {on_conflict!r}")
    if on_conflict == "third" and tiebreak is None:
        raise ValueError("on_conflict='third' needs a tiebreak judge (asking the same judge again repeats its first answer)")

    async def grade(row: Mapping[str, Any]) -> PairVerdict:
        if swap:
            ab, ba = await asyncio.gather(judge.judge(rubric, row), judge.judge(rubric, swapped(rubric, row)))
        else:
            ab, ba = await judge.judge(rubric, row), None
        result = PairVerdict(ab=ab, ba=ba)
        if ab.ok:
            result.score_ab = ab.score
            result.winner_ab = _winner(ab.score or 0.0)
        if ba is not None and ba.ok:
            result.score_ba = -(ba.score or 0.0)  # the swapped order favours output_2 when positive
            result.winner_ba = _winner(result.score_ba)
        result.orders_read = sum(v is not None and v.ok for v in (ab, ba))
        if on_conflict == "vote" and ba is not None:
            return _vote(result)
        failed = [(name, v) for name, v in (("ab (input order)", ab), ("ba (swapped order)", ba)) if v is not None and not v.ok]
        if failed:
            name, verdict = failed[0]
            result.status, result.error_kind = "error", verdict.error_kind
            result.error = "; ".join(f"order {n}: {v.error_kind}: {v.error}" for n, v in failed)
            return result
        if ba is None:
            result.winner, result.score, result.decided_by = result.winner_ab, result.score_ab, "single"
            return result
        assert result.score_ab is not None and result.score_ba is not None
        result.agree = result.winner_ab == result.winner_ba
        if result.agree:
            # Mean of the two: Arena-Hard-style strengths (A>>B vs A>B) average rather than pick one.
            result.winner, result.score, result.decided_by = result.winner_ab, (result.score_ab + result.score_ba) / 2, "agree"
        elif on_conflict == "tie":
            result.winner, result.score, result.decided_by = "tie", 0.0, "tie"
        elif on_conflict == "first":
            result.winner, result.score, result.decided_by = result.winner_ab, result.score_ab, "first"
        else:
            assert tiebreak is not None
            third = await tiebreak.judge(rubric, row)
            result.third, result.decided_by = third, "third"
            if not third.ok:
                result.status, result.error_kind = "error", third.error_kind
                result.error = f"orders disagree and the tiebreak failed: {third.error_kind}: {third.error}"
            else:
                result.score = third.score
                result.winner = _winner(third.score or 0.0)
        return result

    return grade


def _jury_pairs(jury: Jury, rubric: Rubric, *, swap: bool, on_conflict: ConflictRule,
                tiebreak: Judge | None) -> Callable[[Mapping[str, Any]], Awaitable[PairVerdict]]:
    """A Jury's pairwise grader: every juror's pair (both orders, its conflict rule), then the jury's rule over winners.

    Winners vote as labels ("1", "2", "tie") with their scores (> 0 favours output_1); a juror
    whose pair is an error abstains, and below the quorum the pair is an error naming each one.
    A unanimous jury that splits calls the pair a tie (LLMBar's reading of a disagreement).
    """
    from gradekit.judge._jury import decide

    graders = [pairwise_grader(j, rubric, swap=swap, on_conflict=on_conflict, tiebreak=tiebreak) for j in jury.jurors]

    def majority_of(winners: list[Winner | None]) -> Winner | None:
        read = [w for w in winners if w is not None]
        if not read:
            return None
        counts = Counter(read)
        return next(w for w in read if counts[w] == max(counts.values()))

    async def grade(row: Mapping[str, Any]) -> PairVerdict:
        pairs = list(await asyncio.gather(*(g(row) for g in graders)))
        entries = [{"model": j.model, "winner": p.winner, "score": p.score, "status": p.status,
                    **({"error_kind": p.error_kind, "error": p.error} if p.status != "ok" else {})}
                   for j, p in zip(jury.jurors, pairs)]
        answered = [p for p in pairs if p.status == "ok"]
        first = answered[0] if answered else pairs[0]
        result = PairVerdict(ab=first.ab, ba=first.ba, members=pairs, jurors=entries, decided_by="jury",
                             winner_ab=majority_of([p.winner_ab for p in pairs]), winner_ba=majority_of([p.winner_ba for p in pairs]),
                             orders_read=max((p.orders_read for p in pairs), default=0))
        if len(answered) < jury.quorum:
            failed = [(j, p) for j, p in zip(jury.jurors, pairs) if p.status != "ok"]
            result.status, result.error_kind = "error", failed[0][1].error_kind
            result.error = (f"jury: {len(answered)} of {len(pairs)} jurors judged the pair, quorum {jury.quorum}: "
                            + "; ".join(f"{j.model}: {p.error_kind}: {p.error}" for j, p in failed))
            return result
        aggregate = jury.aggregate or "majority"
        winners = [p.winner for p in answered]
        scores = [p.score if p.score is not None else 0.0 for p in answered]
        winner, score, decided = decide(None, winners, scores, aggregate)  # type: ignore[arg-type]
        if aggregate == "mean":
            winner = _winner(score or 0.0)
        elif not decided:
            winner, score = "tie", 0.0
        result.winner, result.score = winner, score  # type: ignore[assignment]
        result.agreement = sum(w == winner for w in winners) / len(winners)
        if result.winner_ab is not None and result.winner_ba is not None:
            result.agree = result.winner_ab == result.winner_ba
        return result

    return grade


def _vote(result: PairVerdict) -> PairVerdict:
    """Settle a pair by JudgeBench's votes: +1 per readable order for the output it prefers."""
    orders = (("ab (input order)", result.ab, result.winner_ab), ("ba (swapped order)", result.ba, result.winner_ba))
    hard = [(n, v) for n, v, _ in orders if v is not None and not v.ok and v.error_kind not in UNREADABLE]
    if hard or result.orders_read == 0:
        # Nothing the judge said was read, or a request failed: an error row, as under the other rules.
        failed = hard or [(n, v) for n, v, _ in orders if v is not None and not v.ok]
        result.status, result.error_kind = "error", failed[0][1].error_kind
        result.error = "; ".join(f"order {n}: {v.error_kind}: {v.error}" for n, v in failed)
        return result
    total = sum({"1": 1, "2": -1}.get(w or "", 0) for _, _, w in orders)
    if result.orders_read == 2:
        result.agree = result.winner_ab == result.winner_ba
    # Score: the mean vote, so +1 only when both orders prefer output_1, 0.5 for one vote.
    result.winner, result.score = _winner(total), total / 2
    result.decided_by = "agree" if result.agree else "vote"
    return result
