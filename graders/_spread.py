"""The reward spread check: is this reward able to teach anything on this data set?

Group-relative RL (GRPO and kin) learns from differences between the rewards of one prompt's
responses. A group whose rewards are all equal gives no signal, and Vertex warns that a reward
which is almost always the lowest (too hard) or almost always the highest (too easy) teaches
little. This module measures that over groups of rewards, streaming, in O(groups) memory.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

from pydantic import BaseModel


class SpreadReport(BaseModel):
    """How much a reward varies, over all rewards and within each group."""

    groups: int = 0
    rewards: int = 0
    all_equal_groups: int = 0
    all_equal_share: float | None = None  # of groups with 2+ rewards: their rewards are all the same
    mean: float | None = None
    variance: float | None = None  # population variance of every reward
    mean_group_std: float | None = None  # how much rewards differ within one prompt, on average
    pass_rate: float | None = None  # share of rewards >= pass_threshold
    pass_threshold: float = 0.5
    too_easy: bool = False
    too_hard: bool = False
    # Groups (2+ rewards) that teach nothing for a reason: every reward is the highest seen (too
    # easy) or the lowest seen (too hard); when those are one value the pass threshold says which.
    too_easy_groups: int = 0
    too_hard_groups: int = 0
    advice: list[str] = []


class SpreadTally:
    """Accumulates ``add(group, reward)`` calls; ``report()`` summarises them."""

    def __init__(self, *, pass_threshold: float = 0.5, easy: float = 0.9, hard: float = 0.1, flat: float = 0.5) -> None:
        if not 0.0 <= hard < easy <= 1.0:
            raise ValueError("need 0 <= hard < easy <= 1")
        self.pass_threshold, self.easy, self.hard, self.flat = pass_threshold, easy, hard, flat
        # group -> [count, first, all_equal, sum, sum of squares]
        self._groups: dict[Hashable, list] = {}
        self._n = 0
        self._sum = self._sumsq = 0.0
        self._passed = 0
        self._low = math.inf
        self._high = -math.inf

    def add(self, group: Hashable, reward: float) -> None:
        if reward is None or math.isnan(reward):
            return  # could-not-judge is not a reward: it is counted by the caller, not here
        entry = self._groups.get(group)
        if entry is None:
            self._groups[group] = [1, reward, True, reward, reward * reward]
        else:
            entry[0] += 1
            entry[2] = entry[2] and reward == entry[1]
            entry[3] += reward
            entry[4] += reward * reward
        self._n += 1
        self._sum += reward
        self._sumsq += reward * reward
        self._passed += reward >= self.pass_threshold
        self._low, self._high = min(self._low, reward), max(self._high, reward)

    def report(self) -> SpreadReport:
        if not self._n:
            return SpreadReport(pass_threshold=self.pass_threshold)
        mean = self._sum / self._n
        variance = max(0.0, self._sumsq / self._n - mean * mean)
        multi = [g for g in self._groups.values() if g[0] >= 2]
        equal = sum(1 for g in multi if g[2])
        stds = [math.sqrt(max(0.0, g[4] / g[0] - (g[3] / g[0]) ** 2)) for g in multi]
        pass_rate = self._passed / self._n
        flat_at = [g[1] for g in multi if g[2]]
        if self._high > self._low:
            easy_groups, hard_groups = flat_at.count(self._high), flat_at.count(self._low)
        else:  # every reward is one value: high or low by the pass threshold
            easy_groups = len(flat_at) if self._high >= self.pass_threshold else 0
            hard_groups = len(flat_at) - easy_groups
        report = SpreadReport(
            groups=len(self._groups),
            rewards=self._n,
            all_equal_groups=equal,
            all_equal_share=equal / len(multi) if multi else None,
            mean=mean,
            variance=variance,
            mean_group_std=sum(stds) / len(stds) if stds else None,
            pass_rate=pass_rate,
            pass_threshold=self.pass_threshold,
            too_easy=pass_rate >= self.easy,
            too_hard=pass_rate <= self.hard,
            too_easy_groups=easy_groups,
            too_hard_groups=hard_groups,
        )
        advice = []
        if report.too_easy:
            advice.append(f"too easy: {pass_rate:.0%} of rewards pass (>= {self.pass_threshold:g}); the model has little left to learn here")
        if report.too_hard:
            advice.append(f"too hard: only {pass_rate:.0%} of rewards pass (>= {self.pass_threshold:g}); the model rarely sees a success to learn from")
        if report.all_equal_share is not None and report.all_equal_share >= self.flat:
            advice.append(f"{report.all_equal_share:.0%} of groups have all-equal rewards and give group-relative RL no signal")
        if not multi:
            advice.append("no group has two or more rewards: grade several responses per prompt to measure the spread")
        report.advice = advice
        return report


def reward_spread(groups: Iterable[Sequence[float]], *, pass_threshold: float = 0.5, easy: float = 0.9, hard: float = 0.1) -> SpreadReport:
    """The spread of rewards given as one list per group (one prompt's responses).

    ``too_easy`` when at least ``easy`` of all rewards pass ``pass_threshold``; ``too_hard`` when
    at most ``hard`` of them do.
    """
    tally = SpreadTally(pass_threshold=pass_threshold, easy=easy, hard=hard)
    for i, rewards in enumerate(groups):
        for reward in rewards:
            tally.add(i, reward)
    return tally.report()
