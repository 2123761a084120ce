"""Pairwise rewards within a group: members compared in pairs by a pairwise rubric, the verdicts fitted
with Bradley-Terry (graders._bradley_terry), each member's reward its expected win rate.

A generative reward model compares better than it scores (NeMo Gym's ``genrm_compare``, used for
Nemotron-3-Nano; TRL left it to reward functions, #4707). Which pairs are asked (``pairing``), each
request showing one member first (the rubric's ``pairwise.first`` variable):

=============  =========================================================================================
``circular``   member k against member k+1 around a seeded circle, k shown first: n requests, every member
               shown first once and second once (n = 2: the one pair in both orders)
``all_pairs``  every ordered pair: n(n-1) requests, each pair in both orders
``anchor``     every member against the anchor member (``anchor``, an index), in both orders: 2(n-1)
=============  =========================================================================================

A verdict's score ``s`` (from the first-shown side: 1 it is better, -1 worse, 0 a tie, between for a
graded rubric) is the comparison ``(first, second, (1 + s) / 2)``. A verdict that could not be read
(a parse failure, a refusal, an error past its retries, past ``group_deadline_s``) is *missing*: the
fit uses the comparisons it has and nothing stands in for it. A member with no readable comparison
left is a failed member, decided by ``on_member_error`` (``on_judge_error`` a fixed score: that
score). The reward of a fitted member is ``2 * p - 1``, ``p`` the mean over the other fitted members
of ``sigmoid(theta_i - theta_j)``: its chance of beating one of them, in [-1, 1].

Metrics: ``requests`` (judge requests sent: ``comparisons`` planned, retries included, cache hits
not), ``comparisons``, ``pairs_read``, ``pairs_unread``, ``position_bias`` (the mean score from the
first-shown side over the read comparisons: 0 for a judge that ignores the order, since a circle's
and a both-orders plan's quality differences sum to zero; 1 if the first shown always won) and,
where pairs are asked in both orders, ``order_disagreement`` (the share of such pairs whose two
orders named different winners).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any, Literal

from gradekit.judge import JudgeProtocol, Usage, Verdict, load_rubric

from ._bradley_terry import ALPHA, bradley_terry, win_rates
from ._group import GroupGrader, GroupResult, GroupStatus, Policy, _PolicyValue, group_metrics
from ._members import GroupPolicy, MemberPolicy, decide, gather_members, group_decision_metrics
from ._sample import Grade, Sample, Trajectory

Pairing = Literal["circular", "all_pairs", "anchor"]
PAIRINGS: tuple[str, ...] = ("circular", "all_pairs", "anchor")


def pair_plan(n: int, pairing: Pairing, *, order: Sequence[int] | None = None, anchor: int = 0) -> list[tuple[int, int]]:
    """The ``(shown first, shown second)`` member pairs a group of ``n`` asks (module docstring)."""
    if n < 2:
        return []
    if pairing == "circular":
        circle = list(order) if order is not None else list(range(n))
        return [(circle[k], circle[(k + 1) % n]) for k in range(n)]
    if pairing == "all_pairs":
        return [(i, j) for i in range(n) for j in range(n) if i != j]
    if pairing == "anchor":
        if not 0 <= anchor < n:
            raise ValueError(f"anchor {anchor} is not a member of a group of {n}")
        return [p for j in range(n) if j != anchor for p in ((anchor, j), (j, anchor))]
    raise ValueError(f"pairing must be one of {', '.join(PAIRINGS)}, got {pairing!r}")


def _circle(sample: Sample, texts: Sequence[str], seed: int) -> list[int]:
    """A seeded order of the members (the same for the same sample and answers: a re-run hits the cache)."""
    digest = hashlib.sha256("\x00".join([str(seed), "pairwise", sample.prompt_text or "", *texts]).encode()).digest()
    order = list(range(len(texts)))
    random.Random(digest).shuffle(order)
    return order


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _row(sample: Sample, first: str, second: str, a: str, b: str) -> dict[str, Any]:
    prompt = sample.prompt_text or ""
    return {**sample.references, "instruction": prompt, "question": prompt, "prompt": prompt, first: a, second: b}


def pairwise_group_grader(judge: JudgeProtocol, *, rubric: str = "arena_hard_pairwise", pairing: Pairing = "circular",
                          anchor: int = 0, seed: int = 0, alpha: float = ALPHA, on_judge_error: Policy = "RETRY",
                          on_member_error: MemberPolicy = "renormalize", min_members: int = 2,
                          group_deadline_s: float | None = None) -> GroupGrader:
    """A group grader from pairwise verdicts and a Bradley-Terry fit (module docstring).

    Args:
        judge: the judge that compares (a Judge, or a Jury: each comparison is then the jury's).
        rubric: a pairwise rubric (``pairwise: {first, second}`` in its spec): a shipped name or a path.
        pairing: ``circular`` (n requests), ``all_pairs`` (n(n-1)) or ``anchor`` (2(n-1)).
        anchor: the anchor member's index for ``anchor``.
        seed: changes the circle's order.
        alpha: the fit's L2 penalty (choix's ``alpha``): larger pulls strengths together.
        on_judge_error: a member with no readable comparison: a status (the member fails and
            ``on_member_error`` decides the group) or a fixed score in [-1, 1].
        on_member_error, min_members, group_deadline_s: as for :func:`graders.group_grader`;
            comparisons not in by the deadline are missing.
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {', '.join(PAIRINGS)}, got {pairing!r}")
    if not alpha > 0:
        raise ValueError(f"alpha must be above 0, got {alpha}")
    spec = load_rubric(rubric)
    if spec.pairwise is None:
        raise ValueError(f"rubric {spec.name!r} is not pairwise: its spec has no 'pairwise: {{first, second}}'")
    first_var, second_var = spec.pairwise.first, spec.pairwise.second
    policy = _PolicyValue(policy=on_judge_error).policy
    members = GroupPolicy(on_member_error=on_member_error, min_members=min_members, group_deadline_s=group_deadline_s)

    async def grade_group(sample: Sample, trajectories: Sequence[Trajectory]) -> GroupResult:
        n = len(trajectories)
        if n == 0:
            return GroupResult(status=GroupStatus.DISCARD, error="no trajectories to compare")
        if pairing == "anchor" and not anchor < n:
            return GroupResult(status=GroupStatus.DISCARD, error=f"anchor {anchor} is not a member of a group of {n}")
        texts = [sample.with_response(t.messages).response_text for t in trajectories]
        if n == 1:
            return GroupResult(rewards=[0.0], metrics={"n": 1.0, "requests": 0.0, "comparisons": 0.0}, grades=[Grade.scored(0.0)])
        plan = pair_plan(n, pairing, order=_circle(sample, texts, seed), anchor=anchor)

        def ask(i: int, j: int) -> Any:
            return lambda: judge.judge(spec, _row(sample, first_var, second_var, texts[i], texts[j]))

        verdicts: list[Verdict | None] = await gather_members([ask(i, j) for i, j in plan], members.group_deadline_s,
                                                              on_timeout=lambda _deadline: None)
        comparisons, seen, unread = [], {}, []
        for (i, j), v in zip(plan, verdicts):
            if v is None or not v.ok or v.score is None:
                why = "not in by group_deadline_s" if v is None else f"{v.error_kind or 'unread'}: {v.error or v.label}"
                unread.append(f"{i} vs {j}: {why}")
                continue
            comparisons.append((i, j, (1.0 + max(-1.0, min(1.0, v.score))) / 2.0))
            seen[(i, j)] = v.score
        usage = sum((v.usage for v in verdicts if v is not None), Usage())
        requests = usage.requests
        fitted = sorted({i for c in comparisons for i in c[:2]})
        theta = bradley_terry(n, comparisons, alpha=alpha)
        rates = win_rates(theta, fitted)
        values: list[float | None] = [2.0 * rates[i] - 1.0 if i in rates else None for i in range(n)]
        both = [(i, j) for (i, j) in seen if i < j and (j, i) in seen]
        metrics = {"n": float(n), "requests": float(requests), "comparisons": float(len(plan)), "pairs_read": float(len(comparisons)),
                   "pairs_unread": float(len(unread))}
        if comparisons:
            metrics["position_bias"] = sum(2.0 * w - 1.0 for _, _, w in comparisons) / len(comparisons)
        if both:  # the winner of (i, j) in i's frame is sign(s_ij); of (j, i), sign(-s_ji)
            metrics["order_disagreement"] = sum(_sign(seen[(i, j)]) != _sign(-seen[(j, i)]) for i, j in both) / len(both)
        lost = [i for i, v in enumerate(values) if v is None]
        grades = [Grade.scored(v, metrics={"bt_strength": theta[i], "comparisons": float(sum(i in c[:2] for c in comparisons))})
                  if v is not None else Grade.failed("error", "no readable comparison: " + ("; ".join(unread) or "none asked"),
                                                     error_kind="parse_failure")
                  for i, v in enumerate(values)]
        error = "; ".join(unread)
        if lost and isinstance(policy, float):
            for i in lost:
                values[i] = policy
                grades[i].debug.append(f"policy: member {i} has no readable comparison -> fixed score {policy:g}")
            lost = []
        decided, failed, why = decide(values, members)
        metrics.update(group_decision_metrics(n, failed, 0))
        if decided is None:
            return GroupResult(status=GroupStatus(policy), error=f"{why}: {error}", grades=grades, usage=usage,
                               metrics={**group_metrics([], grades, 0.5), **metrics})
        finished = [r for i, r in enumerate(decided) if i not in failed]
        return GroupResult(rewards=decided, grades=grades, error=error, failed_members=failed, usage=usage,
                           metrics={**group_metrics(finished, grades, 0.5), **metrics})

    grade_group.__name__ = "pairwise_group_grader"  # type: ignore[attr-defined]
    return grade_group
