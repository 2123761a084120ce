"""The relative group judge: one judge call ranks all n trajectories of a prompt (RULER style).

Absolute graders score each trajectory alone; GRPO only needs how the n trajectories of a prompt
compare, and a judge compares better than it scores (TRL #4707, OpenPipe's RULER). The judge sees
the trajectories under letters in a shuffled order, ranks them best first, and the ranking is
mapped back to trajectory order: rank r of n gives the reward ``1 - 2r / (n - 1)`` (best 1, worst
-1). With ``shuffles=2`` (the default) the group is judged again in the reverse of the first
order and the rewards averaged; ``metrics["position_bias"]`` is the mean absolute difference of
the two rewards per trajectory over 2 (0: the order shown changed nothing; 1: it decided
everything). Orders are seeded by the sample, so a re-run hits the cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Sequence

from gradekit.judge import JudgeProtocol, Usage, Verdict, load_rubric

from ._group import GroupGrader, GroupResult, GroupStatus, Policy, _PolicyValue
from ._members import GroupPolicy, MemberPolicy
from ._sample import Grade, Sample, Trajectory

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def parse_ranking(text: str, n: int) -> list[int] | None:
    """The shown positions, best first, from ``"C > A > B"`` (any separators); None unless every
    one of the n letters appears exactly once (a partial or repeated ranking is not a ranking)."""
    letters = re.findall(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])", text)
    shown = [LETTERS.index(x) for x in letters]
    if sorted(shown) != list(range(n)):
        return None
    return shown


def rank_rewards(n: int) -> list[float]:
    """Reward per rank, best first: 1 down to -1, evenly spaced."""
    return [1.0] if n == 1 else [1.0 - 2.0 * r / (n - 1) for r in range(n)]


def _order(sample: Sample, texts: Sequence[str], seed: int) -> list[int]:
    """A shuffled order of the trajectories, the same for the same sample and answers (cache hits on a re-run)."""
    digest = hashlib.sha256("\x00".join([str(seed), sample.prompt_text or "", *texts]).encode()).digest()
    order = list(range(len(texts)))
    random.Random(digest).shuffle(order)
    return order


def relative_group_grader(judge: JudgeProtocol, *, criteria: str | None = None, shuffles: int = 2, seed: int = 0,
                          on_judge_error: Policy = "RETRY", rubric: str = "group_rank",
                          on_member_error: MemberPolicy = "renormalize", group_deadline_s: float | None = None) -> GroupGrader:
    """A group grader that ranks all trajectories of a sample in one judge call per shuffle.

    Args:
        judge: the Judge that ranks.
        criteria: what makes one response better (shown to the judge); None for the rubric's default.
        shuffles: 1, or 2 to judge the reverse order too and measure position bias.
        seed: changes the shuffled orders.
        on_judge_error: the status (or fixed reward for all) when a judge call fails or its
            ranking cannot be read: RETRY by default, as in :func:`graders.group_grader`.
        rubric: the ranking rubric (``group_rank``, or a path to your own with the same variables).
        on_member_error: one ranking decides every member, so no member fails alone; with
            ``shuffles=2`` and one of the two rankings failed (or past the deadline), anything but
            ``drop_group`` decides the group on the ranking that finished.
        group_deadline_s: the rankings not in by then are failed as ``timeout``.
    """
    if shuffles not in (1, 2):
        raise ValueError(f"shuffles must be 1 or 2, got {shuffles}")
    spec = load_rubric(rubric)
    policy = _PolicyValue(policy=on_judge_error).policy
    members = GroupPolicy(on_member_error=on_member_error, group_deadline_s=group_deadline_s)

    async def rank(sample: Sample, texts: list[str], order: list[int], spent: list[Verdict]) -> list[float] | str:
        row = {"question": sample.prompt_text or "", "candidates": [texts[i] for i in order]}
        if criteria:
            row["criteria"] = criteria
        verdict = await judge.judge(spec, row)
        spent.append(verdict)  # what it billed, ranked or not: the group's usage
        if verdict.status != "ok":
            return f"{verdict.error_kind}: {verdict.error}"
        shown = parse_ranking(verdict.label or "", len(texts))
        if shown is None:
            return f"parse_failure: the ranking {(verdict.label or '')[:200]!r} does not name each of {LETTERS[:len(texts)]} once"
        rewards = [0.0] * len(texts)
        for position, reward in zip(shown, rank_rewards(len(texts))):
            rewards[order[position]] = reward  # the letter shown at ``position`` is trajectory order[position]
        return rewards

    async def grade_group(sample: Sample, trajectories: Sequence[Trajectory]) -> GroupResult:
        n = len(trajectories)
        if n == 0:
            return GroupResult(status=GroupStatus.DISCARD, error="no trajectories to rank")
        if n > len(LETTERS):
            return GroupResult(status=GroupStatus.DISCARD, error=f"{n} trajectories; the relative judge ranks at most {len(LETTERS)}")
        texts = [sample.with_response(t.messages).response_text for t in trajectories]
        if n == 1:
            return GroupResult(rewards=[0.0], metrics={"n": 1.0}, grades=[Grade.scored(0.0)])
        first = _order(sample, texts, seed)
        orders = [first, first[::-1]][:shuffles]
        verdicts: list[Verdict] = []
        tasks = [asyncio.ensure_future(rank(sample, texts, o, verdicts)) for o in orders]
        _done, pending = await asyncio.wait(tasks, timeout=members.group_deadline_s)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        results: list[list[float] | str] = [f"timeout: not ranked within group_deadline_s ({members.group_deadline_s:g} s)"
                                            if t in pending else t.result() for t in tasks]
        # What the judge billed for the rankings that came back (a cancelled one's request is not known).
        usage = sum((v.usage for v in verdicts), Usage())
        errors = [r for r in results if isinstance(r, str)]
        n_errors = len(errors)
        if errors and len(errors) < len(results) and members.on_member_error != "drop_group":
            results = [r for r in results if not isinstance(r, str)]  # decided on the ranking that finished
        elif errors:
            error = "relative judge: " + "; ".join(errors)
            if isinstance(policy, float):
                return GroupResult(rewards=[policy] * n, metrics={"n": float(n), "judge_errors": 1.0}, error=error, usage=usage)
            return GroupResult(status=GroupStatus(policy), error=error, metrics={"n": float(n), "judge_errors": 1.0}, usage=usage)
        runs = [r for r in results if not isinstance(r, str)]
        rewards = [sum(run[i] for run in runs) / len(runs) for i in range(n)]
        metrics = {"n": float(n), "judge_errors": float(n_errors), "shuffles": float(len(runs))}
        if len(runs) == 2:
            metrics["position_bias"] = sum(abs(a - b) for a, b in zip(*runs)) / (2 * n)
        return GroupResult(rewards=rewards, metrics=metrics, grades=[Grade.scored(r) for r in rewards], usage=usage)

    grade_group.__name__ = "relative_group_grader"  # type: ignore[attr-defined]
    return grade_group
