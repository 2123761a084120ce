"""OpenAI's ``text_similarity`` grader, run locally: every metric OpenAI offers.

The score is the metric itself, in 0..1 (OpenAI's grader returns it too; ``pass_threshold`` only
decides pass/fail). Definitions, so that a number can be checked by hand:

- ``fuzzy_match``: the normalised Indel similarity of the two strings, ``1 - (len(a) + len(b) - 2 * LCS) / (len(a) + len(b))``
  over characters: rapidfuzz's ``fuzz.ratio`` / 100, which OpenAI's graders guide names ("using rapidfuzz"),
  equal to it to the bit at any length (tests/graders/test_metrics_differential.py).
- ``bleu``: NLTK's ``sentence_bleu`` with ``method1`` smoothing over whitespace tokens (BLEU-4,
  uniform weights, brevity penalty; an order without matches counts 0.1 / its n-gram count, no
  shared word is 0), equal to NLTK's pair for pair. OpenAI's graders guide and API reference say
  only "Computes the BLEU score between input and reference" (no library, tokenizer or smoothing);
  NLTK's is the BLEU of the python grader image's package list (numpy ... nltk, rouge-score,
  rapidfuzz), so it is the one computed here.
- ``gleu``: Google-BLEU: min(precision, recall) of all 1..4-gram matches (NLTK's ``sentence_gleu``).
- ``rouge_1`` .. ``rouge_5``, ``rouge_l``: F1 of n-gram (or longest-common-subsequence) overlap over
  lower-cased alphanumeric tokens: the ``rouge-score`` package's ``RougeScorer([...], use_stemmer=False)``
  ``fmeasure`` (``rougeL``, not ``rougeLsum``), equal to it pair for pair.

- ``meteor``: NLTK's ``meteor_score`` over WordNet 3.0, with the ``gradekit[meteor]`` extra
  (``gradekit.graders._meteor`` says where WordNet comes from); without it the grader is refused when built.
- ``cosine``: the cosine similarity of the two texts' embeddings, asked of the judge's endpoint
  (``POST /embeddings``, through the judge's cache, limiter, retry and breaker). The model is
  ``text-embedding-3-large``, which OpenAI's grader uses, unless ``embedding_model`` (or
  $GRADEKIT_EMBEDDING_MODEL) names another. A failed request is an error grade, never a score;
  an empty text is not sent (the API refuses it): it scores 0, or 1 when both texts are empty.
  A negative cosine is clamped to 0 like every metric here.

Everything but ``cosine`` is computed standard-library only or by NLTK, in process.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Literal

from ._sample import Grade, Grader, PlaceholderError, Sample, fill_placeholders, route_spent

if TYPE_CHECKING:
    from gradekit.judge import Judge

Metric = Literal["fuzzy_match", "bleu", "gleu", "meteor", "cosine", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"]
DEFAULT_EMBEDDING_MODEL = "text-embedding-3-large"  # the model OpenAI's text_similarity cosine embeds with


def _lcs(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """The length of the longest common subsequence, bit-parallel (Hyyrö's form of Allison-Dix):
    one big-integer step per element of ``b``, so 100,000-character texts take well under a second
    and no text is cut short. A zero bit of ``row`` marks a position of ``a`` the LCS has used."""
    if len(a) < len(b):
        a, b = b, a
    masks: dict[Hashable, int] = {}
    for i, x in enumerate(a):
        masks[x] = masks.get(x, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full
    for y in b:
        matched = row & masks.get(y, 0)
        row = ((row + matched) | (row - matched)) & full
    return len(a) - row.bit_count()


def fuzzy_match(got: str, want: str) -> float:
    """rapidfuzz's ``fuzz.ratio(got, want) / 100``, with its float steps, so the two agree to the bit."""
    total = len(got) + len(want)
    if not total:
        return 1.0
    distance = total - 2 * _lcs(got, want)  # the Indel distance: insertions and deletions only
    return 100 * (1.0 - distance / total) / 100


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu(got: str, want: str) -> float:
    """NLTK's ``sentence_bleu([want.split()], got.split(), smoothing_function=SmoothingFunction().method1)``, written out.

    Step for step as NLTK 3.9/3.10 computes it, so the two agree pair for pair (tests/graders/test_text_similarity.py
    checks it against NLTK): no shared word is 0; an n-gram order with no match (or no n-grams at all,
    a hypothesis shorter than n) counts as 0.1 / max(1, its n-gram count); the brevity penalty is 1 only
    for a hypothesis longer than the reference.
    """
    hyp, ref = got.split(), want.split()
    precisions = []
    for n in range(1, 5):
        counts, ref_counts = _ngrams(hyp, n), _ngrams(ref, n)
        matches = sum(min(c, ref_counts[g]) for g, c in counts.items())
        if n == 1 and matches == 0:
            return 0.0
        total = max(1, sum(counts.values()))
        precisions.append(matches / total if matches else 0.1 / total)
    if len(hyp) > len(ref):
        penalty = 1.0
    else:
        penalty = math.exp(1 - len(ref) / len(hyp))
    return penalty * math.exp(math.fsum(0.25 * math.log(p) for p in precisions))


def gleu(got: str, want: str) -> float:
    hyp, ref = got.split(), want.split()
    hyp_grams = sum((_ngrams(hyp, n) for n in range(1, 5)), Counter())
    ref_grams = sum((_ngrams(ref, n) for n in range(1, 5)), Counter())
    total_hyp, total_ref = sum(hyp_grams.values()), sum(ref_grams.values())
    if not total_hyp or not total_ref:
        return 0.0
    matches = sum((hyp_grams & ref_grams).values())
    return min(matches / total_hyp, matches / total_ref)


def _rouge_tokens(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def _f1(overlap: int, got: int, want: int) -> float:
    if not got or not want or not overlap:
        return 0.0
    precision, recall = overlap / got, overlap / want
    return 2 * precision * recall / (precision + recall)


def rouge_n(n: int) -> Callable[[str, str], float]:
    def score(got: str, want: str) -> float:
        hyp, ref = _ngrams(_rouge_tokens(got), n), _ngrams(_rouge_tokens(want), n)
        return _f1(sum((hyp & ref).values()), sum(hyp.values()), sum(ref.values()))

    return score


def rouge_l(got: str, want: str) -> float:
    hyp, ref = _rouge_tokens(got), _rouge_tokens(want)
    return _f1(_lcs(hyp, ref), len(hyp), len(ref))


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match, "bleu": bleu, "gleu": gleu, "rouge_l": rouge_l, **{f"rouge_{n}": rouge_n(n) for n in range(1, 6)},
}


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors of one length; 0 when either is all zeros."""
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b)) / norms if norms else 0.0


ALL_METRICS = sorted([*METRICS, "cosine", "meteor"])


def text_similarity_grader(input: str, reference: str, evaluation_metric: Metric, *, pass_threshold: float | None = None,
                           name: str = "text_similarity", judge: Judge | None = None, embedding_model: str | None = None) -> Grader:
    """OpenAI's text_similarity: ``input`` and ``reference`` are templates (``{{ sample.output_text }}``,
    ``{{ item.answer }}``); the score is the metric in 0..1; ``metrics["passed"]`` says whether it
    reached ``pass_threshold``.

    Args:
        judge: the Judge whose endpoint embeds the texts; ``cosine`` needs one.
        embedding_model: ``cosine``'s model; default $GRADEKIT_EMBEDDING_MODEL, else text-embedding-3-large.

    Raises:
        ValueError: an unknown metric, ``cosine`` without a judge, or ``meteor`` without the
            ``gradekit[meteor]`` extra (the message names it).
    """
    if evaluation_metric == "cosine":
        if judge is None:
            raise ValueError(f"text_similarity {name!r}: cosine embeds both texts through the judge's endpoint; give it a judge")
        return _cosine_grader(input, reference, judge, embedding_model or os.environ.get("GRADEKIT_EMBEDDING_MODEL")
                              or DEFAULT_EMBEDDING_MODEL, pass_threshold=pass_threshold, name=name)
    metric = METRICS.get(evaluation_metric)
    if evaluation_metric == "meteor":
        from ._meteor import MeteorUnavailable, load, meteor

        try:
            load()  # now, so a missing extra fails the load, and the first row does not wait seconds for WordNet
        except MeteorUnavailable as e:
            raise ValueError(f"text_similarity {name!r}: {e}") from None
        metric = meteor
    if metric is None:
        raise ValueError(f"text_similarity {name!r}: unknown evaluation_metric {evaluation_metric!r}; one of {', '.join(ALL_METRICS)}")

    async def grade(sample: Sample) -> Grade:
        texts = _texts(input, reference, sample, name)
        return texts if isinstance(texts, Grade) else _scored(metric(*texts), evaluation_metric, pass_threshold, name)

    grade.__name__ = name
    return grade


def _texts(input: str, reference: str, sample: Sample, name: str) -> tuple[str, str] | Grade:
    """The filled ``input`` and ``reference``, or the invalid grade of a sample that lacks a field they name."""
    try:
        return fill_placeholders(input, sample), fill_placeholders(reference, sample)
    except PlaceholderError as e:
        return Grade.failed("invalid", f"grader {name!r}: {e}", error_kind="input")


def _scored(value: float, evaluation_metric: str, pass_threshold: float | None, name: str, *,
            metrics: dict[str, float] | None = None, debug: Sequence[str] = ()) -> Grade:
    value = max(0.0, min(1.0, value))
    passed = {} if pass_threshold is None else {"passed": float(value >= pass_threshold)}
    return Grade.scored(value, metrics={**passed, **(metrics or {})}, debug=[f"{name}: {evaluation_metric} = {value:.4f}", *debug])


def _cosine_grader(input: str, reference: str, judge: Judge, model: str, *, pass_threshold: float | None, name: str) -> Grader:
    async def grade(sample: Sample) -> Grade:
        texts = _texts(input, reference, sample, name)
        if isinstance(texts, Grade):
            return texts
        got, want = texts
        if not got or not want:  # the embeddings API refuses an empty string; nothing is like something
            return _scored(float(got == want), "cosine", pass_threshold, name, debug=[f"{name}: an empty text, not embedded"])
        embedded = await judge.embed([got, want], model=model)
        # judge_attempts and judge_cached, as an LLM grader names them, for the row's metrics; the usage counts the
        # requests only (route_spent).
        metrics = {"judge_attempts": float(embedded.attempts), "judge_cached": float(embedded.cached),
                   "embedding_prompt_tokens": float(embedded.prompt_tokens)}
        spent = route_spent(embedded)
        if embedded.status != "ok":
            return Grade.failed("error", f"grader {name!r}: {embedded.error_kind}: {embedded.error}", error_kind=embedded.error_kind,
                                metrics=metrics, **spent)
        got_vector, want_vector = embedded.vectors
        if len(got_vector) != len(want_vector):  # a cache filled by another server, or a broken one: no angle to measure
            return Grade.failed("error", f"grader {name!r}: server_error: the endpoint gave vectors of {len(got_vector)} and "
                                f"{len(want_vector)} dimensions for {model!r}", error_kind="server_error", metrics=metrics, **spent)
        return _scored(cosine(got_vector, want_vector), "cosine", pass_threshold, name, metrics=metrics,
                       debug=[f"{name}: embedded with {model}" + (" (cached)" if embedded.cached else "")]).model_copy(update=spent)

    grade.__name__ = name
    return grade
