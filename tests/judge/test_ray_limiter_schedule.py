"""The limiter actor's schedule as plain Python (no Ray needed): what one ``reserve`` call books.

The actor runs the same class on the cluster (tests/runs/test_ray.py); here its arithmetic is checked
call by call, with durations measured from the actor's own clock.
"""

from __future__ import annotations

import pytest

from gradekit.judge._ray_limiter import LimiterActor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_request_times_are_spaced_one_over_rps_across_callers() -> None:
    actor = LimiterActor(clock=Clock())
    first = actor.reserve("k|10|None", 10, None, 4, 0)
    second = actor.reserve("k|10|None", 10, None, 3, 0)  # another worker: books after the first batch
    assert first[1] == pytest.approx(0.1) and first[0] == pytest.approx(0.0)
    assert second[0] == pytest.approx(0.4)  # four permits of 0.1 s booked before it
    assert actor.stats()["k|10|None"]["granted"] == 7


def test_budgets_with_other_limits_or_keys_do_not_share() -> None:
    actor = LimiterActor(clock=Clock())
    actor.reserve("a|10|None", 10, None, 10, 0)
    assert actor.reserve("b|10|None", 10, None, 1, 0)[0] == pytest.approx(0.0)
    assert actor.reserve("a|20|None", 20, None, 1, 0)[0] == pytest.approx(0.0)


def test_a_hold_delays_every_next_booking_of_its_budget() -> None:
    actor = LimiterActor(clock=Clock())
    actor.hold("k|10|None", 2.0)
    delay, _, hold = actor.reserve("k|10|None", 10, None, 1, 0)
    assert delay == pytest.approx(2.0) and hold == pytest.approx(2.0)


def test_tokens_burst_up_to_a_minutes_worth_then_wait_at_the_rate() -> None:
    actor = LimiterActor(clock=Clock())
    assert actor.reserve("k|None|600", None, 600, 0, 600)[0] == pytest.approx(0.0)  # the whole minute at once
    delay, _, _ = actor.reserve("k|None|600", None, 600, 0, 100)  # 10 tokens/s: 100 more need 10 s
    assert delay == pytest.approx(10.0)


def test_a_learnt_rate_overrides_the_told_one_until_cleared() -> None:
    actor = LimiterActor(clock=Clock())
    actor.reserve("https://x/v1|m|40|None", 40, None, 1, 0)
    actor.set_rate("https://x/v1|m", rps=10)
    assert actor.reserve("https://x/v1|m|40|None", 40, None, 1, 0)[1] == pytest.approx(0.1)
    assert actor.stats()["https://x/v1|m|40|None"]["rps"] == 10
    actor.set_rate("https://x/v1|m", rps=None)
    assert actor.reserve("https://x/v1|m|40|None", 40, None, 1, 0)[1] == pytest.approx(0.025)
