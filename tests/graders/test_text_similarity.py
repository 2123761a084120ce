"""OpenAI text_similarity's cosine and meteor: embeddings through the judge's endpoint (real
loopback HTTP to the fake provider), METEOR as NLTK computes it over WordNet 3.0, both loaded
from OpenAI grader JSON, run by `gradekit validate` and exported back."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from typer.testing import CliRunner

from gradekit.graders import GraderConfigError, Sample, export_openai_grader, load_grader
from gradekit.graders.cli import app
from gradekit.judge import Breaker, JudgeCache, RetryPolicy
from gradekit.judge._breaker import breaker_scope
from gradekit.judge.testing import DownJudge, FakeProvider, Reply
from gradekit.judge.testing._fake_embeddings import embedding_vector

ROOT = Path(__file__).resolve().parents[2]
COSINE = {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}",
          "evaluation_metric": "cosine", "pass_threshold": 0.5}
METEOR = {**COSINE, "name": "meteor", "evaluation_metric": "meteor"}


@pytest.fixture(autouse=True)
def _no_similarity_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRADEKIT_EMBEDDING_MODEL", raising=False)
    monkeypatch.delenv("GRADEKIT_WORDNET", raising=False)


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def sample(response: str, answer: str) -> Sample:
    return Sample(response=response, references={"answer": answer})


# ---- the fake provider's /v1/embeddings, through the real openai SDK ----------------------------------


def test_fake_embeddings_are_deterministic_and_similar_texts_are_closer(fake: FakeProvider) -> None:
    client = OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    texts = ["The cat sat on the mat.", "the cat sat on a mat", "Quarterly revenue grew by four percent."]
    floats = client.embeddings.create(model="text-embedding-3-large", input=texts, encoding_format="float")
    decoded = client.embeddings.create(model="text-embedding-3-large", input=texts)  # the SDK's default: base64, decoded by it
    a, b, c = (item.embedding for item in floats.data)
    assert [item.index for item in floats.data] == [0, 1, 2]
    assert a == embedding_vector(texts[0]) and len(a) == 256 and math.isclose(math.fsum(x * x for x in a), 1.0)
    assert all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(decoded.data[0].embedding, a))
    assert cos(a, b) > 0.7 > 0.2 > cos(a, c)
    assert len(client.embeddings.create(model="m", input="x y", dimensions=8, encoding_format="float").data[0].embedding) == 8
    assert floats.usage.prompt_tokens > 0
    assert [r.path for r in fake.embedding_requests()] == ["/v1/embeddings"] * 3 and fake.chat_requests() == []


def test_fake_embeddings_base64_is_float32_little_endian(fake: FakeProvider) -> None:
    import httpx

    body = httpx.post(f"{fake.base_url}/embeddings", json={"model": "m", "input": "one two", "encoding_format": "base64"}).json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(embedding_vector("one two"), abs=1e-6)


@pytest.mark.parametrize(("options", "request_body", "status", "code"), [
    pytest.param({}, {"model": "m", "input": ""}, 400, None, id="empty_string"),
    pytest.param({}, {"model": "m", "input": []}, 400, None, id="empty_list"),
    pytest.param({}, {"model": "m", "input": ["ok", 3]}, 400, None, id="not_text"),
    pytest.param({"reject_embeddings": True}, {"model": "m", "input": "x"}, 404, "unknown_url", id="chat_only_server"),
    pytest.param({"embedding_models": ["text-embedding-3-small"]}, {"model": "text-embedding-3-large", "input": "x"}, 404,
                 "model_not_found", id="unknown_model"),
])
def test_fake_embeddings_refusals(options: dict[str, Any], request_body: dict[str, Any], status: int, code: str | None) -> None:
    import httpx

    with FakeProvider(**options) as fake:
        answer = httpx.post(f"{fake.base_url}/embeddings", json=request_body)
    assert answer.status_code == status
    assert answer.json()["error"]["code"] == code


def test_fake_embeddings_take_the_script_and_the_rate_limit_like_chat() -> None:
    import httpx

    with FakeProvider(script=[Reply(status=503), Reply(status=429, headers={"Retry-After": "1"})], rate_limit_rps=1000) as fake:
        statuses = [httpx.post(f"{fake.base_url}/embeddings", json={"model": "m", "input": "x"}).status_code for _ in range(3)]
        assert statuses == [503, 429, 200]
        assert "x-ratelimit-limit-requests" in httpx.post(f"{fake.base_url}/embeddings", json={"model": "m", "input": "x"}).headers
    with FakeProvider(responder=lambda body: Reply(status=500) if "BOOM" in body["input"][0] else None) as fake:
        statuses = [httpx.post(f"{fake.base_url}/embeddings", json={"model": "m", "input": [text]}).status_code for text in ("BOOM", "ok")]
        assert statuses == [500, 200]
        fake.set_responder(lambda body: Reply(content=body["messages"][-1]["content"]))  # written for chat only
        assert httpx.post(f"{fake.base_url}/embeddings", json={"model": "m", "input": "x"}).status_code == 200
    with FakeProvider(rate_limit_rps=0.001, rate_limit_burst=1) as fake:  # one request, then 429 for a long while
        statuses = [httpx.post(f"{fake.base_url}/embeddings", json={"model": "m", "input": "x"}).status_code for _ in range(2)]
    assert statuses == [200, 429] and fake.rate_limited == 1


# ---- Judge.embed: the judge's endpoint, cache, retry and breaker ------------------------------------


async def test_embed_caches_each_text_apart_from_chat(fake: FakeProvider, make_judge, tmp_path: Path) -> None:
    judge = make_judge(cache=True)
    first = await judge.embed(["the cat sat", "the answer"], model="text-embedding-3-large")
    assert first.status == "ok" and first.attempts == 1 and not first.cached
    assert first.vectors == [embedding_vector("the cat sat"), embedding_vector("the answer")]
    again = await judge.embed(["a dog ran", "the answer"], model="text-embedding-3-large")  # the shared reference is cached
    assert again.status == "ok" and again.vectors[1] == first.vectors[1] and not again.cached
    assert [r.body["input"] for r in fake.embedding_requests()] == [["the cat sat", "the answer"], ["a dog ran"]]
    hit = await judge.embed(["the answer", "the cat sat"], model="text-embedding-3-large")
    assert hit.cached and hit.attempts == 0 and len(fake.embedding_requests()) == 2
    other_model = await judge.embed(["the answer"], model="text-embedding-3-small")  # the model is part of the key
    assert other_model.attempts == 1 and len(fake.embedding_requests()) == 3
    # the same text judged as chat is not served from the embeddings entry, nor the other way round
    from gradekit.judge import load_rubric

    verdict = await judge.judge(load_rubric("semantic_equivalence_en"), {"question": "q", "references": "the answer", "prediction": "the answer"})
    assert verdict.status == "ok" and not verdict.cached and len(fake.chat_requests()) == 1
    reopened = make_judge(cache=JudgeCache(tmp_path / "cache.sqlite3"))
    assert (await reopened.embed(["the answer"], model="text-embedding-3-large")).cached


async def test_embed_retries_transient_failures_and_names_the_rest(fake: FakeProvider, make_judge, waits) -> None:
    judge = make_judge(retry=RetryPolicy(max_attempts=3))
    fake.push(Reply(status=500), Reply(status=429, headers={"Retry-After": "2"}))
    ok = await judge.embed(["x"], model="m")
    assert ok.status == "ok" and ok.attempts == 3 and 2.0 in waits  # Retry-After honoured
    fake.push(Reply(status=500), Reply(status=500), Reply(status=500))
    failed = await judge.embed(["y"], model="m")
    assert (failed.status, failed.error_kind, failed.vectors, failed.attempts) == ("error", "server_error", [], 3)
    fake.push(Reply(raw_body='{"data": "not a list"}'), Reply(raw_body="{"), Reply(drop=True))
    broken = await judge.embed(["z"], model="m")
    assert broken.status == "error" and broken.error_kind == "server_error" and broken.attempts == 3
    nan = '{"data": [{"index": 0, "embedding": [NaN, 1.0]}]}'
    fake.push(Reply(raw_body=nan), Reply(raw_body='{"data": []}'), Reply(raw_body='{"data": [{"embedding": [true]}]}'))
    assert (await judge.embed(["w"], model="m")).error_kind == "server_error", "NaN, no vector, a boolean: all malformed"


def test_cosine_of_vectors_of_two_lengths_is_an_error(fake: FakeProvider, tmp_path: Path) -> None:
    from gradekit.judge._embeddings import embedding_key

    cache = JudgeCache(tmp_path / "mixed.sqlite3")  # filled by two servers: one vector of 3 dimensions, one of 2
    cache.put(embedding_key(fake.base_url, "text-embedding-3-large", "a"), {"embedding": [1.0, 0.0, 0.0]})
    cache.put(embedding_key(fake.base_url, "text-embedding-3-large", "b"), {"embedding": [1.0, 0.0]})
    from gradekit.judge import Judge

    grader = load_grader(COSINE, judge=lambda: Judge("fake-judge", base_url=fake.base_url, api_key="k", cache=cache))
    grade = asyncio.run(grader(sample("a", "b")))
    assert grade.status == "error" and grade.score is None and "vectors of 3 and 2 dimensions" in grade.error
    assert fake.embedding_requests() == []


async def test_embed_without_the_route_or_the_model_is_a_bad_request_at_once(make_judge) -> None:
    for options, said in (({"reject_embeddings": True}, "Unknown route"), ({"embedding_models": ["other"]}, "does not exist")):
        with FakeProvider(**options) as fake:
            failed = await make_judge(base_url=fake.base_url).embed(["x"], model="text-embedding-3-large")
        assert failed.status == "error" and failed.error_kind == "bad_request" and failed.attempts == 1
        assert "/embeddings has no route or no model 'text-embedding-3-large'" in failed.error and said in failed.error


async def test_embed_failures_feed_the_run_breaker(make_judge) -> None:
    with DownJudge() as down:
        judge = make_judge(base_url=down.base_url, retry=RetryPolicy(max_attempts=1))
        breaker = Breaker(window=3, share=0.5)
        with breaker_scope(breaker):
            results = [await judge.embed([f"text {i}"], model="m") for i in range(5)]
    assert all(r.status == "error" and r.error_kind == "server_error" for r in results)
    assert breaker.tripped is not None and breaker.tripped.model == "m"
    assert down.accepted == 3, "once tripped, nothing more is sent"
    assert "not sent: the run stopped" in results[-1].error


# ---- the cosine grader, from OpenAI grader JSON ---------------------------------------------------


def cosine_grader(fake_or_url: FakeProvider | str, **node: Any):
    from gradekit.judge import Judge, Limiter

    base_url = fake_or_url if isinstance(fake_or_url, str) else fake_or_url.base_url

    async def no_wait(_: float) -> None:
        return None

    def make() -> Judge:
        return Judge("fake-judge", base_url=base_url, api_key="k", timeout=5, limiter=Limiter(concurrency=4, sleep=no_wait),
                     retry=RetryPolicy(max_attempts=2), sleep=no_wait)

    return load_grader({**COSINE, **node}, judge=make)


def test_cosine_scores_the_embeddings_of_the_endpoint(fake: FakeProvider) -> None:
    grader = cosine_grader(fake)

    async def run() -> list:
        try:
            return [await grader(sample(got, want)) for got, want in
                    [("the cat sat on the mat", "The cat sat on the mat."), ("the cat sat", "revenue grew four percent"), ("", "x"), ("", "")]]
        finally:
            await grader.aclose()

    same, apart, empty, both_empty = asyncio.run(run())
    assert same.status == "ok" and same.score == pytest.approx(1.0) and same.metrics["passed"] == 1.0
    expected = max(0.0, cos(embedding_vector("the cat sat"), embedding_vector("revenue grew four percent")))
    assert apart.score == pytest.approx(expected) and apart.metrics["passed"] == 0.0
    assert (empty.score, both_empty.score) == (0.0, 1.0), "an empty text is not sent: nothing is like something"
    bodies = [r.body for r in fake.embedding_requests()]
    assert len(bodies) == 2 and {b["model"] for b in bodies} == {"text-embedding-3-large"} and bodies[0]["encoding_format"] == "float"


def test_cosine_embedding_model_is_configurable(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    for node, env, want in (({"embedding_model": "bge-m3"}, None, "bge-m3"), ({}, "nomic-embed", "nomic-embed")):
        if env:
            monkeypatch.setenv("GRADEKIT_EMBEDDING_MODEL", env)
        grader = cosine_grader(fake, **node)
        asyncio.run(grader(sample(f"a {want}", "b")))
        assert fake.embedding_requests()[-1].body["model"] == want


@pytest.mark.parametrize("case", ["dead_endpoint", "no_embeddings_route", "unknown_model", "server_errors"])
def test_cosine_failures_are_error_grades_never_scores(case: str) -> None:
    if case == "dead_endpoint":
        with DownJudge() as down:
            grade = asyncio.run(cosine_grader(down.base_url)(sample("a", "b")))
        kind = "server_error"
    else:
        options = {"no_embeddings_route": {"reject_embeddings": True}, "unknown_model": {"embedding_models": ["x"]}}.get(case, {})
        with FakeProvider(**options) as fake:
            if case == "server_errors":
                fake.push(Reply(status=502), Reply(status=502))
            grade = asyncio.run(cosine_grader(fake)(sample("a", "b")))
        kind = "server_error" if case == "server_errors" else "bad_request"
    assert grade.status == "error" and grade.score is None and grade.error_kind == kind
    assert grade.error.startswith("grader 'close': ")


def test_cosine_with_a_missing_reference_is_invalid(fake: FakeProvider) -> None:
    grade = asyncio.run(cosine_grader(fake)(Sample(response="x", references={})))
    assert grade.status == "invalid" and grade.error_kind == "input" and fake.embedding_requests() == []


def test_cosine_needs_a_judge_and_says_so() -> None:
    from gradekit.graders import text_similarity_grader

    with pytest.raises(ValueError, match="cosine embeds both texts through the judge's endpoint"):
        text_similarity_grader("{{ sample.output_text }}", "{{ item.answer }}", "cosine")
    with pytest.raises(GraderConfigError, match="no API key"):  # the default endpoint is OpenAI's, and no key is set
        load_grader(COSINE)


# ---- round trip and validate ----------------------------------------------------------------------


@pytest.mark.parametrize("config", [COSINE, {**COSINE, "embedding_model": "bge-m3"}, METEOR], ids=["cosine", "cosine_own_model", "meteor"])
def test_exports_back_as_openai_grader_json(config: dict[str, Any]) -> None:
    exported = export_openai_grader(config)
    assert exported == {k: v for k, v in config.items() if k not in ("pass_threshold", "embedding_model")}
    from openai.types.graders import TextSimilarityGrader

    assert not TextSimilarityGrader.model_validate(exported).__pydantic_extra__


def write_case(tmp_path: Path, config: dict[str, Any], response: str, answer: str) -> list[str]:
    (tmp_path / "grader.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "example.json").write_text(json.dumps({"contents": [{"role": "user", "parts": [{"text": "q"}]}],
                                                       "references": {"answer": answer}}), encoding="utf-8")
    (tmp_path / "response.txt").write_text(response, encoding="utf-8")
    return ["validate", "--grader", str(tmp_path / "grader.json"), "--example", str(tmp_path / "example.json"),
            "--response", str(tmp_path / "response.txt"), "--json"]


def test_validate_runs_cosine_against_the_endpoint(fake: FakeProvider, tmp_path: Path) -> None:
    args = write_case(tmp_path, COSINE, "the cat sat on the mat", "the cat sat on the mat")
    result = CliRunner().invoke(app, [*args, "--base-url", fake.base_url, "--api-key", "k"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reward"] == pytest.approx(1.0)
    with FakeProvider(reject_embeddings=True) as chat_only:
        result = CliRunner().invoke(app, [*args, "--base-url", chat_only.base_url, "--api-key", "k"])
    assert result.exit_code == 1, result.output
    shown = json.loads(result.stdout)
    assert shown["reward"] is None and "bad_request" in json.dumps(shown)


# ---- meteor: NLTK's meteor_score over WordNet 3.0 -------------------------------------------------


@pytest.fixture
def wordnet() -> Any:
    """Function-scoped so the shipped copy lands in the test's own cache directory; loaded once per process."""
    from gradekit.graders._meteor import load

    return load()[1]


