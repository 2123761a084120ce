"""Fitting a cascade: per-judge confidence thresholds with a guaranteed agreement with humans.

Jung, Brahman & Choi 2024 ("Trust or Escalate", arXiv 2407.18370), fixed-sequence testing: for
each judge in order, on the labelled rows that reach it (those no earlier judge was trusted
with), test the thresholds from the most confident down. At threshold t the null hypothesis is
"the rows with confidence >= t agree with humans less than ``target``"; it is rejected when the
exact one-sided Clopper-Pearson lower bound of their agreement at level 1 - delta is >= target
(the same as P[Binomial(n, target) >= agree] <= delta). The first threshold not rejected stops
the sequence (no multiplicity correction is needed, since the order is fixed before looking),
and the judge's threshold is the last one rejected; none rejected: the judge is never trusted.

What it guarantees: when the graded rows are exchangeable with the calibration rows (drawn from
the same population), each judge's trusted rows agree with humans at >= target with probability
>= 1 - delta_per_judge. With ``split_delta`` each judge is tested at delta / judges, so all the
trusted rows together hold at >= target with probability >= 1 - delta (a union bound); without it
(the paper's procedure, the default) that joint statement holds at 1 - delta x judges.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from gradekit._extras import require
from gradekit.judge import Rubric
from gradekit.judge._breaker import Breaker
from gradekit.judge._cascade import CascadeJudge, CascadeSpec, ConfidenceMethod, ThresholdTest, asked, opinion
from gradekit.judge._rubric import rubric_fingerprint

from ._agreement import as_label
from ._judging import judge_all


def clopper_pearson_lower(agree: int, n: int, delta: float) -> float:
    """Exact one-sided lower bound at level 1 - delta on a binomial proportion (0 when nothing agrees)."""
    if n <= 0 or agree <= 0:
        return 0.0
    require("calibration", "cascade fitting")
    from scipy.stats import beta

    return float(beta.ppf(delta, agree, n - agree + 1))


def fewest_to_trust(target: float, delta: float) -> int:
    """The fewest rows on which any threshold can pass: n rows that all agree pass when target**n <= delta."""
    n = 1
    while target ** n > delta:
        n += 1
    return n


def fixed_sequence(confidences: Sequence[float], correct: Sequence[bool], *, target: float,
                   delta: float) -> tuple[float | None, list[ThresholdTest]]:
    """The lowest threshold reached by testing from the most confident down; None if the first test fails."""
    pairs = sorted(zip(confidences, correct), key=lambda p: -p[0])
    tests: list[ThresholdTest] = []
    chosen: float | None = None
    n = agree = 0
    i = 0
    for t in sorted({c for c in confidences if c > 0}, reverse=True):  # confidence 0 (no logprobs) is never trusted
        while i < len(pairs) and pairs[i][0] >= t:
            n, agree, i = n + 1, agree + bool(pairs[i][1]), i + 1
        bound = clopper_pearson_lower(agree, n, delta)
        passed = bound >= target
        tests.append(ThresholdTest(threshold=t, n=n, agree=agree, lower_bound=bound, passed=passed))
        if not passed:
            break
        chosen = t
    return chosen, tests


def same_label(judge_label: Any, human: Any) -> bool:
    a, b = as_label(judge_label), as_label(human)
    return a is not None and b is not None and a.casefold() == b.casefold()


def agrees(rubric: Rubric, verdict: Any, human: Any) -> bool:
    """Does a decision agree with the human label? For a pairwise rubric the label is the winner (1, 2 or tie)
    and the decision's is read off its score's sign, as the pair rules read it."""
    if rubric.pairwise is None:
        return same_label(verdict.label, human)
    score = verdict.score or 0.0
    return as_label(human) == ("1" if score > 0 else "2" if score < 0 else "tie")


async def fit_cascade(
    judges: Sequence[Any],
    rubric: Rubric,
    rows: Sequence[Mapping[str, Any]],
    human: Sequence[Any],
    *,
    samples: int = 5,
    confidence: ConfidenceMethod = "agreement",
    target: float = 0.9,
    delta: float = 0.05,
    split_delta: bool = False,
    rubric_name: str | None = None,
    human_column: str = "label",
    demonstrations: int = 3,
    seed: int = 0,
    concurrency: int = 64,
    on_row: Any = None,
) -> CascadeSpec:
    """Fit a cascade of ``judges`` (cheapest first) on ``rows`` (rubric variables) and their ``human`` labels.

    For a pairwise rubric the human label is the winner (1, 2 or tie) and each row is judged in its
    input order; ``meta-eval --cascade`` then asks the cascade each order of a pair.

    Args:
        samples: K, the samples (or simulated annotators) per row and judge.
        confidence: agreement, simulated-annotators or logprobs (see judge._cascade).
        target, delta: the trusted rows agree with humans at >= target with probability >= 1 - delta.
        split_delta: test each judge at delta / judges, so the guarantee covers all trusted rows at once.
        demonstrations: simulated-annotators: labelled rows each annotator sees; those rows are
            taken out of the calibration set (a row must not be its own demonstration).
        on_row: called with no argument after each (row, judge) opinion, for progress.
    """
    if not 0 < target < 1 or not 0 < delta < 1:
        raise ValueError("`target` and `delta` are probabilities strictly between 0 and 1")
    if samples < 1:
        raise ValueError("`samples` must be at least 1")
    if len(rows) != len(human):
        raise ValueError("rows and human labels differ in length")
    indices = [i for i, h in enumerate(human) if as_label(h) is not None]
    spec = CascadeSpec(rubric=rubric_name or rubric.name, rubric_fingerprint=rubric_fingerprint(rubric), samples=samples,
                       confidence=confidence, target=target, delta=delta,
                       delta_per_judge=delta / len(judges) if split_delta else delta, human_column=human_column,
                       calibration_n=0, judges=[CascadeJudge.fitted(j) for j in judges])
    if confidence == "simulated-annotators":
        need = samples * demonstrations
        if len(indices) < need + 1:
            raise ValueError(f"simulated-annotators with `samples` {samples} needs more than {need} labelled rows")
        picked = random.Random(seed).sample(indices, need)
        spec.demonstrations = [{"row": dict(rows[i]), "label": human[i]} for i in picked]
        spec.demonstrations_per_annotator = demonstrations
        taken = set(picked)
        indices = [i for i in indices if i not in taken]
    spec.calibration_n = len(indices)
    if not indices:
        raise ValueError("no labelled rows to calibrate on (every human label is empty)")
    fewest = fewest_to_trust(target, spec.delta_per_judge)
    if len(indices) < fewest:
        raise ValueError(f"{len(indices)} labelled rows cannot certify any judge: at `target` {target:g} and delta "
                         f"{spec.delta_per_judge:g} the fewest rows that can pass are {fewest}, all agreeing with the humans; "
                         "label more rows (a few hundred give useful coverage)")
    rubrics = asked(rubric, samples=samples, method=confidence, spec=spec)
    async def ask_all(judge: Any, reaching: list[int]) -> list[Any]:
        """Every row's opinion, under a breaker of this judge's own (a grade run's rules)."""
        who = judge.identity()
        breaker = Breaker(endpoint=(who.base_url, who.model))

        def call(i: int) -> Any:
            return lambda: opinion(judge, rubric, rows[i], method=confidence, rubrics=rubrics)

        return await judge_all([call(i) for i in reaching], breaker, verdict=lambda found: found.verdict,
                               concurrency=concurrency, on_done=on_row)

    reaching = indices
    trusted: list[bool] = []
    for judge, fitted in zip(judges, spec.judges):
        found = await ask_all(judge, reaching)
        fitted.calibration_rows = len(reaching)
        fitted.requests = sum(f.verdict.usage.requests for f in found)
        answered = [(i, f) for i, f in zip(reaching, found) if f.verdict.status == "ok" and f.confidence is not None]
        if reaching and not answered:
            # Not a judge that is never trusted: one that never answered (down, a wrong key, another model's name).
            example = next((f.verdict for f in found if f.verdict.status == "error"), None)
            why = f"{example.error_kind}: {example.error}" if example is not None else "no reply in the rubric's format"
            raise ValueError(f"{judge.model} answered none of the {len(reaching)} labelled rows it was asked ({why}); "
                             "nothing written: fix the judge and run the same command again")
        if confidence == "logprobs" and reaching and not any(f.verdict.read.score_source == "logprobs" for _, f in answered):
            raise ValueError(f"{judge.model} returned no logprobs on any row: use `confidence` agreement")
        # A judge that failed a row is not trusted with it: the row escalates, as it would when grading.
        confs = [f.confidence for _, f in answered]
        right = [agrees(rubric, f.verdict, human[i]) for i, f in answered]
        fitted.threshold, fitted.tests = fixed_sequence(confs, right, target=target, delta=spec.delta_per_judge)  # type: ignore[arg-type]
        if fitted.threshold is not None:
            mine = [r for c, r in zip(confs, right) if c >= fitted.threshold]  # type: ignore[operator]
            fitted.trusted_rows, fitted.trusted_agreement = len(mine), sum(mine) / len(mine)
            fitted.lower_bound = next(t.lower_bound for t in fitted.tests if t.threshold == fitted.threshold)
            trusted += mine
            kept = {i for (i, f) in answered if f.confidence >= fitted.threshold}  # type: ignore[operator]
            reaching = [i for i in reaching if i not in kept]
    spec.thresholds = [j.threshold for j in spec.judges]
    spec.calibration_coverage = len(trusted) / len(indices)
    spec.calibration_agreement = sum(trusted) / len(trusted) if trusted else None
    return spec.seal()
