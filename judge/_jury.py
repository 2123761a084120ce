"""A Jury: several Judges on one row, one decision, in the Verdict shape a single Judge returns.

Every juror judges the row at once, each through its own limiter and pacing. A juror whose
request fails (or is skipped by the budget) abstains: the answering jurors decide if they are at
least ``quorum`` (default: a majority of the jury, ``> n/2``), else the row is an error Verdict
naming each juror's error. A juror that answers unreadably (a parse failure) abstains the same
way: it gave no opinion.

Aggregates (``aggregate``):

==========  ====================================================================================
majority    the label most jurors gave; a tie between labels goes to the one named first in jury
            order (the jury's order is its priority). Default for label rubrics.
mean        the mean of the jurors' scores; the label is the offered label nearest that mean.
            Default for score rubrics (more than three distinct label scores, e.g. 1-10).
min         the lowest score and its label: the strictest juror decides.
unanimous   the label if every answering juror gave it, else ``abstained`` (no score, not an
            error: a row for a human).
==========  ====================================================================================

The Verdict's ``panel`` (:class:`~judge._verdict.PanelInfo`): ``agreement`` is the share of the
answering jurors whose label is the decision's; ``jurors`` lists each juror's model, label, score
and status. Its ``usage`` is the jurors' sum.

Each juror sends under a circuit breaker of its own (judge._breaker), not the run's: a juror that
is down is soon asked no more (its rows abstain at once instead of waiting out six retries each)
and does not stop a run the other jurors can decide. Only when fewer than ``quorum`` jurors are
left standing does the jury trip the run's breaker, so a run whose jury cannot decide stops early.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from ._breaker import Breaker, Trip, breaker_scope, current_breaker
from ._protocol import JudgeIdentity, JudgeProtocol, JudgeStats, MemberUsage
from ._redact import redact_url
from ._rubric import Rubric
from ._verdict import PanelInfo, ReadInfo, Usage, Verdict

JUROR_PROBE_S = 30.0  # a juror whose breaker tripped is asked again after this long (a server outlives an outage)

Aggregate = Literal["majority", "mean", "min", "unanimous"]
AGGREGATES: tuple[str, ...] = get_args(Aggregate)


def default_aggregate(rubric: Rubric) -> Aggregate:
    """majority for label rubrics, mean for score rubrics (many distinct label scores)."""
    return "mean" if len(set(rubric.labels.values())) > 3 else "majority"


def juror_entry(verdict: Verdict, model: str) -> dict[str, Any]:
    """One juror's line in the ``jurors`` column."""
    entry: dict[str, Any] = {"model": model, "label": verdict.label, "score": verdict.score, "status": verdict.status}
    if verdict.read.served_model or verdict.read.system_fingerprint:  # who answered for this juror, as its provider says
        entry.update(served_model=verdict.read.served_model, system_fingerprint=verdict.read.system_fingerprint)
    if verdict.status != "ok":
        entry.update(error_kind=verdict.error_kind, error=verdict.error)
    return entry


def served_by_all(verdicts: Sequence[Verdict]) -> dict[str, str | None]:
    """A panel's row was answered by every member that answered: their served models and fingerprints, joined in
    member order (``-`` for one that gave none), so a change of any member's shows as a change of the row's."""
    if not any(v.read.served_model or v.read.system_fingerprint for v in verdicts):
        return {}
    return {"served_model": ", ".join(v.read.served_model or "-" for v in verdicts),
            "system_fingerprint": ", ".join(v.read.system_fingerprint or "-" for v in verdicts)}


def decide(rubric: Rubric | None, labels: Sequence[str | None], scores: Sequence[float | None],
           aggregate: Aggregate) -> tuple[str | None, float | None, bool]:
    """(label, score, decided) of the answering jurors' votes; decided False: a unanimous jury split.

    A pure function so the pairwise jury and the tests use the same rule. ``rubric`` maps a mean
    back to a label; without one (pairwise winners) the label nearest in score among the votes.
    """
    if aggregate == "majority":
        counts = Counter(labels)
        top = max(counts.values())
        label = next(lab for lab in labels if counts[lab] == top)  # first in jury order among the tied
        return label, scores[labels.index(label)], True
    if aggregate == "unanimous":
        if len(set(labels)) == 1:
            return labels[0], scores[0], True
        return None, None, False
    if aggregate == "min":
        low = min(range(len(scores)), key=lambda i: (scores[i], i))
        return labels[low], scores[low], True
    mean = sum(s for s in scores if s is not None) / len(scores)
    offered = dict(rubric.labels) if rubric is not None else dict(zip(labels, scores))
    label = min(offered, key=lambda lab: abs(offered[lab] - mean))
    return label, mean, True


