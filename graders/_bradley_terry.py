"""The Bradley-Terry fit of pairwise verdicts, ties and graded verdicts allowed.

Each comparison ``(i, j, w)`` says member ``i`` beat member ``j`` with weight ``w`` in [0, 1]: 1 a
win, 0 a loss, 0.5 a tie, 0.75 an "A>B" of a graded rubric (``w = (1 + score) / 2`` from the
verdict's score on the first-shown side). The strengths ``theta`` minimise

    alpha * sum(theta**2) + sum_k [ w_k * softplus(-(theta_i - theta_j)) + (1 - w_k) * softplus(theta_i - theta_j) ]

the negative log-likelihood of Bradley-Terry with each tie counted as half a win each way, plus
choix's L2 penalty (``choix.opt_pairwise``'s objective exactly, for whole wins): strictly convex
for ``alpha > 0``, so the minimum is unique and finite even when a member won every comparison.
Newton's method with a backtracking line search finds it to ``tol`` on the gradient. numpy only;
choix (``pip install choix``) is the independent fit the tests check it against.
"""

from __future__ import annotations

from collections.abc import Sequence

Comparison = tuple[int, int, float]  # (first, second, how much the first won: 0..1)
ALPHA = 0.01


def _objective(theta, first, second, w, alpha: float) -> float:
    import numpy as np  # noqa: PLC0415

    d = theta[first] - theta[second]
    return float(alpha * np.sum(theta ** 2) + np.sum(w * np.logaddexp(0.0, -d) + (1.0 - w) * np.logaddexp(0.0, d)))


def bradley_terry(n: int, comparisons: Sequence[Comparison], *, alpha: float = ALPHA, tol: float = 1e-10,
                  max_iter: int = 200) -> list[float]:
    """The penalised maximum-likelihood strengths of ``n`` members (module docstring), mean not fixed.

    A member in no comparison gets 0 (the prior's centre). Raises ValueError for a comparison that
    names a member out of range, compares a member with itself, or has a weight outside [0, 1].
    """
    import numpy as np  # noqa: PLC0415

    if not alpha > 0:
        raise ValueError(f"alpha must be above 0 (the penalty makes the fit unique), got {alpha}")
    for i, j, w in comparisons:
        if not (0 <= i < n and 0 <= j < n) or i == j or not 0.0 <= w <= 1.0:
            raise ValueError(f"comparison ({i}, {j}, {w}) is not two different members of {n} with a weight in [0, 1]")
    theta = np.zeros(n)
    if not comparisons:
        return theta.tolist()
    first = np.array([c[0] for c in comparisons], dtype=int)
    second = np.array([c[1] for c in comparisons], dtype=int)
    w = np.array([float(c[2]) for c in comparisons])
    value = _objective(theta, first, second, w, alpha)
    for _ in range(max_iter):
        d = theta[first] - theta[second]
        p = 0.5 * (1.0 + np.tanh(d / 2.0))  # sigmoid(d), without overflow
        g = p - w
        grad = 2.0 * alpha * theta
        np.add.at(grad, first, g)
        np.add.at(grad, second, -g)
        if np.max(np.abs(grad)) < tol:
            break
        h = p * (1.0 - p)
        hess = 2.0 * alpha * np.eye(n)
        np.add.at(hess, (first, first), h)
        np.add.at(hess, (second, second), h)
        np.add.at(hess, (first, second), -h)
        np.add.at(hess, (second, first), -h)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while True:  # backtracking: Newton's full step can overshoot where the sigmoid saturates
            candidate = theta - t * step
            new = _objective(candidate, first, second, w, alpha)
            if new <= value - 1e-4 * t * float(grad @ step) or t < 1e-12:
                break
            t /= 2.0
        theta, value = candidate, new
    return theta.tolist()


def win_rates(theta: Sequence[float], members: Sequence[int]) -> dict[int, float]:
    """Each member's expected chance of beating another member of ``members`` under the fit:
    the mean of ``sigmoid(theta_i - theta_j)`` over the others (0.5 when it is alone)."""
    import math  # noqa: PLC0415

    def sigmoid(x: float) -> float:
        return 0.5 * (1.0 + math.tanh(x / 2.0))

    out = {}
    for i in members:
        others = [j for j in members if j != i]
        out[i] = sum(sigmoid(theta[i] - theta[j]) for j in others) / len(others) if others else 0.5
    return out