@pytest.mark.parametrize(("got", "want", "expected"), [
    # NLTK's own doctest value (meteor_score's docstring), computed there with WordNet
    pytest.param("It is a guide to action which ensures that the military always obeys the commands of the party",
                 "It is a guide to action that ensures that the military will forever heed Party commands", 0.6944, id="nltk_doctest"),
    # by hand: 2 of 2 words match in one chunk, car~auto only through WordNet: fmean 1, penalty 0.5 * (1/2)^3
    pytest.param("the car", "the auto", 1 - 0.5 / 8, id="wordnet_synonym"),
    # by hand: dogs~dog only through the Porter stems, the rest exact: one chunk of 3, penalty 0.5 * (1/3)^3
    pytest.param("the dogs barked", "the dog barked", 1 - 0.5 / 27, id="stem_match"),
    # ran -> WordNet's "run" (morphy reads verb.exc), which is the stem NLTK left of "runs"
    pytest.param("she ran home", "she runs home", 1 - 0.5 / 27, id="wordnet_irregular_verb"),
    # NLTK's quirk, kept because OpenAI's number is NLTK's: its synonym stage looks at the words its stem
    # stage left, stemmed ("large" is "larg" by then), so big~large is missed: 2 of 3 in 2 chunks, penalty 0.5
    pytest.param("the big dog", "the large dog", (2 / 3) * 0.5, id="nltk_synonyms_of_stems"),
    pytest.param("a b c", "x y z", 0.0, id="nothing_matches"),
    pytest.param("", "the cat", 0.0, id="empty_response"),
    pytest.param("The Cat", "the cat", 1 - 0.5 / 8, id="lower_cased"),
])
def test_meteor_values(wordnet: Any, got: str, want: str, expected: float) -> None:
    from gradekit.graders._meteor import meteor

    assert round(meteor(got, want), 4) == pytest.approx(round(expected, 4))


