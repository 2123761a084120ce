"""Pairwise rewards within a group: the Bradley-Terry fit against independent fits (choix's penalised
MLE on whole wins, scipy's optimiser on graded verdicts), and the group mode through the fake judge:
requests per group per pairing, rewards equal to an independent fit of the verdicts the judge gave,
an unreadable pair missing (never a score), position bias, and the config's refusals."""

from __future__ import annotations

import random
import re
from typing import Any

import numpy as np
import pytest

from gradekit.graders import GraderConfigError, Sample, Trajectory, load_group_grader
from gradekit.graders._bradley_terry import bradley_terry, win_rates
from gradekit.graders._pairwise_group import pair_plan
from gradekit.judge import Judge, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

# ---- the fit against independent implementations -----------------------------------------------------


def random_comparisons(rng: random.Random, n: int, k: int, weights: tuple[float, ...]) -> list[tuple[int, int, float]]:
    out = []
    for _ in range(k):
        i, j = rng.sample(range(n), 2)
        out.append((i, j, rng.choice(weights)))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_fit_equals_choix_on_wins_losses_ties_and_graded_verdicts(seed: int) -> None:
    choix = pytest.importorskip("choix")
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    comparisons = random_comparisons(rng, n, rng.randint(1, 30), (0.0, 0.25, 0.5, 0.75, 1.0))
    alpha = rng.choice([0.01, 0.1, 1.0])
    ours = np.array(bradley_terry(n, comparisons, alpha=alpha))
    # choix takes whole wins: each comparison four times (w = 0.75 is three wins and one loss), the penalty four times.
    data = [pair for i, j, w in comparisons for pair in [(i, j)] * round(4 * w) + [(j, i)] * round(4 * (1 - w))]
    theirs = choix.opt_pairwise(n, data, alpha=4 * alpha, tol=1e-12)
    assert ours == pytest.approx(theirs, abs=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_the_fit_equals_a_generic_optimiser_on_arbitrary_weights(seed: int) -> None:
    from scipy.optimize import minimize

    rng = random.Random(100 + seed)
    n = rng.randint(2, 8)
    comparisons = [(i, j, rng.random()) for i, j, _ in random_comparisons(rng, n, rng.randint(1, 25), (0.0,))]
    alpha = 0.05

    def objective(theta: np.ndarray) -> float:
        total = alpha * float(theta @ theta)
        for i, j, w in comparisons:
            d = theta[i] - theta[j]
            total += w * np.logaddexp(0, -d) + (1 - w) * np.logaddexp(0, d)
        return total

    theirs = minimize(objective, np.zeros(n), method="BFGS", options={"gtol": 1e-10}).x
    assert bradley_terry(n, comparisons, alpha=alpha) == pytest.approx(theirs, abs=1e-4)


def test_a_member_that_won_everything_stays_finite_and_a_member_in_no_comparison_is_zero() -> None:
    theta = bradley_terry(4, [(0, 1, 1.0), (0, 2, 1.0), (1, 2, 0.5)], alpha=0.01)
    assert all(np.isfinite(theta)) and theta[0] > theta[1] == pytest.approx(theta[2]) and theta[3] == 0.0
    rates = win_rates(theta, [0, 1, 2])
    assert rates[0] > 0.9 and rates[1] == pytest.approx(rates[2]) and sum(rates.values()) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="two different members"):
        bradley_terry(2, [(0, 0, 1.0)])


@pytest.mark.parametrize("n, pairing, requests", [
    pytest.param(8, "circular", 8, id="circular-8"), pytest.param(8, "all_pairs", 56, id="all-pairs-8"),
    pytest.param(8, "anchor", 14, id="anchor-8"), pytest.param(2, "circular", 2, id="circular-2-both-orders"),
])
def test_pair_plans(n: int, pairing: str, requests: int) -> None:
    plan = pair_plan(n, pairing)  # type: ignore[arg-type]
    assert len(plan) == requests and all(i != j for i, j in plan)
    if pairing != "anchor":  # every member shown first as often as second
        assert sorted(i for i, _ in plan) == sorted(j for _, j in plan)


