"""The ``vote`` pair rule (JudgeBench / Arena-Hard) over HTTP to the fake provider, in the library and in `gradekit grade`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders._pairwise import pairwise_grader
from gradekit.graders.cli import app
from gradekit.judge import load_rubric
from gradekit.judge.testing import Reply

ARENA = load_rubric("arena_hard_pairwise")
LLMBAR = load_rubric("llmbar_pairwise")
ROW = {"instruction": "Name a prime number.", "output_1": "SEVEN", "output_2": "EIGHT"}


def by_first_shown(replies: dict[str, Reply]):
    """Answer by which output is shown first: a judge whose verdict depends on the order."""

    def respond(body: dict) -> Reply:
        user = body["messages"][-1]["content"]
        first = re.search(r"<assistant_a>\n?(.*?)\n?</assistant_a>|<output_a>\n?(.*?)\n?</output_a>", user, re.S)
        shown = next(g for g in first.groups() if g is not None)
        return replies[shown]

    return respond


@pytest.mark.parametrize(("ab", "ba", "winner", "score", "decided_by", "orders_read"), [
    # Strength is ignored: A>>B counts as A>B. The swapped order's "B>A" means output_1 again.
    pytest.param("[[A>>B]]", "[[B>A]]", "1", 1.0, "agree", 2, id="both_orders_prefer_output_1"),
    pytest.param("[[A>B]]", "[[A=B]]", "1", 0.5, "vote", 2, id="tie_and_a_winner_is_the_winner"),
    pytest.param("[[A>B]]", "[[A>B]]", "tie", 0.0, "vote", 2, id="position_bias_sums_to_a_tie"),
    pytest.param("no verdict here", "[[A>>B]]", "2", -0.5, "vote", 1, id="one_unreadable_order_abstains"),
    pytest.param("[[A=B]]", "[[A=B]]", "tie", 0.0, "agree", 2, id="two_ties_are_a_tie"),
])
async def test_vote_sums_one_vote_per_readable_order(fake, make_judge, ab, ba, winner, score, decided_by, orders_read) -> None:
    fake.set_responder(by_first_shown({"SEVEN": Reply(content=ab), "EIGHT": Reply(content=ba)}))
    pair = await pairwise_grader(make_judge(), ARENA, on_conflict="vote")(ROW)
    assert (pair.status, pair.winner, pair.score, pair.decided_by, pair.orders_read) == ("ok", winner, score, decided_by, orders_read)


async def test_vote_keeps_a_pair_an_error_when_nothing_was_read_or_a_request_failed(fake, make_judge) -> None:
    fake.set_responder(by_first_shown({"SEVEN": Reply(content="?"), "EIGHT": Reply(content="?")}))
    pair = await pairwise_grader(make_judge(), ARENA, on_conflict="vote")(ROW)
    assert (pair.status, pair.error_kind, pair.score, pair.orders_read) == ("error", "parse_failure", None, 0)
    fake.set_responder(by_first_shown({"SEVEN": Reply(content="[[A>B]]"), "EIGHT": Reply(status=400, error_message="bad")}))
    pair = await pairwise_grader(make_judge(), ARENA, on_conflict="vote")(ROW)
    # A failed request is not the judge's opinion: it does not quietly abstain.
    assert (pair.status, pair.error_kind, pair.orders_read) == ("error", "bad_request", 1)


async def test_under_tie_the_same_unreadable_order_is_an_error_row(fake, make_judge) -> None:
    fake.set_responder(by_first_shown({"SEVEN": Reply(content="no verdict"), "EIGHT": Reply(content="[[A>>B]]")}))
    pair = await pairwise_grader(make_judge(), ARENA, on_conflict="tie")(ROW)
    assert (pair.status, pair.error_kind) == ("error", "parse_failure")


def test_grade_on_conflict_vote_keeps_per_order_verdicts_and_marks_one_order_pairs(fake, tmp_path: Path) -> None:
    fake.set_responder(by_first_shown({
        "GOOD": Reply(content="Output (a)"), "BAD": Reply(content="Output (b)"),  # consistent: GOOD wins
        "LOUD": Reply(content="Output (a)"), "QUIET": Reply(content="I cannot decide."),  # the swapped order is unreadable
    }))
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps({"instruction": "q", "output_1": a, "output_2": b, "label": 1}) + "\n"
                              for a, b in [("GOOD", "BAD"), ("LOUD", "QUIET")]), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["grade", str(source), "-r", "llmbar_pairwise", "-o", str(out), "--no-cache",
                                      "--on-conflict", "vote", "--base-url", fake.base_url, "--model", "fake-judge"])
    assert result.exit_code == 0, result.output
    assert "1 scored from one readable order" in result.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["winner"], r["orders_read"], r["decided_by"]) for r in rows] == [("1", 2, "agree"), ("1", 1, "vote")]
    assert (rows[1]["label_ab"], rows[1]["winner_ab"], rows[1]["winner_ba"], rows[1]["label_ba"]) == ("Output (a)", "1", None, None)
    tie = CliRunner().invoke(app, ["grade", str(source), "-r", "llmbar_pairwise", "-o", str(tmp_path / "tie.jsonl"), "--no-cache",
                                   "--base-url", fake.base_url, "--model", "fake-judge"])
    assert tie.exit_code == 1  # the same pair is an error row under the default rule
    bad = CliRunner().invoke(app, ["grade", str(source), "-r", "llmbar_pairwise", "-o", str(out), "--on-conflict", "majority",
                                   "--base-url", fake.base_url])
    assert bad.exit_code == 2 and "vote" in bad.output
