"""text_similarity's metrics against the libraries they name, pair for pair (NLTK here; rapidfuzz and
rouge-score are not installed in the test environment, so fuzzy_match and ROUGE are not checked here)."""

from __future__ import annotations

import random

import pytest

from graders._text_similarity import bleu, gleu

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
