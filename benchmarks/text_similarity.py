"""text_similarity's cosine and meteor: speed against a baseline in the same run, and METEOR's agreement.

- cosine: N rows through a ``text_similarity``/``cosine`` grader against the fake provider (in
  process, ``--latency`` per request), cold (every response embedded) and warm (all cached),
  against a bare ``AsyncOpenAI.embeddings.create`` loop at the same concurrency.
- fuzzy_match: pairs/s of the bit-parallel LCS against the row-by-row one it replaced (and
  rapidfuzz's ``fuzz.ratio``, when installed), on 200 LLMBar pairs.
- meteor: pairs/s of the ``meteor`` metric against ``rouge_l`` on the same pairs (LLMBar's
  output_1/output_2, shipped in eval_sets/), and the one-off WordNet load.
- agreement: the ``meteor`` grader against NLTK's ``meteor_score`` over a second, independent
  WordNet 3.0 directory (``--compare-wordnet``; default: Debian's wordnet-base in
  /usr/share/wordnet, which lacks ``lexnames``, so the shipped one is copied beside its files).

    python benchmarks/text_similarity.py [--rows 2000] [--latency 0.02] [--pairs 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def llmbar_pairs(limit: int) -> list[tuple[str, str]]:
    pairs = []
    for dataset in sorted((ROOT / "eval_sets" / "llmbar" / "data").glob("*/*/dataset.json")) + \
            sorted((ROOT / "eval_sets" / "llmbar" / "data").glob("*/dataset.json")):
        for item in json.loads(dataset.read_text(encoding="utf-8")):
            pairs.append((item["output_1"], item["output_2"]))
    return pairs[:limit]


async def cosine_speed(rows: int, latency: float, concurrency: int) -> None:
    from openai import AsyncOpenAI

    from gradekit.graders import load_grader
    from gradekit.graders._sample import Sample
    from gradekit.judge import Judge, JudgeCache, Limiter
    from gradekit.judge.testing import FakeProvider

    texts = [(f"answer {i} the cat sat on the mat", f"reference {i % 50} a cat sat") for i in range(rows)]
    samples = [Sample(response=got, references={"answer": want}) for got, want in texts]
    with FakeProvider(latency=latency) as fake, tempfile.TemporaryDirectory() as tmp:
        bare = AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        gate = asyncio.Semaphore(concurrency)

        async def one(got: str, want: str) -> None:
            async with gate:
                await bare.embeddings.create(model="text-embedding-3-large", input=[got, want], encoding_format="float")

        start = time.perf_counter()
        await asyncio.gather(*(one(got, want) for got, want in texts))
        baseline = time.perf_counter() - start
        judge = Judge("fake-judge", base_url=fake.base_url, api_key="k", cache=JudgeCache(Path(tmp) / "cache.sqlite3"),
                      limiter=Limiter(concurrency=concurrency))
        grader = load_grader({"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}",
                              "reference": "{{ item.answer }}", "evaluation_metric": "cosine"}, judge=judge)
        timings = []
        for _ in ("cold", "warm"):
            fake.reset()
            start = time.perf_counter()
            grades = await asyncio.gather(*(grader(s) for s in samples))
            timings.append(time.perf_counter() - start)
            assert all(g.ok for g in grades)
            sent = len(fake.embedding_requests())
            timings.append(sent)
        await judge.aclose()
    cold, cold_sent, warm, warm_sent = timings
    print(f"cosine, {rows} rows, {latency * 1000:.0f} ms per request, concurrency {concurrency}")
    print(f"  bare AsyncOpenAI embeddings loop   {rows / baseline:8.0f} rows/s   1.00")
    print(f"  grader, cold cache ({cold_sent} requests) {rows / cold:8.0f} rows/s   {baseline / cold:.2f}")
    print(f"  grader, warm cache ({warm_sent} requests)    {rows / warm:8.0f} rows/s   {baseline / warm:.2f}")


def over_pairs(measure: Callable[[str, str], Any], pairs: list[tuple[str, str]]) -> float:
    """Seconds ``measure`` takes over every pair, one after the other."""
    start = time.perf_counter()
    for got, want in pairs:
        measure(got, want)
    return time.perf_counter() - start


def meteor_speed(pairs: list[tuple[str, str]]) -> None:
    from gradekit.graders._meteor import load, meteor
    from gradekit.graders._text_similarity import rouge_l

    start = time.perf_counter()
    load()
    loading = time.perf_counter() - start
    baseline, took = over_pairs(rouge_l, pairs), over_pairs(meteor, pairs)
    print(f"meteor, {len(pairs)} LLMBar pairs (WordNet loaded in {loading:.1f} s, once per process)")
    print(f"  rouge_l   {len(pairs) / baseline:8.0f} pairs/s   1.00")
    print(f"  meteor    {len(pairs) / took:8.0f} pairs/s   {baseline / took:.2f}")


def _dynamic_lcs(a: str, b: str) -> int:
    """The row-by-row LCS fuzzy_match used before the bit-parallel one (the baseline)."""
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def fuzzy_speed(pairs: list[tuple[str, str]]) -> None:
    """fuzzy_match (bit-parallel LCS) against the row-by-row LCS it replaced, and rapidfuzz's C++ fuzz.ratio if installed."""
    from gradekit.graders._text_similarity import fuzzy_match

    baseline, took = over_pairs(_dynamic_lcs, pairs), over_pairs(fuzzy_match, pairs)
    chars = sum(len(a) + len(b) for a, b in pairs) / max(1, len(pairs))
    print(f"fuzzy_match, {len(pairs)} LLMBar pairs, {chars:.0f} characters a pair")
    print(f"  row-by-row LCS (before)  {len(pairs) / baseline:8.0f} pairs/s   1.00")
    print(f"  bit-parallel LCS (now)   {len(pairs) / took:8.0f} pairs/s   {baseline / took:.1f}")
    try:
        from rapidfuzz import fuzz
    except ImportError:
        return
    native = over_pairs(fuzz.ratio, pairs)
    print(f"  rapidfuzz fuzz.ratio     {len(pairs) / native:8.0f} pairs/s   {baseline / native:.1f}")


