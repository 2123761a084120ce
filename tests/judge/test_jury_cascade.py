"""Juries and cascades (issue 23) against judges of known reliability served by the fake provider.

One fake per module, in its own process (``python -m gradekit.judge.testing --population``), so the CLI
under test and the fake each get a core. Its models answer the row's true label with a known
accuracy; each (model, row) is easy or hard, so K samples carry confidence information as real
judges' do (see judge/testing/_population.py).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from scipy.stats import binom

from gradekit.graders.calibration._cascade import clopper_pearson_lower, fixed_sequence
from gradekit.judge import Judge, Jury, Limiter, load_rubric
from gradekit.judge._jury import decide
from gradekit.judge.testing import FakeProvider, Reply

RUBRIC = "semantic_equivalence_en"
# The issue's population is 300 calibration rows and 900 graded ones; the suite grades 200 of them
# (about 5,000 requests over loopback in all) and benchmarks/cascade_population.py runs all 900 over many seeds.
GRADED = 200
JURY = 150
LABELS = ["correct", "incorrect"]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def population(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    folder = tmp_path_factory.mktemp("population")
    rng = random.Random(23)
    rows = []
    for i in range(300 + GRADED):
        rows.append({"id": i, "question": f"question {i}?", "references": ["x"], "prediction": "y", "label": rng.choice(LABELS)})
    spec = {"accuracy": {"weak": 0.77, "strong-a": 0.89, "strong-b": 0.89, "strong-c": 0.89}, "labels": LABELS,
            "truth": {str(r["id"]): r["label"] for r in rows}, "key_pattern": r"question (\d+)\?", "failing": {"down": 500},
            "seed": 23}
    (folder / "population.json").write_text(json.dumps(spec), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--population", str(folder / "population.json")],
                            stdout=subprocess.PIPE, text=True)
    try:
        base_url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        yield {"base_url": base_url, "folder": folder, "calibration": _write(folder / "calibration.jsonl", rows[:300]),
               "graded": _write(folder / "graded.jsonl", rows[300:300 + GRADED]),
               "jury": _write(folder / "jury.jsonl", rows[300:300 + JURY]),
               "truth": {r["id"]: r["label"] for r in rows}}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def gradekit(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENAI_API_KEY": "k"}
    return subprocess.run([sys.executable, "-m", "gradekit", *args], env=env, capture_output=True, text=True, timeout=280)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


FAST = ["--no-cache", "--concurrency", "64", "--no-adapt"]


def test_a_cascade_fitted_on_300_rows_trusts_the_weak_judge_where_it_can_and_keeps_its_guarantee(population) -> None:
    folder, url = population["folder"], population["base_url"]
    fitted = gradekit("cascade", "fit", str(population["calibration"]), "-r", RUBRIC, "--model", "weak", "--model", "strong-a",
                      "--samples", "5", "--target", "0.9", "--delta", "0.05", "-o", str(folder / "cascade.json"),
                      "--base-url", url, *FAST)
    assert fitted.returncode == 0, fitted.stderr
    spec = json.loads((folder / "cascade.json").read_text())
    assert (spec["samples"], spec["confidence"], spec["target"], spec["delta"], spec["calibration_n"]) == (5, "agreement", 0.9, 0.05, 300)
    assert [j["model"] for j in spec["judges"]] == ["weak", "strong-a"] and all(j["threshold"] is not None for j in spec["judges"])
    assert spec["thresholds"] == [j["threshold"] for j in spec["judges"]] and spec["rubric"] == RUBRIC
    for judge in spec["judges"]:  # fixed-sequence testing: every test before the threshold's passed, and it stopped at a failure
        assert all(t["passed"] for t in judge["tests"][:-1]) and judge["tests"][-1]["threshold"] <= judge["threshold"]

    out = folder / "cascade-out.jsonl"
    graded = gradekit("grade", str(population["graded"]), "-r", RUBRIC, "--cascade", str(folder / "cascade.json"), "-o", str(out),
                      "--base-url", url, "--json", *FAST)
    assert graded.returncode == 0, graded.stderr
    rows, truth = _rows(out), population["truth"]
    assert len(rows) == GRADED and {r["status"] for r in rows} <= {"ok", "abstained"}
    trusted = [r for r in rows if r["status"] == "ok"]
    assert all(r["score"] is None and r["label"] is None and r["decided_by"] is None for r in rows if r["status"] == "abstained")
    coverage = len(trusted) / len(rows)
    agreement = sum(r["label"] == truth[r["id"]] for r in trusted) / len(trusted)
    weak_share = sum(r["decided_by"] == "weak" for r in rows) / len(rows)
    assert coverage >= 0.85 and agreement >= 0.89 and weak_share >= 0.25, (coverage, agreement, weak_share)
    assert all(r["confidence"] >= spec["judges"][["weak", "strong-a"].index(r["decided_by"])]["threshold"] for r in trusted)

    printed = json.loads(graded.stdout)
    summary = printed["cascade"]
    assert (printed["abstained"], printed["errors"], printed["coverage"]) == (GRADED - len(trusted), 0, summary["coverage"])
    assert summary["coverage"] == pytest.approx(coverage) and summary["abstained"] == GRADED - len(trusted)
    assert summary["share"]["weak"] == pytest.approx(weak_share)
    assert summary["guarantee"] == {"target": 0.9, "delta": 0.05, "delta_per_judge": 0.05, "calibration_n": 300,
                                    "confidence": "agreement", "samples": 5}
    assert summary["strongest_alone"] == {"model": "strong-a", "requests": GRADED * 5, "cost_usd": None,
                                          "requests_ratio": pytest.approx(summary["requests"] / (GRADED * 5))}

    # calibrate reads the cascade's output like any judge's: abstained rows are left out and counted.
    report = gradekit("calibrate", str(out), "--human-column", "label", "--json", "--bootstrap", "0")
    assert report.returncode == 0, report.stderr
    classification = json.loads(report.stdout)["classification"]
    assert classification["judged"] == len(trusted) and classification["accuracy"] == pytest.approx(agreement)
    assert classification["failures_by_kind"] == {"abstained": GRADED - len(trusted)}


def test_a_jury_of_three_strong_judges_beats_each_and_a_juror_that_always_fails_abstains(population) -> None:
    folder, url, truth = population["folder"], population["base_url"], population["truth"]
    for jurors, name in ((["strong-a", "strong-b", "strong-c"], "three"), (["strong-a", "strong-b", "strong-c", "down"], "four")):
        out = folder / f"jury-{name}.jsonl"
        flags = [flag for model in jurors for flag in ("--model", model)]
        done = gradekit("grade", str(population["jury"]), "-r", RUBRIC, *flags, "--jury", "majority", "-o", str(out),
                        "--base-url", url, "--json", *FAST)
        assert done.returncode == 0, done.stderr
        rows = _rows(out)
        assert len(rows) == JURY and all(r["status"] == "ok" for r in rows)
        agreement = sum(r["label"] == truth[r["id"]] for r in rows) / len(rows)
        assert agreement >= 0.93, (name, agreement)
        entries = [json.loads(r["jurors"]) for r in rows]
        assert all([e["model"] for e in entry] == jurors for entry in entries)
        if name == "four":  # the broken juror is named on every row and never counted among those who answered
            assert all(entry[3]["status"] == "error" and entry[3]["error_kind"] == "server_error" for entry in entries)
        for row, entry in zip(rows, entries):
            answered = [e for e in entry if e["status"] == "ok"]
            assert row["agreement"] == pytest.approx(sum(e["label"] == row["label"] for e in answered) / len(answered))
        assert json.loads(done.stdout)["jury"]["quorum"] == len(jurors) // 2 + 1


@pytest.mark.parametrize(("n", "agree", "delta"), [(10, 10, 0.05), (160, 157, 0.05), (300, 270, 0.01), (5, 1, 0.2)])
def test_the_clopper_pearson_bound_is_the_exact_binomial_test(n: int, agree: int, delta: float) -> None:
    bound = clopper_pearson_lower(agree, n, delta)
    # The bound is the p at which seeing >= agree successes becomes exactly delta likely.
    assert binom.sf(agree - 1, n, bound) == pytest.approx(delta, rel=1e-6)
    assert clopper_pearson_lower(0, n, delta) == 0.0


def test_fixed_sequence_testing_stops_at_the_first_threshold_that_fails() -> None:
    # 60 rows at confidence 1.0, all right; 40 at 0.8 with 20 wrong; 100 at 0.6 all right (never reached).
    confidences = [1.0] * 60 + [0.8] * 40 + [0.6] * 100
    correct = [True] * 60 + [True, False] * 20 + [True] * 100
    threshold, tests = fixed_sequence(confidences, correct, target=0.9, delta=0.05)
    assert threshold == 1.0 and [(t.threshold, t.n, t.agree, t.passed) for t in tests] == [(1.0, 60, 60, True), (0.8, 100, 80, False)]
    assert fixed_sequence([0.6] * 10, [True] * 5 + [False] * 5, target=0.9, delta=0.05)[0] is None


def test_the_jury_rules() -> None:
    rubric = load_rubric("correctness_3way")
    labels, scores = ["CORRECT", "INCORRECT", "INCORRECT", "CORRECT"], [1.0, -1.0, -1.0, 1.0]
    assert decide(rubric, labels, scores, "majority") == ("CORRECT", 1.0, True)  # a tie goes to the label named first
    assert decide(rubric, labels[:3], scores[:3], "majority") == ("INCORRECT", -1.0, True)
    assert decide(rubric, ["CORRECT", "NOT_ATTEMPTED"], [1.0, 0.0], "min") == ("NOT_ATTEMPTED", 0.0, True)
    assert decide(rubric, ["CORRECT", "CORRECT", "INCORRECT"], [1.0, 1.0, -1.0], "mean") == ("NOT_ATTEMPTED", pytest.approx(1 / 3), True)
    assert decide(rubric, ["CORRECT", "INCORRECT"], [1.0, -1.0], "unanimous") == (None, None, False)


async def test_a_jury_below_its_quorum_is_an_error_naming_each_jurors_error(fake) -> None:
    rubric = load_rubric(RUBRIC)
    fake.set_responder(lambda body: Reply(status=400, error_message="no such model") if body["model"] != "good"
                       else Reply(content=json.dumps({"rationale": "r", "judgement": "correct"})))
    good, bad1, bad2 = (Judge(m, base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4)) for m in ("good", "bad-1", "bad-2"))
    row = {"question": "q", "references": ["a"], "prediction": "a"}
    verdict = await Jury([good, bad1, bad2]).judge(rubric, row)
    assert (verdict.status, verdict.score, verdict.error_kind) == ("error", None, "bad_request")
    assert "1 of 3 jurors answered, quorum 2" in verdict.error and "bad-1: bad_request" in verdict.error and "bad-2" in verdict.error
    verdict = await Jury([good, bad1, bad2], quorum=1).judge(rubric, row)
    assert (verdict.status, verdict.label, verdict.panel.agreement) == ("ok", "correct", 1.0)
    assert [j["status"] for j in verdict.panel.jurors] == ["ok", "error", "error"]
    for judge in (good, bad1, bad2):
        await judge.aclose()


async def test_a_yaml_jury_with_juror_endpoints_keys_and_params_grades_like_a_judge(fake, monkeypatch) -> None:
    from gradekit.graders import Sample, Trajectory, load_grader, load_group_grader

    monkeypatch.setenv("JUROR_C_KEY", "key-c")
    votes = {"a": "correct", "b": "incorrect", "c": "correct"}
    fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": votes[body["model"]]})))
    judge = {"jury": [{"model": "a", "params": {"temperature": 0.3}}, {"model": "b", "api_key": "key-b"},
                      {"model": "c", "base_url": fake.base_url, "api_key": "$JUROR_C_KEY"}],
             "base_url": fake.base_url, "aggregate": "majority", "quorum": 2}
    node = {"type": "llm", "rubric": RUBRIC, "map": {"references": "references.answer"}}
    grader = load_grader({**node, "judge": judge})
    try:
        grade = await grader(Sample(messages="Capital of France?", response="Paris", references={"answer": "Paris"}))
    finally:
        await grader.aclose()
    assert (grade.status, grade.score) == ("ok", 1.0)
    sent = {r.body["model"]: r for r in fake.chat_requests()}
    assert sent["a"].body["temperature"] == 0.3 and sent["b"].headers["authorization"] == "Bearer key-b"
    assert sent["c"].headers["authorization"] == "Bearer key-c"
    # A unanimous jury that splits abstains: in a group grader that is a judge error under its policy (RETRY).
    group = load_group_grader({"type": "group", "grader": node, "judge": {**judge, "aggregate": "unanimous"}})
    result = await group(Sample(messages="Capital?", response="Paris", references={"answer": "Paris"}),
                         [Trajectory(messages=[{"role": "assistant", "content": "Paris"}])])
    assert result.status == "RETRY" and "abstained" in result.error and "split (correct: 2, incorrect: 1)" in result.error
    from gradekit.graders import GraderConfigError

    with pytest.raises(GraderConfigError, match="quorum 4 is more than"):
        load_grader({**node, "judge": {**judge, "quorum": 4}})


async def test_a_yaml_juror_can_be_a_fleet(fake) -> None:
    from gradekit.graders import GraderConfigError, Sample, load_grader
    from gradekit.judge.testing import FakeProvider

    fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"})))
    node = {"type": "llm", "rubric": RUBRIC, "map": {"references": "references.answer"}}
    with FakeProvider(responder=lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}))) as other:
        judge = {"jury": [{"model": "a", "endpoints": [{"base_url": fake.base_url}, {"base_url": other.base_url}]},
                          {"model": "b", "base_url": fake.base_url}]}
        grader = load_grader({**node, "judge": judge})
        try:
            import asyncio

            grades = await asyncio.gather(*(grader(Sample(messages=f"Capital {i}?", response="Paris", references={"answer": "Paris"}))
                                            for i in range(12)))  # at once: a fleet spreads what is in flight
            assert all(g.status == "ok" for g in grades)
        finally:
            await grader.aclose()
        answered_a = [r for server in (fake, other) for r in server.chat_requests() if r.body["model"] == "a"]
        assert len(answered_a) == 12 and {r.body["model"] for r in other.chat_requests()} == {"a"}
    with pytest.raises(GraderConfigError, match="base_url or endpoints"):
        load_grader({**node, "judge": {"jury": [{"model": "a", "base_url": "http://x/v1", "endpoints": [{"base_url": "http://y/v1"}]}]}})


@pytest.mark.parametrize(("rule", "c_winner", "agreement"), [("tie", "tie", 2 / 3), ("first", "1", 1.0)])
async def test_a_pairwise_jury_applies_the_conflict_rule_per_juror_then_decides(fake, tmp_path, rule, c_winner, agreement) -> None:
    import re

    from gradekit.graders.calibration import grade_pairwise_file

    def respond(body: dict) -> Reply:
        first = re.search(r"<assistant_a>\n?(.*?)\n?</assistant_a>", body["messages"][-1]["content"], re.S).group(1)
        if body["model"] == "c":  # position bias: always prefers the output shown first
            return Reply(content="[[A>B]]")
        return Reply(content="[[A>B]]" if first == "SEVEN" else "[[B>A]]")

    fake.set_responder(respond)
    source = _write(tmp_path / "pairs.jsonl", [{"instruction": "Name a prime.", "output_1": "SEVEN", "output_2": "EIGHT", "label": 1}])
    jury = Jury([Judge(m, base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4)) for m in ("a", "b", "c")])
    rubric = load_rubric("arena_hard_pairwise")
    async with jury:
        summary = await grade_pairwise_file(jury, rubric, source, tmp_path / "out.jsonl", {v: v for v in rubric.variables},
                                            on_conflict=rule)
    (row,) = _rows(tmp_path / "out.jsonl")
    assert (row["winner"], row["status"], row["decided_by"], row["agreement"]) == ("1", "ok", "jury", pytest.approx(agreement))
    assert [(j["model"], j["winner"]) for j in json.loads(row["jurors"])] == [("a", "1"), ("b", "1"), ("c", c_winner)]
    assert summary.stats.usage.requests == 6  # each juror asked both orders


async def test_simulated_annotators_see_their_demonstrations_and_logprobs_give_the_labels_probability(fake) -> None:
    import math

    from gradekit.graders.calibration._cascade import fit_cascade
    from gradekit.judge import Cascade

    rubric = load_rubric(RUBRIC)
    rows = [{"question": f"question {i}?", "references": ["x"], "prediction": "y"} for i in range(30)]
    human = ["correct"] * 30

    def respond(body: dict) -> Reply:
        text = '{"rationale": "r", "judgement": "correct"}'
        head, tail = text.split("correct")
        tokens = [{"token": head, "logprob": 0.0},
                  {"token": "correct", "logprob": math.log(0.96),
                   "top_logprobs": [{"token": "correct", "logprob": math.log(0.96)}, {"token": "incorrect", "logprob": math.log(0.04)}]},
                  {"token": tail, "logprob": 0.0}]
        return Reply(content=text, logprobs=tokens)

    fake.set_responder(respond)

    def judge(**kw) -> Judge:
        return Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=8), **kw)

    spec = await fit_cascade([judge()], rubric, rows, human, samples=3, confidence="simulated-annotators", target=0.5,
                             delta=0.2, demonstrations=2)
    assert (spec.calibration_n, len(spec.demonstrations), spec.judges[0].threshold) == (24, 6, 1.0)
    first = fake.chat_requests()[0].body["messages"]
    # Two demonstrations (the row, then the human's label as the judge's reply), then the row itself.
    assert [m["role"] for m in first][-5:] == ["user", "assistant", "user", "assistant", "user"]
    assert json.loads(first[-2]["content"]) == {"judgement": "correct"}
    verdict = await Cascade([judge()], spec).judge(rubric, rows[0])  # grading asks the same three annotators
    assert (verdict.status, verdict.panel.decided_by, verdict.panel.confidence) == ("ok", "m", 1.0)

    spec = await fit_cascade([judge(logprobs=5)], rubric, rows, human, confidence="logprobs", target=0.5, delta=0.2)
    assert spec.judges[0].threshold == pytest.approx(0.96)
    assert fake.chat_requests()[-1].body["top_logprobs"] == 5


def test_meta_eval_takes_a_cascade_and_an_order_it_abstains_on_is_unreadable(fake, tmp_path) -> None:
    from typer.testing import CliRunner

    from gradekit.graders.cli import app
    from gradekit.judge import CascadeSpec
    from gradekit.judge._cascade import CascadeJudge

    # "sure" always prefers the output that is really better; "unsure" flips a coin between samples.
    def respond(body: dict) -> Reply:
        shown = body["messages"][-1]["content"]
        good_first = shown.find("GOOD") < shown.find("BAD")
        if body["model"] == "unsure" and body.get("seed", 0) % 2:
            good_first = not good_first
        return Reply(content="Output (a)" if good_first else "Output (b)")

    fake.set_responder(respond)
    pairs = [{"instruction": f"task {i}", "output_1": "GOOD" if i % 2 else "BAD", "output_2": "BAD" if i % 2 else "GOOD",
              "label": 1 if i % 2 else 2} for i in range(4)]
    suite = _write(tmp_path / "pairs.jsonl", pairs)
    for model, name in (("sure", "trusted"), ("unsure", "abstains")):
        spec = CascadeSpec(rubric="llmbar_pairwise", samples=2, target=0.9, delta=0.05, delta_per_judge=0.05, calibration_n=100,
                           judges=[CascadeJudge(model=model, base_url=fake.base_url, threshold=1.0)])
        (tmp_path / f"{name}.json").write_text(spec.model_dump_json())
        result = CliRunner().invoke(app, ["meta-eval", "--suite", str(suite), "-r", "llmbar_pairwise", "--cascade",
                                          str(tmp_path / f"{name}.json"), "--api-key", "x", "--no-cache", "--on-conflict", "vote",
                                          "--json"])
        (row,) = [r for r in json.loads(result.output)["results"] if r["subset"] == "overall"]
        assert row["judge"] == f"cascade({model})" and row["requests"] == 4 * 2 * 2  # pairs x orders x samples
        if name == "trusted":
            assert (result.exit_code, row["accuracy"], row["errors"]) == (0, 100.0, 0)
        else:  # two samples that disagree on every order: the cascade abstains on both orders, so no pair has a verdict
            assert (result.exit_code, row["errors"], row["errors_by_kind"]) == (1, 4, {"abstained": 4})


def test_jurors_take_one_base_url_each_in_the_model_order_and_a_count_that_fits_neither_rule_is_exit_2(tmp_path) -> None:
    """Several --model and as many --base-url: the i-th juror asks the i-th endpoint (one --base-url: all of them)."""
    from typer.testing import CliRunner

    from gradekit.graders.cli import app
    from gradekit.judge.testing import FakeProvider

    source = _write(tmp_path / "in.jsonl", [{"id": i, "question": f"q{i}?", "references": ["x"], "prediction": "x"} for i in range(4)])
    with FakeProvider() as first, FakeProvider() as second:
        args = ["grade", str(source), "-r", RUBRIC, "--model", "judge-a", "--model", "judge-b", "--api-key", "k", "--no-cache",
                "-o", str(tmp_path / "out.jsonl"), "--json", "--base-url", first.base_url, "--base-url", second.base_url]
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output
        assert {r.body["model"] for r in first.chat_requests()} == {"judge-a"}
        assert {r.body["model"] for r in second.chat_requests()} == {"judge-b"}
        assert len(first.chat_requests()) == len(second.chat_requests()) == 4
        assert sorted(e["base_url"] for e in json.loads(done.stdout)["endpoints"]) == sorted([first.base_url, second.base_url])
        three = CliRunner().invoke(app, [*args, "--base-url", first.base_url, "--restart"])
    assert three.exit_code == 2 and "--base-url given 3 times for a jury of 2" in " ".join(three.output.split())


def test_a_cascade_from_another_rubric_a_broken_file_and_too_few_labels_are_exit_2_before_any_request(tmp_path) -> None:
    from typer.testing import CliRunner

    from gradekit.graders.cli import app
    from gradekit.judge import CascadeSpec
    from gradekit.judge._cascade import CascadeJudge
    from gradekit.judge._rubric import rubric_fingerprint

    dead = "http://127.0.0.1:9/v1"  # nothing may be sent: every case fails first
    rows = _write(tmp_path / "rows.jsonl", [{"question": f"question {i}?", "references": ["x"], "prediction": "y", "label": "correct"}
                                            for i in range(5)])
    en = CascadeSpec(rubric=RUBRIC, rubric_fingerprint=rubric_fingerprint(load_rubric(RUBRIC)), samples=2, target=0.9, delta=0.05,
                     delta_per_judge=0.05, calibration_n=300, judges=[CascadeJudge(model="m", base_url=dead, threshold=1.0)])
    (tmp_path / "en.json").write_text(en.model_dump_json())
    (tmp_path / "cut.json").write_text(en.model_dump_json()[:80])
    (tmp_path / "nojudges.json").write_text(json.dumps({k: v for k, v in en.model_dump().items() if k != "judges"}))

    def run(*args: str):
        return CliRunner().invoke(app, [*args, "--api-key", "k", "--no-cache"])

    other = run("grade", str(rows), "-r", "semantic_equivalence_zh", "--cascade", str(tmp_path / "en.json"), "-o", str(tmp_path / "o.jsonl"))
    assert other.exit_code == 2 and "fitted on rubric 'semantic_equivalence_en', not 'semantic_equivalence_zh'" in other.output
    assert not (tmp_path / "o.jsonl").exists()
    cut = run("grade", str(rows), "-r", RUBRIC, "--cascade", str(tmp_path / "cut.json"), "-o", str(tmp_path / "o.jsonl"))
    assert cut.exit_code == 2 and "Invalid JSON" in cut.output  # what is wrong, not only "1 validation error"
    missing = run("grade", str(rows), "-r", RUBRIC, "--cascade", str(tmp_path / "nojudges.json"), "-o", str(tmp_path / "o.jsonl"))
    assert missing.exit_code == 2 and "judges: Field required" in missing.output
    few = run("cascade", "fit", str(rows), "-r", RUBRIC, "--model", "a", "--model", "b", "--base-url", dead, "-o", str(tmp_path / "c.json"))
    assert few.exit_code == 2 and "5 labelled rows cannot certify any judge" in few.output and "are 29" in few.output
    assert not (tmp_path / "c.json").exists()


def test_gradekit_grade_with_a_grader_file_uses_its_jury_and_its_judge_model(fake, tmp_path) -> None:
    # `gradekit grade --grader` built the command line's judge whatever the file said: a file's judge: {jury: [...]},
    # model and base_url were ignored and every row went to gpt-4o-mini at api.openai.com.
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    votes = {"a": "correct", "b": "incorrect", "c": "correct", "solo": "incorrect"}
    fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": votes[body["model"]]})))
    rows = _write(tmp_path / "rows.jsonl", [{"question": f"question {i}?", "references": ["x"], "prediction": "y"} for i in range(4)])
    jury = tmp_path / "jury.yaml"
    jury.write_text(f"""type: llm
