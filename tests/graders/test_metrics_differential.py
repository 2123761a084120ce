"""text_similarity's metrics against the libraries they name, pair for pair: NLTK's BLEU and GLEU, rapidfuzz's
fuzz.ratio, rouge-score's ROUGE-N and ROUGE-L (all three in the ``test`` extra), on random word pairs, the edge
cases below, and real text (this repository's docs, line against line)."""

from __future__ import annotations

import random

import pytest

from pathlib import Path

from gradekit.graders._text_similarity import bleu, fuzzy_match, gleu, rouge_l, rouge_n

nltk_bleu = pytest.importorskip("nltk.translate.bleu_score")
nltk_gleu = pytest.importorskip("nltk.translate.gleu_score")

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "capital", "Paris", "is", "of", "France", "naïve", "café", "北京", "是", "首都",
         "😀", "x"]


def random_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        vocabulary = rng.sample(WORDS, rng.randint(2, len(WORDS)))
        pairs.append((" ".join(rng.choices(vocabulary, k=rng.randint(0, 12))), " ".join(rng.choices(vocabulary, k=rng.randint(0, 12)))))
    return pairs


EDGE = [("", ""), ("", "the cat"), ("the cat", ""), ("capital a", "dog a"), ("cat dog", "sat mat"), ("the the the the", "the"),
        ("the", "the the the the"), (" ".join(["a b c d"] * 200), " ".join(["a b c e"] * 150)), ("北京 是 首都", "北京 是 中国 的 首都"),
        ("café naïve 😀", "café naive 😀"), ("a", "a"), ("a b", "a b"), ("a b c", "a b c"), ("a b c d", "a b c d")]


def reference_bleu(got: str, want: str) -> float:
    return float(nltk_bleu.sentence_bleu([want.split()], got.split(), smoothing_function=nltk_bleu.SmoothingFunction().method1))


@pytest.mark.filterwarnings("ignore")  # NLTK warns about orders without matches
def test_bleu_equals_nltk_sentence_bleu_method1_pair_for_pair() -> None:
    pairs = random_pairs(300, seed=1) + random_pairs(3000, seed=2) + EDGE
    differ = [(got, want, bleu(got, want), reference_bleu(got, want)) for got, want in pairs
              if abs(bleu(got, want) - reference_bleu(got, want)) > 1e-12]
    assert differ == []
    # The two cases the issue found: no 3- or 4-grams at all, and no shared word.
    assert bleu("capital a", "dog a") == pytest.approx(0.1495, abs=1e-4) and bleu("cat dog", "sat mat") == 0.0


@pytest.mark.filterwarnings("ignore")
def test_gleu_equals_nltk_sentence_gleu_pair_for_pair() -> None:
    pairs = random_pairs(3000, seed=3) + EDGE
    differ = [(got, want) for got, want in pairs
              if abs(gleu(got, want) - nltk_gleu.sentence_gleu([want.split()], got.split())) > 1e-12]
    assert differ == []


def real_pairs(count: int) -> list[tuple[str, str]]:
    """Real prose with its punctuation, code and unicode: consecutive lines of the docs (and the reverse)."""
    lines = [line for path in sorted(Path(__file__).parents[2].glob("docs/*.md"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    pairs = list(zip(lines, lines[1:]))
    return pairs[:count] + [(b, a) for a, b in pairs[:count // 4]]


def char_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    alphabet = "abcde ÄéΩ北京😀\t-'"
    return [("".join(rng.choices(alphabet, k=rng.randint(0, 40))), "".join(rng.choices(alphabet, k=rng.randint(0, 40))))
            for _ in range(count)]


LONG = [("ab" * 30_000, "ba" * 25_000), ("x" * 50_000, ""), ("北京" * 12_000 + "!", "京北" * 11_000)]  # beyond any cut-off


def test_fuzzy_match_equals_rapidfuzz_ratio_to_the_bit() -> None:
    fuzz = pytest.importorskip("rapidfuzz.fuzz")
    pairs = char_pairs(3000, seed=4) + random_pairs(1000, seed=5) + real_pairs(600) + EDGE + LONG
    differ = [(got[:40], want[:40]) for got, want in pairs if fuzzy_match(got, want) != fuzz.ratio(got, want) / 100]
    assert differ == []


def test_rouge_equals_rouge_score_pair_for_pair() -> None:
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    kinds = [f"rouge{n}" for n in range(1, 6)] + ["rougeL"]
    scorer = rouge_scorer.RougeScorer(kinds, use_stemmer=False)
    ours = [rouge_n(n) for n in range(1, 6)] + [rouge_l]
    pairs = random_pairs(2000, seed=6) + real_pairs(600) + EDGE + [("It's A-b, x1!", "its a b X1"), ("naïve café", "naive cafe")]
    differ = []
    for got, want in pairs:
        scores = scorer.score(want, got)  # rouge-score takes (target, prediction)
        differ += [(kind, got[:40], want[:40]) for kind, metric in zip(kinds, ours)
                   if abs(metric(got, want) - scores[kind].fmeasure) > 1e-12]
    assert differ == []
