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

``agreement`` is the share of the answering jurors whose label is the decision's; ``jurors``
lists each juror's model, label, score and status.

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
from typing import Any, Literal, Protocol, get_args

from ._breaker import Breaker, Trip, breaker_scope, current_breaker
from ._rubric import Rubric
from ._verdict import Verdict

JUROR_PROBE_S = 30.0  # a juror whose breaker tripped is asked again after this long (a server outlives an outage)

Aggregate = Literal["majority", "mean", "min", "unanimous"]
AGGREGATES: tuple[str, ...] = get_args(Aggregate)


class Judges(Protocol):
    """What a grader needs of a judge: a Judge, a Jury or a Cascade."""

    model: str

    async def judge(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict: ...

    async def aclose(self) -> None: ...


class Usage:
    """Requests and tokens per member model of a Jury or a Cascade in this process, for the run's summary."""

    FIELDS = ("rows", "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_hits")

    def __init__(self) -> None:
        self.by_model: dict[str, dict[str, int]] = {}  # by member: its model, or "model #i" for a model two jurors share
        self.models: dict[str, str] = {}  # member name -> its model (for prices)

    def add(self, model: str, verdict: Verdict, member: str | None = None) -> None:
        member = member or model
        self.models[member] = model
        figures = self.by_model.setdefault(member, dict.fromkeys(self.FIELDS, 0))
        figures["rows"] += 1
        figures["requests"] += verdict.attempts
        figures["prompt_tokens"] += verdict.prompt_tokens
        figures["completion_tokens"] += verdict.completion_tokens
        figures["cached_tokens"] += verdict.cached_tokens
        figures["cache_hits"] += int(verdict.cached)


def default_aggregate(rubric: Rubric) -> Aggregate:
    """majority for label rubrics, mean for score rubrics (many distinct label scores)."""
    return "mean" if len(set(rubric.labels.values())) > 3 else "majority"


def juror_entry(verdict: Verdict, model: str) -> dict[str, Any]:
    """One juror's line in the ``jurors`` column."""
    entry: dict[str, Any] = {"model": model, "label": verdict.label, "score": verdict.score, "status": verdict.status}
    if verdict.status != "ok":
        entry.update(error_kind=verdict.error_kind, error=verdict.error)
    return entry


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
    """What a Jury and a Cascade share: several Judges behind the face of one, so a run reads the attributes it
    reads off a Judge (the checkpoint's settings, the limiter, the cache, the endpoints) and closes every member."""

    members: list[Any]

    @property
    def base_url(self) -> str:
        return " ".join(getattr(j, "base_url", "") for j in self.members)

    @property
    def logprobs(self) -> int | None:
        return None

    @property
    def endpoints(self) -> list[Any]:
        """Every member's endpoints, in order (a run's ``endpoints`` figures; a member without any has none)."""
        return [e for j in self.members for e in getattr(j, "endpoints", [])]

    @property
    def limiter(self) -> Any:
        return self.members[0].limiter

    @property
    def cache(self) -> Any:
        return getattr(self.members[0], "cache", None)

    async def aclose(self) -> None:
        for member in self.members:
            await member.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Jury(Panel):
    """Several Judges judging every row concurrently; usable wherever a Judge is.

    Args:
        jurors: the Judges, in priority order (a majority tie goes to the earliest label).
        aggregate: majority, mean, min or unanimous (default: per rubric, see
            :func:`default_aggregate`).
        quorum: answering jurors needed for a decision (default: a majority, ``n // 2 + 1``).
    """

    result_columns = ("agreement", "jurors")

    def __init__(self, jurors: Sequence[Any], *, aggregate: Aggregate | None = None, quorum: int | None = None) -> None:
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
        self.usage = Usage()
        self._breakers: list[tuple[Breaker, float]] = [(Breaker(), 0.0) for _ in self.jurors]

    # The attributes a run reads off its judge (the checkpoint's settings, the limiter's concurrency).
    @property
    def model(self) -> str:
        return "jury(" + ", ".join(j.model for j in self.jurors) + ")"

    @property
    def sampling(self) -> dict[str, Any]:
        return {"jurors": [{"model": j.model, "base_url": getattr(j, "base_url", None), "params": getattr(j, "sampling", {})}
                           for j in self.jurors], "aggregate": self.aggregate, "quorum": self.quorum}

    @property
    def concurrency(self) -> int:
        """Rows a run keeps in flight: every juror is asked each row, so the busiest juror's cap bounds them."""
        return min(member_concurrency(j) for j in self.jurors)

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
        usage = {
            "prompt_tokens": sum(v.prompt_tokens for v in verdicts),
            "completion_tokens": sum(v.completion_tokens for v in verdicts),
            "reasoning_tokens": sum(v.reasoning_tokens for v in verdicts),
            "cached_tokens": sum(v.cached_tokens for v in verdicts),
            "saved_prompt_tokens": sum(v.saved_prompt_tokens for v in verdicts),
            "saved_completion_tokens": sum(v.saved_completion_tokens for v in verdicts),
            "attempts": sum(v.attempts for v in verdicts),
            "latency_s": max(v.latency_s for v in verdicts),
            "cached": all(v.cached for v in verdicts),
            "jurors": jurors,
        }
        answered = [(j, v) for j, v in zip(self.jurors, verdicts) if v.status == "ok"]
        if len(answered) < self.quorum:
            failed = [v for v in verdicts if v.status != "ok"]
            if all(v.status == "skipped" for v in failed) and not answered:
                return Verdict(status="skipped", error_kind="budget", error=failed[0].error, **usage)
            kinds = Counter(v.error_kind for v in failed if v.error_kind)
            named = "; ".join(f"{j.model}: {v.error_kind}: {v.error}" for j, v in zip(self.jurors, verdicts) if v.status != "ok")
            return Verdict(status="error", error_kind=kinds.most_common(1)[0][0] if kinds else "server_error",
                           error=f"jury: {len(answered)} of {len(self.jurors)} jurors answered, quorum {self.quorum}: {named}",
                           **usage)
        aggregate = self.aggregate or default_aggregate(rubric)
        labels = [v.label for _, v in answered]
        scores = [v.score for _, v in answered]
        label, score, decided = decide(rubric, labels, scores, aggregate)
        agreeing = [v for _, v in answered if v.label == label]
        if not decided:
            split = ", ".join(f"{lab}: {n}" for lab, n in Counter(labels).most_common())
            top = Counter(labels).most_common(1)[0][1]
            return Verdict(status="abstained", error_kind="abstained", agreement=top / len(answered),
                           error=f"jury (unanimous): the jurors split ({split})", **usage)
        first = agreeing[0] if agreeing else answered[0][1]
        return Verdict(status="ok", score=score, label=label, rationale=first.rationale, raw=first.raw, mode=first.mode,
                       agreement=len(agreeing) / len(answered), **usage)


def member_concurrency(judge: Any) -> int:
    """A member's cap on requests in flight (a Judge's, summed over its fleet; else its limiter's)."""
    found = getattr(judge, "concurrency", None)
    return int(found) if found is not None else int(judge.limiter.concurrency)
