"""The hybrid answer verifier (math_equivalence with judge_fallback): the judge sees only what the rules did not accept.

Run as a user runs it, `python -m gradekit grade --grader hybrid.yaml` in a subprocess against the
loopback fake; the judge requests are counted at the fake's request log.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradekit.judge.testing import FakeProvider, Reply

ROOT = Path(__file__).resolve().parents[2]
# (question, gold, response, accepted by the rules?)
ROWS = [
    ("Compute 1/2 + 1/4.", "0.75", r"So the sum is \boxed{\frac{3}{4}}.", True),
    ("Compute 2 + 3.", "5", r"Draft \boxed{3}; rechecking, \boxed{5}.", True),
    ("Evaluate the integral.", r"\dfrac{\pi}{2}", "The value is pi/2 radians, a quarter turn.", False),
    ("Compute 2 + 2.", "4", r"\boxed{5}", False),
    ("How many solutions?", r"\text{no solution}", "There are no real solutions.", False),  # a gold in words
    ("Compute 3 - 3.", "0", "", True),  # empty: wrong, and nothing to judge
]
NOT_ACCEPTED = sum(not accepted and bool(response) for _, _, response, accepted in ROWS)


def _write(folder: Path, config: str, rows=ROWS) -> tuple[Path, Path]:
    (folder / "hybrid.yaml").write_text(config, encoding="utf-8")
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": q, "response": r, "references": {"answer": g}}) + "\n"
                              for i, (q, g, r, _) in enumerate(rows)), encoding="utf-8")
    return folder / "hybrid.yaml", source


def _grade(folder: Path, fake: FakeProvider, config: str, *extra: str, rows=ROWS) -> tuple[subprocess.CompletedProcess, list[dict]]:
    grader, source = _write(folder, config, rows)
    out = folder / "out.jsonl"
    done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(grader), "-o", str(out),
                           "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--restart", *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    rows_out = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.exists() else []
    return done, rows_out


def _slots(body: dict[str, Any]) -> tuple[str, str]:
    user = body["messages"][-1]["content"]
    gold = re.search(r"<gold_answer>\n- (.*?)\n</gold_answer>", user, re.S)
    shown = re.search(r"<response>\n(.*?)\n</response>", user, re.S)
    return (gold.group(1) if gold else ""), (shown.group(1) if shown else "")


def judge_says(label: str, swapped: str | None = None):
    """The 3-way judge: ``label`` with the gold as the reference, ``swapped`` (default: the same) the other way round."""
    golds = {g for _, g, _, _ in ROWS}

    def respond(body: dict[str, Any]) -> Reply:
        reference, _ = _slots(body)
        said = label if reference in golds or swapped is None else swapped
        return Reply(content=json.dumps({"rationale": "scripted", "judgement": said}))

    return respond


CONFIG = 'type: math_equivalence\nexpression: "{{references.answer}}"\njudge_fallback: {rubric: answer_verification_3way}\n'


def test_only_rows_the_rules_did_not_accept_reach_the_judge_twice_each_in_both_orders(tmp_path: Path) -> None:
    with FakeProvider(responder=judge_says("correct")) as fake:
        done, rows = _grade(tmp_path, fake, CONFIG, "--json")
        requests = fake.chat_requests()
    assert done.returncode == 0, done.stderr
    assert len(requests) == 2 * NOT_ACCEPTED
    asked = [_slots(r.body) for r in requests]
    for _, gold, response, accepted in ROWS:
        if accepted or not response:
            assert not any(gold in pair or response in pair for pair in asked if response), (gold, response)
            continue
        assert (gold, response) in asked and (response, gold) in asked, (gold, response)  # both orders, swapped
    assert [r["decided_by"] for r in rows] == ["symbolic" if accepted or not response else "judge" for _, _, response, accepted in ROWS]
    assert [r["score"] for r in rows] == [1.0, 1.0, 1.0, 1.0, 1.0, -1.0]
    assert all("parsed" in r for r in rows)  # the symbolic grader's own column stays
    summary = json.loads(done.stdout)
    assert summary["decided_by"] == {"symbolic": len(ROWS) - NOT_ACCEPTED, "judge": NOT_ACCEPTED}
    assert summary["judge_calls_saved"] == 2 * (len(ROWS) - NOT_ACCEPTED) and summary["requests"] == 2 * NOT_ACCEPTED


def test_a_judge_biased_in_one_order_is_overruled_by_the_other_under_require_both(tmp_path: Path) -> None:
    with FakeProvider(responder=judge_says("incorrect", swapped="correct")) as fake:
        done, both = _grade(tmp_path, fake, CONFIG)
    assert done.returncode == 0, done.stderr
    assert [r["score"] for r in both if r["decided_by"] == "judge"] == [-1.0] * NOT_ACCEPTED
    either = CONFIG.replace("answer_verification_3way}", "answer_verification_3way, require: either}")
    with FakeProvider(responder=judge_says("incorrect", swapped="correct")) as fake:
        done, lenient = _grade(tmp_path, fake, either)
    assert done.returncode == 0, done.stderr
    assert [r["score"] for r in lenient if r["decided_by"] == "judge"] == [1.0] * NOT_ACCEPTED


def test_an_invalid_label_is_status_invalid_and_a_failed_judge_is_an_error_never_wrong(tmp_path: Path) -> None:
    with FakeProvider(responder=judge_says("invalid")) as fake:
        done, rows = _grade(tmp_path, fake, CONFIG)
    assert done.returncode == 1, done.stderr  # rows without a score
    judged = [r for r in rows if r["decided_by"] == "judge"]
    assert {(r["status"], r["score"], r["error_kind"]) for r in judged} == {("invalid", None, "judged_invalid")}
    with FakeProvider(responder=lambda body: Reply(content="I would rather not say.")) as fake:
        done, rows = _grade(tmp_path, fake, CONFIG, "--keep-going")
    judged = [r for r in rows if r["decided_by"] == "judge"]
    assert len(judged) == NOT_ACCEPTED and {(r["status"], r["score"], r["error_kind"]) for r in judged} == {("error", None, "parse_failure")}
    assert [r["score"] for r in rows if r["decided_by"] == "symbolic"] == [1.0, 1.0, -1.0]


def test_the_yes_no_rubric_and_a_jury_work_as_the_fallback_judge(tmp_path: Path) -> None:
    config = 'type: math_equivalence\nexpression: "{{references.answer}}"\njudge_fallback: {rubric: answer_verification_yes_no}\n'
    with FakeProvider(responder=lambda body: Reply(content="Same value.\nFinal Decision: Yes")) as fake:
        done, rows = _grade(tmp_path, fake, config, "--json", "--model", "a", "--model", "b", "--model", "c")  # a jury of three
        requests = fake.chat_requests()
    assert done.returncode == 0, done.stderr
    assert len(requests) == 3 * 2 * NOT_ACCEPTED and {r.body["model"] for r in requests} == {"a", "b", "c"}
    assert [r["score"] for r in rows if r["decided_by"] == "judge"] == [1.0] * NOT_ACCEPTED


@pytest.mark.parametrize(("fallback", "message"), [
    ("{rubric: llmbar_pairwise}", "not an answer-equivalence rubric"),
    ("{rubric: tone}", "not an answer-equivalence rubric"),
    ("{rubric: answer_verification_3way, require: most}", "require"),
    ("{rubric: answer_verification_3way, judge: x}", "judge_fallback.judge"),
])
def test_a_wrong_judge_fallback_is_refused_before_any_row(tmp_path: Path, fallback: str, message: str) -> None:
    config = f'type: math_equivalence\nexpression: "{{{{references.answer}}}}"\njudge_fallback: {fallback}\n'
    with FakeProvider(responder=judge_says("correct")) as fake:
        done, rows = _grade(tmp_path, fake, config)
        assert fake.chat_requests() == []
    assert done.returncode == 2 and message in done.stderr + done.stdout, done.stderr
    assert rows == []


async def test_a_cascade_is_a_fallback_judge_like_any_other() -> None:
    """load_grader(judge=...) is the one builder every LLM node uses; a Cascade meets the judge protocol there."""
    from gradekit.graders import Sample, load_grader
    from gradekit.judge import Cascade, CascadeSpec, Judge, Limiter

    with FakeProvider(responder=judge_says("correct")) as fake:
        spec = CascadeSpec(rubric="answer_verification_3way", samples=3, target=0.9, delta=0.05, delta_per_judge=0.05, calibration_n=10,
                           judges=[{"model": "weak", "threshold": 1.0}, {"model": "strong", "threshold": 0.5}])
        cascade = Cascade([Judge(m, base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4)) for m in ("weak", "strong")], spec)
        grader = load_grader({"type": "math_equivalence", "expression": "{{references.answer}}",
                              "judge_fallback": {"rubric": "answer_verification_3way"}}, judge=cascade)
        try:
            accepted = await grader(Sample(messages="Compute 2 + 3.", response=r"\boxed{5}", references={"answer": "5"}))
            judged = await grader(Sample(messages="Evaluate.", response="The value is pi/2 radians, a quarter turn.",
                                         references={"answer": r"\dfrac{\pi}{2}"}))
        finally:
            await grader.aclose()
            await cascade.aclose()
        models = [r.body["model"] for r in fake.chat_requests()]
    assert (accepted.score, accepted.columns["decided_by"]) == (1.0, "symbolic")
    assert (judged.status, judged.score, judged.columns["decided_by"]) == ("ok", 1.0, "judge")
    assert models == ["weak"] * 6  # both orders, three samples each, the first judge confident: the strong one never asked


def test_the_reward_server_answers_with_the_path_that_decided() -> None:
    from gradekit.graders import load_grader
    from gradekit.graders.server import RewardServer, create_app
    from gradekit.judge import Judge, Limiter

    from ..server.test_server import call

    with FakeProvider(responder=judge_says("correct")) as fake:
        judge = Judge("m", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4))
        grader = load_grader({"type": "math_equivalence", "expression": "{{references.answer}}",
                              "judge_fallback": {"rubric": "answer_verification_3way"}}, judge=judge)
        server = RewardServer(create_app(grader, None), port=0, log_level="warning").start()
        try:
            bodies = [call(server.url, "/compute_reward", {"prompt": "q", "response": response, "extra_params": {"answer": gold}})[2]
                      for response, gold in ((r"\boxed{5}", "5"), ("The value is pi/2 radians, a quarter turn.", r"\dfrac{\pi}{2}"))]
        finally:
            server.stop()
        sent = len(fake.chat_requests())
    assert [(b["status"], b["score"], b["extra_info"]["decided_by"]) for b in bodies] == [("success", 1.0, "symbolic"), ("success", 1.0, "judge")]
    assert sent == 2


def test_a_resumed_or_finished_run_counts_every_row_of_the_output(tmp_path: Path) -> None:
    with FakeProvider(responder=judge_says("correct")) as fake:
        done, _ = _grade(tmp_path, fake, CONFIG, "--json")
        first = json.loads(done.stdout)
        grader, source = tmp_path / "hybrid.yaml", tmp_path / "in.jsonl"
        again = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(grader), "-o", str(tmp_path / "out.jsonl"),
                                "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json"],
                               capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert len(fake.chat_requests()) == 2 * NOT_ACCEPTED  # nothing asked again
    second = json.loads(again.stdout)
    assert second["already_complete"] is True
    assert (second["decided_by"], second["judge_calls_saved"]) == (first["decided_by"], first["judge_calls_saved"])


def test_retry_errors_grades_the_failed_judge_rows_again_and_counts_the_kept_ones(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda body: Reply(status=503, error_message="overloaded")) as fake:
        done, rows = _grade(tmp_path, fake, CONFIG, "--keep-going")
        assert {r["error_kind"] for r in rows if r["decided_by"] == "judge"} == {"server_error"}
        fake.set_responder(judge_says("correct"))
        before = len(fake.chat_requests())
        again = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(tmp_path / "in.jsonl"), "--grader", str(tmp_path / "hybrid.yaml"),
                                "-o", str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json",
                                "--retry-errors"], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert len(fake.chat_requests()) - before == 2 * NOT_ACCEPTED  # only the failed judge rows, both orders each
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["decided_by"] == {"symbolic": len(ROWS) - NOT_ACCEPTED, "judge": NOT_ACCEPTED}
    assert summary["judge_calls_saved"] == 2 * (len(ROWS) - NOT_ACCEPTED)
    fixed = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["status"] for r in fixed] == ["ok"] * len(ROWS)


def test_a_row_without_a_gold_answer_is_no_judge_call_saved(tmp_path: Path) -> None:
    """Issue 48: a row whose gold is missing never reaches the rules or a judge (there is nothing to show either): it was
    counted decided_by symbolic, two judge calls saved."""
    (tmp_path / "hybrid.yaml").write_text(CONFIG, encoding="utf-8")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": 0, "prompt": "Compute 2 + 3.", "response": r"\boxed{5}", "references": {"answer": "5"}}) + "\n"
                      + json.dumps({"id": 1, "prompt": "Compute 2 + 2.", "response": r"\boxed{4}", "references": {}}) + "\n",
                      encoding="utf-8")
    with FakeProvider(responder=judge_says("correct")) as fake:
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(tmp_path / "hybrid.yaml"),
                               "-o", str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json"],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert not fake.chat_requests()
    summary = json.loads(done.stdout)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows[1]["status"] == "invalid" and rows[1]["error_kind"] == "input", rows[1]
    assert rows[1]["decided_by"] in (None, ""), rows[1]  # nothing decided it
    assert summary["judge_calls_saved"] == 2 and summary["decided_by"] == {"symbolic": 1}, summary  # was 4, symbolic 2
