"""The answer-verifier rubrics (CompassVerifier's three labels, general-verifier's Final Decision) on every dialect of the fake.

Their "correct"/"Yes" reading on every dialect is in tests/judge/test_judge_models.py with the other shipped
rubrics; here: the ``invalid`` label is ``status=invalid`` through a grader and never a score, the
``invalid_labels`` spec field is checked, and the Final Decision line is read guarded like any verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradekit.graders import Sample, llm_grader
from gradekit.graders.cli import app
from gradekit.judge import Judge, Limiter, ParseFailure, RubricError, load_rubric, parse_reply
from gradekit.judge._dialect import forget_dialects
from gradekit.judge.testing import DIALECTS, FakeProvider, Reply, asked_reply

from ..cases import cases

SAMPLE = Sample(messages="Compute 1/2 + 1/4.", response="Adding, 1/2 + 1/4 = 3/4, so the answer is \\boxed{\\tfrac34}.",
                references={"references": ["0.75"]})


def three_way(label: str):
    """A judge giving ``label`` in whatever format the request asks for (JSON, a tool call, tags)."""
    def respond(body: dict[str, Any]) -> Reply:
        return asked_reply(body, {"rationale": "compared the final answers", "judgement": label},
                           f"<rationale>compared</rationale>\n<judgement>{label}</judgement>")
    return respond


async def _grade(fake: FakeProvider, rubric: str, n: int = 3):
    async with Judge("qwen3-32b", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4)) as judge:
        grade = llm_grader(judge, rubric)
        return [await grade(SAMPLE) for _ in range(n)]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize(("label", "expected"), [("correct", ("ok", 1.0, None)), ("incorrect", ("ok", -1.0, None)),
                                                 ("invalid", ("invalid", None, "judged_invalid"))])
async def test_the_three_way_rubric_reads_each_label_on_every_dialect(dialect: str, label: str, expected: tuple) -> None:
    forget_dialects()
    with FakeProvider(dialect=dialect, responder=three_way(label)) as fake:
        grades = await _grade(fake, "answer_verification_3way")
    assert [(g.status, g.score, g.error_kind) for g in grades] == [expected] * 3, [g.error for g in grades]
    if label == "invalid":
        assert all("'invalid'" in (g.error or "") for g in grades)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize(("reply", "score"), [("The student gives 3/4, the same as 0.75.\nFinal Decision: Yes", 1.0),
                                              ("3/4 is not 0.7.\n\n**Final Decision:** No", -1.0)])
async def test_the_yes_no_rubric_reads_the_final_decision_on_every_dialect(dialect: str, reply: str, score: float) -> None:
    forget_dialects()
    with FakeProvider(dialect=dialect, responder=lambda body: Reply(content=reply)) as fake:
        grades = await _grade(fake, "answer_verification_yes_no", n=2)
    assert [(g.status, g.score) for g in grades] == [("ok", score)] * 2, [g.error for g in grades]


@pytest.mark.parametrize(("reply", "label"), cases("final_decision_lines"))
def test_the_final_decision_line_is_read(reply: str, label: str) -> None:
    assert parse_reply(load_rubric("answer_verification_yes_no"), reply, "text").label == label


@pytest.mark.parametrize("reply", [
    pytest.param("Final Decision: Yes\nFinal Decision: No", id="two_decisions"),
    pytest.param("The answers agree.", id="no_decision"),
    pytest.param("Final Decision: Maybe", id="never_offered"),
    pytest.param("", id="empty"),
])
def test_an_unreadable_final_decision_is_a_parse_failure(reply: str) -> None:
    with pytest.raises(ParseFailure):
        parse_reply(load_rubric("answer_verification_yes_no"), reply, "text")


def test_invalid_labels_must_be_offered_labels_scored_zero(tmp_path: Path) -> None:
    spec = (Path(load_rubric("answer_verification_3way").directory) / "answer_verification_3way.yaml").read_text(encoding="utf-8")
    (tmp_path / "answer_verification_3way.j2").write_text("{% block user %}{{ prediction }}{% endblock %}", encoding="utf-8")
    for bad in ("invalid_labels: [unusable]", "invalid_labels: [incorrect]"):
        path = tmp_path / "bad.yaml"
        path.write_text(spec.replace("invalid_labels: [invalid]", bad), encoding="utf-8")
        with pytest.raises(RubricError, match="invalid_labels must be offered labels scored 0"):
            load_rubric(path)


def test_a_rubric_without_invalid_labels_keeps_its_fingerprint() -> None:
    """Adding the field must not change any existing rubric's cache keys or checkpoints."""
    from gradekit.judge._rubric import rubric_fingerprint

    rubric = load_rubric("semantic_equivalence_en")
    assert '"invalid_labels"' not in rubric.model_dump_json(exclude={"directory", "invalid_labels"})
    assert rubric_fingerprint(rubric) == rubric_fingerprint(rubric.model_copy())
    assert rubric_fingerprint(load_rubric("answer_verification_3way")) != rubric_fingerprint(
        load_rubric("answer_verification_3way").model_copy(update={"invalid_labels": []}))


def test_a_rubric_run_writes_an_invalid_verdict_as_an_error_row_not_a_score(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "question": "1/2 + 1/4?", "references": ["0.75"], "prediction": p}) + "\n"
                            for i, p in enumerate(["3/4", "The answer is"])), encoding="utf-8")

    def respond(body: dict[str, Any]) -> Reply:
        cut_off = "The answer is\n</response>" in body["messages"][-1]["content"]
        return three_way("invalid" if cut_off else "correct")(body)

    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=respond) as fake:
        done = CliRunner().invoke(app, ["grade", str(rows), "-r", "answer_verification_3way", "-o", str(out), "--base-url",
                                        fake.base_url, "--api-key", "k", "--no-cache", "--json"])
    assert done.exit_code == 1, done.output  # a row without a score
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["status"], r["score"], r["label"], r["error_kind"]) for r in written] == [
        ("ok", 1.0, "correct", None), ("error", None, "invalid", "judged_invalid")]
    summary = json.loads(done.stdout)
    assert summary["ok"] == 1 and summary["mean_score"] == 1.0