PAIRS = [
    ("the cat sat on the mat", "a cat was sitting on the mat"),
    ("the big dog barked loudly", "the large dog was barking"),
    ("He bought a car yesterday", "Yesterday he purchased an automobile"),
    ("The quick brown fox jumps over the lazy dog", "A fast brown fox leaped over a lazy dog"),
    ("Paris is the capital of France", "The capital of France is Paris"),
    ("I am happy", "I am glad"),
    ("the results were good", "the outcomes were excellent"),
    ("she runs every morning", "she jogs each morning"),
    ("The children are playing in the garden", "Kids play in the yard"),
    ("It is raining heavily", "It is pouring"),
    ("The movie was terrible", "The film was awful"),
    ("answer: 42", "The answer is 42."),
    ("the the the the", "the cat"),
    ("Photosynthesis converts sunlight into chemical energy", "Plants turn light into chemical energy through photosynthesis"),
    ("", ""),
    ("one", "one"),
    ("geese mice oxen", "goose mouse ox"),
    ("He was better", "He was good"),
    ("correct", "right"),
    ("The stock market fell sharply today", "Shares dropped steeply on the exchange today"),
]


def test_meteor_agrees_exactly_with_nltk_reading_wordnet_itself(wordnet: Any, tmp_path: Path) -> None:
    """NLTK's stock path, ``meteor_score(refs, hyp)`` with its default WordNet loader found on its data path,
    gives the same number as gradekit's grader for every pair."""
    import nltk.data
    from nltk.corpus import wordnet as stock
    from nltk.translate.meteor_score import meteor_score

    data = tmp_path / "nltk_data"
    (data / "corpora").mkdir(parents=True)
    (data / "corpora" / "wordnet").symlink_to(Path(wordnet.root.path), target_is_directory=True)
    nltk.data.path.insert(0, str(data))
    try:
        grader = load_grader(METEOR)
        for got, want in PAIRS:
            grade = asyncio.run(grader(sample(got, want)))
            assert grade.status == "ok"
            assert grade.score == meteor_score([want.split()], got.split(), wordnet=stock), (got, want)
    finally:
        nltk.data.path.remove(str(data))