class Panel:
    """What a Jury and a Cascade share: several judges behind one :class:`~judge._protocol.JudgeProtocol`,
    whose stats are their members' and whose ``aclose`` closes every member."""

    members: list[JudgeProtocol]
    usage: MemberUsage

    def stats(self) -> JudgeStats:
        """Every member's endpoints and limiter waits, and the figures per member (a panel has no one pacing)."""
        member_stats = [j.stats() for j in self.members]
        return JudgeStats(endpoints=[e for s in member_stats for e in s.endpoints],
                          held_seconds=sum(s.held_seconds for s in member_stats), members=self.usage)

    async def aclose(self) -> None:
        for member in self.members:
            await member.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Jury(Panel):
    """Several judges judging every row concurrently; a :class:`~judge._protocol.JudgeProtocol` like a Judge.

    Args:
        jurors: the Judges, in priority order (a majority tie goes to the earliest label).
        aggregate: majority, mean, min or unanimous (default: per rubric, see
            :func:`default_aggregate`).
        quorum: answering jurors needed for a decision (default: a majority, ``n // 2 + 1``).
    """

    panel_columns = ("agreement", "jurors")

    def __init__(self, jurors: Sequence[JudgeProtocol], *, aggregate: Aggregate | None = None, quorum: int | None = None) -> None:
        if not jurors:
            raise ValueError("a jury needs at least one juror")
        if aggregate is not None and aggregate not in AGGREGATES:
            raise ValueError(f"aggregate is one of {', '.join(AGGREGATES)}, not {aggregate!r}")
        n = len(jurors)
        if quorum is not None and not 1 <= quorum <= n:
            raise ValueError(f"quorum must be between 1 and the jury's size ({n}), got {quorum}")
        self.jurors = self.members = list(jurors)
        self.aggregate = aggregate
        self.quorum = quorum if quorum is not None else n // 2 + 1
        self.usage = MemberUsage()
        self._breakers: list[tuple[Breaker, float]] = [(Breaker(), 0.0) for _ in self.jurors]

    @property
    def model(self) -> str:
        return "jury(" + ", ".join(j.model for j in self.jurors) + ")"

    def identity(self) -> JudgeIdentity:
        """Each juror's model, endpoint and parameters, and the jury's rule: a resume with another jury is refused."""
        jurors = [j.identity() for j in self.jurors]
        return JudgeIdentity(model=self.model, base_url=" ".join(who.base_url or "" for who in jurors),
                             sampling={"jurors": [{"model": who.model, "base_url": redact_url(who.base_url), "params": who.sampling}
                                                  for who in jurors], "aggregate": self.aggregate, "quorum": self.quorum})

    @property
    def concurrency(self) -> int:
        """Rows a run keeps in flight: every juror is asked each row, so the busiest juror's cap bounds them."""
        return min(j.concurrency for j in self.jurors)

    async def judge(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
        """Every juror judges ``row`` at once; the answering jurors decide (see the module docstring)."""
        if rubric.is_checklist:  # votes and confidences are over one label; a checklist has one per criterion
            return Verdict(status="error", error_kind="input", error=f"rubric {rubric.name!r} is a checklist: "
                           f"a {type(self).__name__.lower()} over a checklist is not supported; grade it with one judge")
        verdicts = await asyncio.gather(*(self._ask(i, rubric, row) for i in range(len(self.jurors))))
        self._check_quorum()
        return self.combine(rubric, verdicts)

    async def _ask(self, i: int, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
        breaker, tripped_at = self._breakers[i]
        if breaker.tripped is not None:
            if not tripped_at:
                self._breakers[i] = (breaker, time.monotonic())
            elif time.monotonic() - tripped_at >= JUROR_PROBE_S:
                breaker = Breaker()  # long enough: ask it again
                self._breakers[i] = (breaker, 0.0)
        with breaker_scope(breaker):  # this task's requests report to the juror's breaker, not the run's
            verdict = await self.jurors[i].judge(rubric, row)
        if breaker.tripped is not None and verdict.error and verdict.error.startswith("not sent: the run stopped because "):
            # The run goes on without this juror: say so rather than that the run stopped.
            verdict = verdict.model_copy(update={"error": "not sent: this juror is left out for now because "
                                                          + verdict.error.removeprefix("not sent: the run stopped because ")})
        return verdict

    def _check_quorum(self) -> None:
        """Trip the run's breaker once too few jurors are standing to reach the quorum."""
        run = current_breaker()
        if run is None or run.tripped is not None:
            return
        down = [(j, b.tripped) for j, (b, _) in zip(self.jurors, self._breakers) if b.tripped is not None]
        if len(self.jurors) - len(down) < self.quorum:
            first = down[0][1]
            assert first is not None
            run.tripped = Trip(first.kind, first.example, f"{len(down)} of {len(self.jurors)} jurors look broken, the quorum is "
                               f"{self.quorum} ({'; '.join(f'{j.model}: {t.rule}' for j, t in down if t)})", first.base_url, first.model)

    def combine(self, rubric: Rubric, verdicts: Sequence[Verdict]) -> Verdict:
        """The jury's Verdict from its jurors' (in jury order)."""
        jurors = [juror_entry(v, j.model) for j, v in zip(self.jurors, verdicts)]
        models = [j.model for j in self.jurors]
        for i, (j, v) in enumerate(zip(self.jurors, verdicts)):
            # Two jurors of one model (say, on two providers) are counted apart: each judged every row.
            self.usage.add(j.model, v, f"{j.model} #{i + 1}" if models.count(j.model) > 1 else None)
        usage: dict[str, Any] = {
            "usage": sum((v.usage for v in verdicts), Usage()),
            "latency_s": max(v.latency_s for v in verdicts),
            "cached": all(v.cached for v in verdicts),
            # A trajectory: what the jurors were shown (each fitted into its own window; the first juror's is said).
            "coverage": next((v.coverage for v in verdicts if v.coverage is not None), None),
            **served_by_all(verdicts),
        }
        answered = [(j, v) for j, v in zip(self.jurors, verdicts) if v.status == "ok"]
        if len(answered) < self.quorum:
            failed = [v for v in verdicts if v.status != "ok"]
            if all(v.status == "skipped" for v in failed) and not answered:
                return Verdict(status="skipped", error_kind="budget", error=failed[0].error, panel=PanelInfo(jurors=jurors), **usage)
            kinds = Counter(v.error_kind for v in failed if v.error_kind)
            named = "; ".join(f"{j.model}: {v.error_kind}: {v.error}" for j, v in zip(self.jurors, verdicts) if v.status != "ok")
            return Verdict(status="error", error_kind=kinds.most_common(1)[0][0] if kinds else "server_error",
                           error=f"jury: {len(answered)} of {len(self.jurors)} jurors answered, quorum {self.quorum}: {named}",
                           panel=PanelInfo(jurors=jurors), **usage)
        aggregate = self.aggregate or default_aggregate(rubric)
        labels = [v.label for _, v in answered]
        scores = [v.score for _, v in answered]
        label, score, decided = decide(rubric, labels, scores, aggregate)
        agreeing = [v for _, v in answered if v.label == label]
        if not decided:
            split = ", ".join(f"{lab}: {n}" for lab, n in Counter(labels).most_common())
            top = Counter(labels).most_common(1)[0][1]
            return Verdict(status="abstained", error_kind="abstained", panel=PanelInfo(agreement=top / len(answered), jurors=jurors),
                           error=f"jury (unanimous): the jurors split ({split})", **usage)
        first = agreeing[0] if agreeing else answered[0][1]
        return Verdict(status="ok", score=score, label=label, rationale=first.rationale, raw=first.raw,
                       read=ReadInfo(mode=first.read.mode), panel=PanelInfo(agreement=len(agreeing) / len(answered), jurors=jurors),
                       **usage)