rubric: {RUBRIC}
judge:
  base_url: "{fake.base_url}"
  jury: [{{model: a}}, {{model: b}}, {{model: c}}]
""", encoding="utf-8")
    solo = tmp_path / "solo.yaml"
    solo.write_text(f"type: llm\nrubric: {RUBRIC}\njudge: {{model: solo, base_url: \"{fake.base_url}\"}}\n", encoding="utf-8")
    for config, score in ((jury, 1.0), (solo, 0.0)):
        out = tmp_path / f"{config.stem}.jsonl"
        result = CliRunner().invoke(app, ["grade", str(rows), "--grader", str(config), "-o", str(out), "--api-key", "k", "--no-cache"])
        assert result.exit_code == 0, result.output
        assert [(r["status"], r["score"]) for r in _rows(out)] == [("ok", score)] * 4
    assert sorted({r.body["model"] for r in fake.chat_requests()}) == ["a", "b", "c", "solo"]


def test_two_jurors_of_one_model_are_reported_apart(fake, tmp_path) -> None:
    # The same model twice (say, on two providers): the jury block had one merged entry (rows twice the file's).
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"})))
    rows = _write(tmp_path / "rows.jsonl", [{"question": f"question {i}?", "references": ["x"], "prediction": "y"} for i in range(3)])
    result = CliRunner().invoke(app, ["grade", str(rows), "-r", RUBRIC, "--model", "m", "--model", "m", "--model", "n", "--base-url", fake.base_url, "-o", str(tmp_path / "o.jsonl"), "--api-key", "k", "--no-cache", "--json"])
    assert result.exit_code == 0, result.output
    members = json.loads(result.stdout)["jury"]["members"]
    assert [(m["model"], m.get("juror"), m["rows"]) for m in members] == [("m", "m #1", 3), ("m", "m #2", 3), ("n", None, 3)]
    assert members[0]["requests"] == 3 and members[2]["requests"] == 3


def test_cascade_fit_gives_each_judge_its_own_base_url_and_a_judge_that_never_answers_is_an_error(fake, tmp_path) -> None:
    # `cascade fit --model A --model B --base-url X --base-url Y` made each judge a fleet of X and Y (and wrote X for both);
    # a judge that failed every row was written as "never trusted (no rows)", exit 0.
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    with FakeProvider() as refusing:
        refusing.set_responder(lambda body: Reply(status=401, error_message="Incorrect API key provided"))
        fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"})))
        rows = _write(tmp_path / "rows.jsonl", [{"question": f"question {i}?", "references": ["x"], "prediction": "y", "label": "correct"}
                                                for i in range(40)])
        out = tmp_path / "c.json"
        result = CliRunner().invoke(app, ["cascade", "fit", str(rows), "-r", RUBRIC, "--model", "a", "--model", "b", "--samples", "2",
                                          "--base-url", fake.base_url, "--base-url", refusing.base_url, "-o", str(out),
                                          "--api-key", "k", "--no-cache"])
        assert {r.body["model"] for r in fake.chat_requests()} == {"a"} and {r.body["model"] for r in refusing.chat_requests()} <= {"b"}
    assert result.exit_code == 0, result.output  # a trusted every row: b is never asked
    assert [j["base_url"] for j in json.loads(out.read_text())["judges"]] == [fake.base_url, refusing.base_url]
    with FakeProvider() as refusing:
        refusing.set_responder(lambda body: Reply(status=401, error_message="Incorrect API key provided"))
        failed = CliRunner().invoke(app, ["cascade", "fit", str(rows), "-r", RUBRIC, "--model", "a", "--samples", "2",
                                          "--base-url", refusing.base_url, "-o", str(tmp_path / "d.json"), "--api-key", "k", "--no-cache"])
    # Issue 35: the fit has the breaker every run has: the first rows' same 401 stops it (exit 3), naming the judge.
    assert failed.exit_code == 3 and "looks broken" in failed.output and "401" in failed.output and "(model a)" in failed.output
    assert not (tmp_path / "d.json").exists()


def test_a_jurys_text_summary_shows_each_jurors_requests_tokens_and_cost(tmp_path) -> None:
    """Issue 48: --json had each juror's requests, tokens and cost; the text summary only the jury's rule."""
    from gradekit.judge.testing import FakeProvider

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["x"], "prediction": "x"}) + "\n" for i in range(4)))
    prices = tmp_path / "prices.yaml"
    prices.write_text("judge-a: {input: 1.0, output: 2.0}\njudge-b: {input: 3.0, output: 4.0}\n")
    with FakeProvider() as fake:
        args = ["grade", str(source), "-r", RUBRIC, "--model", "judge-a", "--model", "judge-b", "--base-url", fake.base_url,
                "--api-key", "k", "--no-cache", "--prices", str(prices)]
        text = gradekit(*args, "-o", str(tmp_path / "out.jsonl"))
        as_json = json.loads(gradekit(*args, "-o", str(tmp_path / "out2.jsonl"), "--json").stdout)
    said = " ".join(text.stdout.split())
    for member in as_json["jury"]["members"]:
        line = f"{member['model']}: {member['requests']} requests, {member['prompt_tokens']} prompt + {member['completion_tokens']} completion tokens, ${member['cost_usd']:.4f}"
        assert line in said, (line, said)
