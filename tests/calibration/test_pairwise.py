"""Pairwise grading with position swap over HTTP to the fake provider: mapping back, conflict rules, files, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.graders._pairwise import pairwise_grader, swapped
from gradekit.graders.calibration._pairwise import grade_pairwise_file
from gradekit.judge import RubricError, load_rubric, parse_reply
from gradekit.judge.testing import FakeProvider, Reply

LLMBAR = load_rubric("llmbar_pairwise")
ARENA = load_rubric("arena_hard_pairwise")
ROW = {"instruction": "Name a prime number.", "output_1": "GOOD: 7", "output_2": "BAD: 8"}
MAPPING = {"instruction": "instruction", "output_1": "output_1", "output_2": "output_2"}


def _shown(body: dict, tags: tuple[str, str] = ("output_a", "output_b")) -> tuple[str, str]:
    user = body["messages"][-1]["content"]
    return tuple(re.search(rf"<{t}>\n(.*?)\n</{t}>", user, re.S).group(1) for t in tags)  # type: ignore[return-value]


def consistent_judge(body: dict) -> Reply:
    """Reads the prompt like a model: the output marked GOOD wins, wherever it is shown."""
    first, _ = _shown(body)
    return Reply(content="Output (a)" if first.startswith("GOOD") else "Output (b)")


def first_position_judge(body: dict) -> Reply:
    return Reply(content="Output (a)")


async def test_the_swapped_order_is_mapped_back_to_the_input_numbering(fake, make_judge) -> None:
    fake.set_responder(consistent_judge)
    pair = await pairwise_grader(make_judge(), LLMBAR)(ROW)
    assert (pair.winner_ab, pair.winner_ba, pair.agree, pair.winner, pair.score) == ("1", "1", True, "1", 1.0)
    assert (pair.ab.label, pair.ba.label) == ("Output (a)", "Output (b)")  # what the judge literally said
    shown = sorted(_shown(r.body) for r in fake.chat_requests())
    assert shown == [("BAD: 8", "GOOD: 7"), ("GOOD: 7", "BAD: 8")]  # both orders were asked
    flipped = await pairwise_grader(make_judge(), LLMBAR)(swapped(LLMBAR, ROW))
    assert (flipped.winner, flipped.score) == ("2", -1.0)


@pytest.mark.parametrize(("rule", "winner", "score"), [("tie", "tie", 0.0), ("first", "1", 1.0)])
async def test_position_bias_is_a_conflict_settled_by_the_configured_rule(fake, make_judge, rule, winner, score) -> None:
    fake.set_responder(first_position_judge)
    pair = await pairwise_grader(make_judge(), LLMBAR, on_conflict=rule)(ROW)
    assert (pair.winner_ab, pair.winner_ba, pair.agree) == ("1", "2", False)
    assert (pair.winner, pair.score, pair.decided_by, pair.status) == (winner, score, rule, "ok")


async def test_third_call_asks_the_tiebreak_judge_in_input_order(fake, make_judge) -> None:
    fake.set_responder(first_position_judge)
    with FakeProvider(responder=consistent_judge) as referee:
        grade = pairwise_grader(make_judge(), LLMBAR, on_conflict="third", tiebreak=make_judge(base_url=referee.base_url))
        pair = await grade({**ROW, "output_1": "BAD: 9", "output_2": "GOOD: 11"})
        assert len(referee.chat_requests()) == 1 and _shown(referee.chat_requests()[0].body) == ("BAD: 9", "GOOD: 11")
    assert (pair.agree, pair.decided_by, pair.winner, pair.score) == (False, "third", "2", -1.0)
    with pytest.raises(ValueError, match="tiebreak judge"):
        pairwise_grader(make_judge(), LLMBAR, on_conflict="third")


async def test_without_swap_one_request_and_the_single_verdict_is_final(fake, make_judge) -> None:
    fake.set_responder(first_position_judge)
    pair = await pairwise_grader(make_judge(), LLMBAR, swap=False)(ROW)
    assert (pair.winner, pair.agree, pair.decided_by, pair.ba) == ("1", None, "single", None)
    assert len(fake.chat_requests()) == 1


async def test_a_failed_order_makes_the_pair_an_error_not_a_score(fake, make_judge) -> None:
    def judge(body: dict) -> Reply:
        first, _ = _shown(body)
        return Reply(content="Output (a)" if first.startswith("GOOD") else "I cannot decide.")

    fake.set_responder(judge)
    pair = await pairwise_grader(make_judge(), LLMBAR)(ROW)
    assert pair.status == "error" and pair.score is None and pair.winner is None
    assert pair.error_kind == "parse_failure" and pair.error.startswith("order ba (swapped order): parse_failure")
    assert pair.winner_ab == "1"  # the order that worked is still reported


def arena_judge(body: dict) -> Reply:
    """Strongly prefers the GOOD answer as assistant B, slightly as A: strengths differ by position."""
    first, _ = _shown(body, ("assistant_a", "assistant_b"))
    return Reply(content="Both are short. My final verdict is: [[A>B]]" if first.startswith("GOOD")
                 else "B is right. My final verdict is: [[B>>A]]")


async def test_arena_hard_strengths_are_mirrored_and_averaged(fake, make_judge) -> None:
    fake.set_responder(arena_judge)
    pair = await pairwise_grader(make_judge(), ARENA)(ROW)
    assert (pair.ab.label, pair.ba.label) == ("A>B", "B>>A")
    assert (pair.score_ab, pair.score_ba, pair.agree, pair.winner, pair.score) == (0.5, 1.0, True, "1", 0.75)


@pytest.mark.parametrize(("reply", "label"), [
    pytest.param("My final verdict is: [[A=B]]", "A=B", id="tie"),
    pytest.param("[[B>A]] ... on reflection, my final verdict: [[B>A]]", "B>A", id="same_tag_twice"),
    pytest.param("Assistant A said [[A>>B]] in its answer. My final verdict is [[B>A]]", None, id="two_distinct_tags"),
    pytest.param("Assistant A is better.", None, id="no_tag"),
    pytest.param("My final verdict is [[A>>>B]]", None, id="never_offered"),
])
def test_arena_hard_verdict_tags(reply: str, label: str | None) -> None:
    if label is None:
        with pytest.raises(ValueError):
            parse_reply(ARENA, reply, "text")
    else:
        assert parse_reply(ARENA, reply, "text").label == label


def test_pairwise_spec_must_name_two_rubric_variables(tmp_path: Path) -> None:
    (tmp_path / "p.j2").write_text("{% block user %}{{ a }} {{ b }}{% endblock %}")
    spec = tmp_path / "p.yaml"
    spec.write_text("name: p\ntemplate: p.j2\nvariables: {a: {}, b: {}}\npairwise: {first: a, second: c}\n"
                    "output: {mode: regex, pattern: '(A|B)'}\nlabels: {A: 1, B: -1}\n")
    with pytest.raises(RubricError, match=r"'p'.*pairwise.*'c'"):
        load_rubric(spec)
    spec.write_text(spec.read_text().replace("second: c", "second: b").replace("B: -1", "B: 0"))
    with pytest.raises(RubricError, match="negative one"):
        load_rubric(spec)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def test_file_keeps_one_row_per_input_row_in_order_with_both_verdicts(fake, make_judge, tmp_path: Path) -> None:
    fake.set_responder(consistent_judge)
    source = tmp_path / "pairs.jsonl"
    lines = [json.dumps({"id": i, "instruction": f"q{i}", "output_1": f"GOOD {i}" if i % 2 else f"BAD {i}",
                         "output_2": f"BAD {i}" if i % 2 else f"GOOD {i}", "label": 1 if i % 2 else 2}) for i in range(12)]
    lines.insert(3, "{not json")
    lines.insert(6, json.dumps({"id": "x", "instruction": "q", "output_1": "GOOD"}))
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    summary = await grade_pairwise_file(make_judge(), LLMBAR, source, out, MAPPING)
    rows = _rows(out)
    assert len(rows) == 14 and summary.results.rows == 14 and summary.results.errors == 2
    assert [r.get("id") for r in rows] == [0, 1, 2, None, 3, 4, "x", 5, 6, 7, 8, 9, 10, 11]
    assert rows[3]["error_kind"] == "input" and "row 4" in rows[3]["error"]
    assert rows[6]["status"] == "error" and "row 7" in rows[6]["error"] and "'output_2'" in rows[6]["error"]
    good = [r for r in rows if r["status"] == "ok"]
    assert all(r["agree"] and r["winner"] == str(r["label"]) and r["winner_ab"] == r["winner_ba"] for r in good)
    assert {r["label_ab"] for r in good} == {"Output (a)", "Output (b)"} and all(r["label"] in (1, 2) for r in good)
    assert summary.results.report is None  # two rows carry no gold label: no Acc/Agr over a partial set


async def test_file_summary_has_llmbar_acc_and_agr_when_every_row_is_labelled(fake, make_judge, tmp_path: Path) -> None:
    fake.set_responder(first_position_judge)
    source = tmp_path / "pairs.csv"
    source.write_text("instruction,output_1,output_2,label\nq1,a,b,1\nq2,c,d,2\nq3,e,f,1\nq4,g,h,2\n", encoding="utf-8")
    summary = await grade_pairwise_file(make_judge(), LLMBAR, source, tmp_path / "out.csv", MAPPING, on_conflict="first")
    r = summary.results.report
    assert r is not None and (r.acc, r.agr, r.first_position_win_rate) == (0.5, 0.0, 1.0)
    assert summary.results.decided_by == {"first": 4} and summary.stats.usage.requests == 8
    header = (tmp_path / "out.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header[:4] == ["instruction", "output_1", "output_2", "label"] and "winner_ba" in header


def test_grade_command_runs_a_pairwise_rubric_and_prints_acc_agr(fake, tmp_path: Path) -> None:
    fake.set_responder(consistent_judge)
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps({"instruction": "q", "output_1": o1, "output_2": o2, "label": lab}) + "\n"
                              for o1, o2, lab in [("GOOD 1", "BAD", 1), ("BAD", "GOOD 2", 2), ("BAD", "GOOD 3", 1)]))
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["grade", str(source), "-r", "llmbar_pairwise", "-o", str(out), "--no-cache",
                                      "--base-url", fake.base_url, "--model", "fake-judge"])
    assert result.exit_code == 0, result.output
    assert "Acc 66.7 / Agr 100.0" in result.output and len(_rows(out)) == 3
    bad = CliRunner().invoke(app, ["grade", str(source), "-r", "llmbar_pairwise", "-o", str(out), "--on-conflict", "third",
                                   "--base-url", fake.base_url])
    assert bad.exit_code == 2 and "--tiebreak-model" in bad.output