# ---- the group mode through the fake judge -----------------------------------------------------------

QUALITY = {"alpha": 5, "bravo": 4, "charlie": 3, "delta": 2, "echo": 1, "foxtrot": 0, "golf": 3, "hotel": 1}
ANSWERS = list(QUALITY)


def shown(body: dict) -> tuple[str, str]:
    text = body["messages"][-1]["content"]
    a = re.search(r"<assistant_a>\s*(.*?)\s*</assistant_a>", text, re.S).group(1)  # type: ignore[union-attr]
    b = re.search(r"<assistant_b>\s*(.*?)\s*</assistant_b>", text, re.S).group(1)  # type: ignore[union-attr]
    return a, b


def verdict(a: str, b: str) -> str:
    diff = QUALITY[a] - QUALITY[b]
    return "A>>B" if diff >= 2 else "A>B" if diff == 1 else "A=B" if diff == 0 else "B>A" if diff == -1 else "B>>A"


def arena(unreadable: set[frozenset[str]] = frozenset(), first_wins: bool = False):  # type: ignore[assignment]
    def respond(body: dict) -> Reply:
        a, b = shown(body)
        if frozenset((a, b)) in unreadable:
            return Reply(content="Both are fine, I cannot decide.")
        return Reply(content=f"My final verdict is: [[{'A>>B' if first_wins else verdict(a, b)}]]")
    return respond


async def _no_wait(_: float) -> None:
    return None


def judge(fake: FakeProvider) -> Judge:
    return Judge("fake-judge", base_url=fake.base_url, api_key="k", timeout=30, cache=None, sleep=_no_wait,
                 limiter=Limiter(concurrency=16, sleep=_no_wait), retry=RetryPolicy(max_attempts=1, parse_retries=0))


SAMPLE = Sample(messages=[{"role": "user", "content": "Spell the NATO alphabet's best word."}])


def group(texts: list[str]) -> list[Trajectory]:
    return [Trajectory(messages=[{"role": "assistant", "content": t}]) for t in texts]


def config(**pairwise: Any) -> dict[str, Any]:
    return {"type": "group", "on_judge_error": "RETRY", "pairwise": {"rubric": "arena_hard_pairwise", **pairwise}}


def independent_rewards(fake: FakeProvider, texts: list[str], alpha: float) -> list[float]:
    """choix's fit of the verdicts the judge actually gave (read back from the requests), as win rates."""
    choix = pytest.importorskip("choix")
    score = {"A>>B": 1.0, "A>B": 0.5, "A=B": 0.0, "B>A": -0.5, "B>>A": -1.0}
    data = []
    for request in fake.chat_requests():
        a, b = shown(request.body)
        i, j = texts.index(a), texts.index(b)
        w = (1 + score[verdict(a, b)]) / 2
        data += [(i, j)] * round(4 * w) + [(j, i)] * round(4 * (1 - w))
    theta = choix.opt_pairwise(len(texts), data, alpha=4 * alpha, tol=1e-12)
    return [2 * np.mean([1 / (1 + np.exp(-(theta[i] - theta[j]))) for j in range(len(texts)) if j != i]) - 1
            for i in range(len(texts))]


@pytest.mark.parametrize("pairing, requests", [pytest.param("circular", 8, id="circular"), pytest.param("all_pairs", 56, id="all_pairs"),
                                               pytest.param("anchor", 14, id="anchor")])
async def test_group_rewards_equal_an_independent_fit_of_the_judges_verdicts(fake: FakeProvider, pairing: str, requests: int) -> None:
    fake.set_responder(arena())
    result = await load_group_grader(config(pairing=pairing, alpha=0.1), judge=judge(fake))(SAMPLE, group(ANSWERS))
    assert result.status == "SUCCESS" and result.metrics["requests"] == requests == result.metrics["comparisons"]
    assert len(fake.chat_requests()) == requests and result.metrics["pairs_unread"] == 0
    assert result.rewards == pytest.approx(independent_rewards(fake, ANSWERS, 0.1), abs=1e-5)
    assert result.metrics["position_bias"] == pytest.approx(0.0, abs=1e-9), "an order-blind judge: no position bias"
    if pairing == "all_pairs":
        best, worst = result.rewards[ANSWERS.index("alpha")], result.rewards[ANSWERS.index("foxtrot")]
        assert best == max(result.rewards) and worst == min(result.rewards) and result.metrics["order_disagreement"] == 0.0