def test_meteor_from_openai_json_runs_in_validate(tmp_path: Path) -> None:
    args = write_case(tmp_path, METEOR, "the car", "the auto")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["reward"] == pytest.approx(1 - 0.5 / 8)


def run_without_nltk(code: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter in which ``import nltk`` fails, as it does without the extra."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", "import sys; sys.modules['nltk'] = None\n" + code], env=env,
                          capture_output=True, text=True, timeout=120)


def test_meteor_without_the_extra_is_refused_at_load_and_validate_naming_it(tmp_path: Path) -> None:
    loaded = run_without_nltk(f"from gradekit.graders import load_grader\ntry:\n    load_grader({METEOR!r})\n"
                              "except Exception as e:\n    print(type(e).__name__, e)\n")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("GraderConfigError") and "pip install 'gradekit[meteor]'" in loaded.stdout
    args = write_case(tmp_path, METEOR, "a", "b")
    validated = run_without_nltk(f"sys.argv = ['gradekit', *{args!r}]\nfrom gradekit.graders.cli import main\nmain()")
    assert validated.returncode == 2, validated.stdout + validated.stderr
    assert "gradekit[meteor]" in validated.stdout + validated.stderr and "Traceback" not in validated.stderr


def test_meteor_refuses_a_wordnet_directory_that_is_not_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradekit.graders._meteor import MeteorUnavailable, wordnet_root

    monkeypatch.setenv("GRADEKIT_WORDNET", str(tmp_path))
    with pytest.raises(MeteorUnavailable, match="is not a WordNet dict directory: no lexnames"):
        wordnet_root()


