"""A group with a failed or straggling member (graders._members): on_member_error, min_members and
group_deadline_s, against the loopback fake provider (500s, unparseable replies, a reply that never comes)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gradekit.graders import GraderConfigError, GroupStatus, Sample, Trajectory, group_grader, llm_grader, load_group_grader
from gradekit.graders._relative import relative_group_grader
from gradekit.judge import RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from .test_group_grader import zh_judge

SAMPLE = Sample(messages=[{"role": "user", "content": "哪两个公司？"}], references={"answer": "景栗科技和薪勤科技"})
RIGHT, HALF = "景栗科技和薪勤科技", "景栗科技"
HANG = Reply(delay=3600.0, content="{}")  # a reply that never comes within any test's life (stop() wakes it)


def answer(text: str) -> Trajectory:
    return Trajectory(messages=[{"role": "assistant", "content": text}], finish_reason="stop")


def scripted(**by_marker: Reply):
    """The zh judge, except that a prediction containing a marker gets that marker's reply."""

    def respond(body: dict) -> Reply:
        content = body["messages"][-1]["content"]
        for marker, reply in by_marker.items():
            if marker in content:
                return reply
        return zh_judge(body)

    return respond


@pytest.fixture
def grader_for(make_judge):
    def build(**kwargs):
        judge = make_judge(retry=RetryPolicy(max_attempts=1, parse_retries=0), timeout=600.0)
        return group_grader(llm_grader(judge, "semantic_equivalence_zh"), **kwargs)

    return build


@pytest.mark.parametrize("failure", [Reply(status=500), Reply(content="我无法判断。")], ids=["http_500", "unparseable"])
async def test_renormalize_decides_on_the_finished_members_with_a_placeholder_at_their_mean(fake: FakeProvider, grader_for, failure: Reply) -> None:
    fake.set_responder(scripted(FAIL=failure))
    result = await grader_for()(SAMPLE, [answer(RIGHT), answer("FAIL " + HALF), answer(HALF), answer(RIGHT)])
    assert result.status == GroupStatus.SUCCESS
    assert result.failed_members == [1]
    finished = [result.rewards[i] for i in (0, 2, 3)]
    assert finished == [1.0, 0.0, 1.0]
    assert result.rewards[1] == pytest.approx(sum(finished) / 3), "the placeholder is the finished members' mean"
    # The trainer's own mean over all four rows equals the finished members' mean: an unbiased baseline.
    assert sum(result.rewards) / 4 == pytest.approx(sum(finished) / 3)
    assert result.grades[1].status == "error" and result.grades[1].score is None, "the member's grade stays an error"
    assert result.metrics["members_failed"] == 1.0 and result.metrics["members_finished"] == 3.0
    assert "trajectory 1" in result.error


async def test_drop_group_fails_the_group_with_on_judge_error_status(fake: FakeProvider, grader_for) -> None:
    fake.set_responder(scripted(FAIL=Reply(status=500)))
    result = await grader_for(on_member_error="drop_group", on_judge_error="DISCARD")(SAMPLE, [answer(RIGHT), answer("FAIL"), answer(HALF)])
    assert result.status == GroupStatus.DISCARD and result.rewards == []
    assert "1 of 3 members failed" in result.error


async def test_too_few_finished_members_fail_the_group_not_score_it(fake: FakeProvider, grader_for) -> None:
    fake.set_responder(scripted(FAIL=Reply(status=500)))
    result = await grader_for(min_members=2)(SAMPLE, [answer(RIGHT), answer("FAIL a"), answer("FAIL b")])
    assert result.status == GroupStatus.RETRY and result.rewards == []
    assert "only 1 of 3 members finished, fewer than min_members (2)" in result.error


async def test_retry_regrades_the_failed_member(fake: FakeProvider, grader_for) -> None:
    seen = {"n": 0}

    def flaky(body: dict) -> Reply:
        if "FLAKY" in body["messages"][-1]["content"]:
            seen["n"] += 1
            if seen["n"] == 1:
                return Reply(status=500)
        return zh_judge(body)

    fake.set_responder(flaky)
    result = await grader_for(on_member_error="retry")(SAMPLE, [answer(RIGHT), answer("FLAKY " + RIGHT)])
    assert result.status == GroupStatus.SUCCESS and result.rewards == [1.0, 1.0] and result.failed_members == []
    assert seen["n"] == 2
    # Still failing after its retries: the group fails as a whole (retry never renormalizes).
    fake.set_responder(scripted(FAIL=Reply(status=500)))
    result = await grader_for(on_member_error="retry", member_retries=2)(SAMPLE, [answer(RIGHT), answer("FAIL"), answer(HALF)])
    assert result.status == GroupStatus.RETRY and result.rewards == []