async def test_an_unreadable_pair_is_missing_and_a_member_with_none_left_fails(fake: FakeProvider) -> None:
    texts = ["alpha", "bravo", "charlie", "delta"]
    # all pairs with delta unreadable: delta has no readable comparison; the others are fitted on their own pairs.
    fake.set_responder(arena(unreadable={frozenset(("delta", t)) for t in texts}))
    result = await load_group_grader(config(pairing="all_pairs"), judge=judge(fake))(SAMPLE, group(texts))
    assert result.status == "SUCCESS" and result.failed_members == [3]
    assert result.metrics["pairs_unread"] == 6 and result.metrics["pairs_read"] == 6
    assert result.grades[3].status == "error" and result.grades[3].score is None
    fitted = result.rewards[:3]
    assert result.rewards[3] == pytest.approx(sum(fitted) / 3), "renormalize's placeholder: the finished members' mean"
    assert fitted == pytest.approx(independent_rewards_of(fake, texts[:3]), abs=1e-5)
    # One unreadable pair among many: missing, the fit uses the rest; no member fails.
    fake.reset()
    fake.set_responder(arena(unreadable={frozenset(("alpha", "bravo"))}))
    result = await load_group_grader(config(pairing="all_pairs"), judge=judge(fake))(SAMPLE, group(texts))
    assert result.status == "SUCCESS" and result.failed_members == [] and result.metrics["pairs_unread"] == 2
    # Nothing readable at all: the group fails under on_judge_error (RETRY), with no reward.
    fake.reset()
    fake.set_responder(lambda body: Reply(content="no verdict"))
    result = await load_group_grader(config(pairing="circular"), judge=judge(fake))(SAMPLE, group(texts))
    assert result.status == "RETRY" and result.rewards == []


def independent_rewards_of(fake: FakeProvider, texts: list[str]) -> list[float]:
    readable = [r for r in fake.chat_requests() if all(t in texts for t in shown(r.body))]

    class Only:
        def chat_requests(self) -> list:
            return readable

    return independent_rewards(Only(), texts, 0.01)  # type: ignore[arg-type]


async def test_position_bias_is_reported(fake: FakeProvider) -> None:
    fake.set_responder(arena(first_wins=True))
    result = await load_group_grader(config(pairing="all_pairs"), judge=judge(fake))(SAMPLE, group(ANSWERS[:4]))
    assert result.metrics["position_bias"] == 1.0 and result.metrics["order_disagreement"] == 1.0
    assert result.rewards == pytest.approx([0.0] * 4, abs=1e-9), "each member won as often as it was shown first"
    fake.reset()
    fake.set_responder(arena(first_wins=True))
    result = await load_group_grader(config(pairing="circular"), judge=judge(fake))(SAMPLE, group(ANSWERS))
    assert result.metrics["position_bias"] == 1.0 and result.metrics["requests"] == 8


@pytest.mark.parametrize("node, message", [
    pytest.param({"pairwise": {"rubric": "semantic_equivalence_en"}}, "not pairwise", id="not-a-pairwise-rubric"),
    pytest.param({"pairwise": {"pairing": "tournament"}}, "pairing", id="no-such-pairing"),
    pytest.param({"pairwise": {}, "grader": {"type": "llm", "rubric": "tone"}}, "give one of", id="pairwise-and-grader"),
    pytest.param({"pairwise": {"alpha": 0}}, "alpha", id="no-penalty"),
])
def test_config_refusals(fake: FakeProvider, node: dict, message: str) -> None:
    with pytest.raises(GraderConfigError, match=message):
        load_group_grader({"type": "group", **node}, judge=judge(fake))