def agreement(pairs: list[tuple[str, str]], other: Path | None) -> None:
    import warnings

    from nltk.corpus.reader.wordnet import WordNetCorpusReader
    import nltk.data
    from nltk.translate.meteor_score import meteor_score

    from gradekit.graders._meteor import load, meteor

    _, shipped = load()
    other = other or Path("/usr/share/wordnet")
    if not (other / "data.noun").is_file():
        print(f"agreement: skipped, no WordNet at {other} (apt-get install wordnet-base, or --compare-wordnet DIR)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("lexnames", "data.noun", "data.verb", "data.adj", "data.adv", "index.noun", "index.verb", "index.adj",
                     "index.adv", "noun.exc", "verb.exc", "adj.exc", "adv.exc"):
            source = other / name if (other / name).is_file() else Path(shipped.root.path) / name
            shutil.copyfile(source, root / name)  # NLTK refuses a link that leaves its root
        nltk.data.path.append(str(root))

        class Reader(WordNetCorpusReader):
            def map_wn(self, version: str = "wordnet") -> None:
                return None

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = Reader(str(root), None)
        differ = [(got, want) for got, want in pairs if meteor(got, want) != meteor_score([want.split()], got.split(), wordnet=reference)]
    print(f"agreement with NLTK's meteor_score over {other}: {len(pairs) - len(differ)} of {len(pairs)} pairs exactly equal")
    for got, want in differ[:3]:
        print(f"  differs: {got[:60]!r} vs {want[:60]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--compare-wordnet", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(cosine_speed(args.rows, args.latency, args.concurrency))
    pairs = llmbar_pairs(args.pairs)
    fuzzy_speed(pairs[:200])
    meteor_speed(pairs)
    agreement(pairs, args.compare_wordnet)


if __name__ == "__main__":
    main()