async def test_fixed_on_judge_error_is_the_members_reward_and_counts_as_finished(fake: FakeProvider, grader_for) -> None:
    fake.set_responder(scripted(FAIL=Reply(status=500)))
    result = await grader_for(on_judge_error=-1.0, min_members=3)(SAMPLE, [answer(RIGHT), answer("FAIL"), answer(RIGHT)])
    assert result.status == GroupStatus.SUCCESS and result.rewards == [1.0, -1.0, 1.0] and result.failed_members == []


async def test_a_member_hanging_forever_is_failed_at_the_deadline_and_the_group_decided_on_the_others(fake: FakeProvider, grader_for) -> None:
    fake.set_responder(scripted(HANG=HANG))
    grader = grader_for(group_deadline_s=1.0)
    started = time.monotonic()
    result = await grader(SAMPLE, [answer(RIGHT), answer(HALF), answer("HANG " + RIGHT), answer(RIGHT)])
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 2.0, f"decided in {elapsed:.1f} s, not within group_deadline_s + 2 s"
    assert result.status == GroupStatus.SUCCESS and result.failed_members == [2]
    assert result.grades[2].error_kind == "timeout" and "group_deadline_s (1 s)" in (result.grades[2].error or "")
    assert result.rewards[:2] == [1.0, 0.0] and result.rewards[3] == 1.0
    assert result.metrics["member_timeouts"] == 1.0


async def test_too_few_finished_by_the_deadline_fails_the_group(fake: FakeProvider, grader_for) -> None:
    fake.set_responder(scripted(HANG=HANG))
    started = time.monotonic()
    result = await grader_for(group_deadline_s=1.0, min_members=2)(SAMPLE, [answer(RIGHT), answer("HANG a"), answer("HANG b")])
    assert time.monotonic() - started < 3.0
    assert result.status == GroupStatus.RETRY and result.rewards == []
    assert [g.error_kind for g in result.grades] == [None, "timeout", "timeout"]


async def test_relative_group_reports_what_its_rankings_billed(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(lambda body: Reply(content="<ranking>C > A > B</ranking>"))
    result = await relative_group_grader(make_judge())(SAMPLE, [answer("x"), answer("y"), answer("z")])
    assert result.status == GroupStatus.SUCCESS and result.metrics["shuffles"] == 2.0
    sent = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert result.usage is not None and result.usage.requests == len(sent) == 2
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0


async def test_relative_group_decides_on_the_ranking_that_finished(fake: FakeProvider, make_judge) -> None:
    calls = {"n": 0}

    def ranker(body: dict) -> Reply:
        calls["n"] += 1
        return HANG if calls["n"] == 2 else Reply(content="<ranking>A > B > C</ranking>")

    fake.set_responder(ranker)
    judge = make_judge(retry=RetryPolicy(max_attempts=1, parse_retries=0), timeout=600.0)
    grader = relative_group_grader(judge, group_deadline_s=1.0)
    started = time.monotonic()
    result = await grader(SAMPLE, [answer("x"), answer("y"), answer("z")])
    assert time.monotonic() - started < 3.0
    assert result.status == GroupStatus.SUCCESS and result.metrics["shuffles"] == 1.0 and result.metrics["judge_errors"] == 1.0
    assert sorted(result.rewards) == [-1.0, 0.0, 1.0]
    assert result.usage is not None and result.usage.requests == 1  # the ranking cut off by the deadline billed nothing known
    calls["n"] = 0
    dropped = await relative_group_grader(judge, group_deadline_s=1.0, on_member_error="drop_group", seed=1)(SAMPLE, [answer("x"), answer("y"), answer("z")])
    assert dropped.status == GroupStatus.RETRY and dropped.rewards == [] and "timeout" in dropped.error


async def test_the_group_keys_load_from_a_config(fake: FakeProvider, tmp_path) -> None:
    fake.set_responder(scripted(HANG=HANG))
    config = {"type": "group", "on_member_error": "renormalize", "min_members": 2, "group_deadline_s": 1.0,
              "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 600},
              "grader": {"type": "llm", "rubric": "semantic_equivalence_zh"}}
    grader = load_group_grader(config)
    result = await grader(SAMPLE, [answer(RIGHT), answer("HANG"), answer(HALF)])
    assert result.status == GroupStatus.SUCCESS and result.failed_members == [1]
    for bad in ({"on_member_error": "average"}, {"min_members": 0}, {"group_deadline_s": -1}):
        with pytest.raises(GraderConfigError):
            load_group_grader({**config, **bad})
    json.dumps(result.model_dump(mode="json"))
    await asyncio.sleep(0)