def test_the_shipped_wordnet_is_copied_once_with_unix_line_ends(tmp_path: Path) -> None:
    from gradekit.graders._meteor import _unix_copy

    source = tmp_path / "source"
    source.mkdir()
    (source / "data.adj").write_bytes(b"  1 header\r\n00001740 03 n 01 entity 0 | that which is\r\n")
    (source / "lexnames").write_bytes(b"00\tadj.all\t3\r\n")
    copied = _unix_copy(source)
    assert copied == tmp_path / "xdg-cache" / "gradekit" / "wordnet-3.0"
    assert (copied / "data.adj").read_bytes() == b"  1 header\n00001740 03 n 01 entity 0 | that which is\n"
    assert (copied / "lexnames").read_bytes() == b"00\tadj.all\t3\n"
    (source / "data.adj").write_bytes(b"changed\r\n")
    assert _unix_copy(source) == copied and (copied / "data.adj").read_bytes().startswith(b"  1 header\n"), "built once"
    assert [p.name for p in copied.parent.iterdir()] == ["wordnet-3.0"], "no temporary directory left behind"
    lf = tmp_path / "lf"
    lf.mkdir()
    (lf / "data.adj").write_bytes(b"  1 header\n")
    assert _unix_copy(lf) == lf, "files with LF line ends are read where they are"


def test_nltk_loads_only_for_a_meteor_grader() -> None:
    """``gradekit --help`` and a grader of another metric never import NLTK (seconds of start-up)."""
    code = ("import sys\nfrom gradekit.graders import load_grader\n"
            f"load_grader({ {**METEOR, 'evaluation_metric': 'rouge_l'}!r})\n"
            "from gradekit.graders.cli import main\nsys.argv = ['gradekit', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nltk', 'wn')))")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
