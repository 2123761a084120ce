"""The group grader against the loopback fake provider: seed 000's checks, policies and the shared limiter;
and the reward spread check over groups."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from pathlib import Path

import pytest

from gradekit.graders import (
    Grade,
    GroupStatus,
    Sample,
    SampleChecks,
    Trajectory,
    TrajectoryChecks,
    group_grader,
    llm_grader,
    load_group_grader,
    reward_spread,
    sample_from_row,
)
from gradekit.judge import Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import InFlight

DATA = Path(__file__).parents[1] / "data" / "graders"

# Seed 000's search tool: the schema its validate_tool_calls checks trailing calls against.
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "互联网搜索",
        "parameters": {
            "type": "object",
            "properties": {"Query": {"type": "string"}, "Count": {"type": "integer", "default": 10}},
            "required": ["Query"],
        },
    },
}

# seed 000 main(): the Ark sample and its two trajectories, verbatim.
SEED_ROW = {
    "messages": [{"role": "user", "content": "通过景栗科技的私域运营服务和与薪勤科技的产品共创，哪两个公司在各自的领域实现了用户增长或应用上架？"}],
    "thinking": {"type": "enabled"},
    "extra": {"answer": "景栗科技和薪勤科技"},
}
SEED_TRAJECTORIES = [
    {"messages": [{"role": "assistant", "content": "景栗科技的私域运营服务和薪勤科技的产品共创实现了用户增长或应用上架。"}], "finish_reason": "stop", "usage": {}},
    {"messages": [{"role": "assistant", "content": "景栗科技"}], "finish_reason": "stop", "usage": {}},
]


def zh_judge(body: dict) -> Reply:
    """A stand-in judge reading the rendered Chinese rubric: 正确 iff every company in the reference is named."""
    user = body["messages"][-1]["content"]
    prediction = re.search(r"<prediction>\n(.*?)\n</prediction>", user, re.S).group(1)  # type: ignore[union-attr]
    reference = re.findall(r"^- (.*)$", re.search(r"<references>\n(.*?)</references>", user, re.S).group(1), re.M)[0]  # type: ignore[union-attr]
    hit = all(name in prediction for name in re.split("和|、", reference))
    return Reply(content=json.dumps({"rationale": "依据参考答案判断", "judgement": "正确" if hit else "错误"}, ensure_ascii=False))


def failing_where(marker: str, failure: Reply):
    """The zh judge, except that any prediction containing ``marker`` gets ``failure`` every time."""

    def respond(body: dict) -> Reply:
        return failure if marker in body["messages"][-1]["content"] else zh_judge(body)

    return respond


def seed_sample() -> Sample:
    return sample_from_row(SEED_ROW)


def traj(*messages: dict, extra: dict | None = None) -> Trajectory:
    return Trajectory(messages=list(messages), finish_reason="stop", extra=extra)


def call(name: str, arguments: str, id: str = "c1") -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


SEARCHED = ({"role": "assistant", "content": "", "tool_calls": [call("web_search", '{"Query": "景栗科技 薪勤科技"}')]},
            {"role": "tool", "tool_call_id": "c1", "content": "…搜索结果…"})


# ---- seed 000's main(), reproduced -------------------------------------------------------------


async def test_seed_main_with_the_seeds_checks_gives_minus_one_twice_without_a_judge_call(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(zh_judge)
    grader = load_group_grader(DATA / "group_search.yaml", judge=make_judge())
    result = await grader(seed_sample(), [Trajectory.model_validate(t) for t in SEED_TRAJECTORIES])
    # validate_tool_calls: neither trajectory ever called web_search -> -1 each, as the seed's main() prints.
    assert result.status == GroupStatus.SUCCESS
    assert result.rewards == [-1.0, -1.0]
    assert fake.chat_requests() == []
    assert all("without calling any tool" in g.debug[0] for g in result.grades)


async def test_seed_main_judged_when_the_tool_check_is_off(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(zh_judge)
    inner = llm_grader(make_judge(), "semantic_equivalence_zh")
    grader = group_grader(inner, checks=TrajectoryChecks(tools=[SEARCH_TOOL]), sample_checks=SampleChecks(required_references=["answer"]))
    result = await grader(seed_sample(), [Trajectory.model_validate(t) for t in SEED_TRAJECTORIES])
    assert result.status == GroupStatus.SUCCESS
    assert result.rewards == [1.0, 0.0], "both companies named -> 正确 (1); one company -> 错误 (0)"
    assert len(fake.chat_requests()) == 2
    sent = [r.body["messages"][-1]["content"] for r in fake.chat_requests()]  # type: ignore[index]
    assert all("- 景栗科技和薪勤科技" in s and SEED_ROW["messages"][0]["content"] in s for s in sent)
    assert result.metrics["reward_mean"] == 0.5 and result.metrics["all_equal"] == 0.0


# ---- trajectory checks ------------------------------------------------------------------------

CHECK_CASES = [
    pytest.param(traj({"role": "assistant", "content": "景栗科技和薪勤科技"}, extra={"reward": -1}), -1.0, False, id="preset_reward_wins"),
    pytest.param(traj({"role": "assistant", "content": "x"}, extra={"reward": 0.25}), 0.25, False, id="preset_reward_used_as_is"),
    pytest.param(traj(*SEARCHED, {"role": "assistant", "content": None, "tool_calls": [call("web_search", '{"Query": "more"}', "c2")]}),
                 0.0, False, id="valid_trailing_call_is_zero"),
    pytest.param(traj({"role": "assistant", "content": None, "tool_calls": [call("web_fetch", '{"url": "x"}')]}),
                 -1.0, False, id="unknown_tool_is_minus_one"),
    pytest.param(traj({"role": "assistant", "content": None, "tool_calls": [call("web_search", '{"Query": ')]}),
                 -1.0, False, id="arguments_not_json"),
    pytest.param(traj({"role": "assistant", "content": None, "tool_calls": [call("web_search", '{"Count": 3}')]}),
                 -1.0, False, id="arguments_miss_required"),
    pytest.param(traj({"role": "assistant", "content": None, "tool_calls": [call("web_search", '{"Query": 42}')]}),
                 -1.0, False, id="arguments_wrong_type"),
    pytest.param(traj(*SEARCHED, {"role": "assistant", "content": "   "}), -1.0, False, id="empty_final_answer"),
    pytest.param(traj(), -1.0, False, id="no_messages_at_all"),
    pytest.param(traj({"role": "assistant", "content": "景栗科技和薪勤科技"}), -1.0, False, id="answered_without_searching"),
    pytest.param(traj(*SEARCHED, {"role": "assistant", "content": "答案是景栗科技和薪勤科技"}), 1.0, True, id="searched_then_right"),
    pytest.param(traj(*SEARCHED, {"role": "assistant", "content": [{"type": "text", "text": "只有薪勤科技"}]}), 0.0, True, id="searched_then_wrong_list_content"),
]


@pytest.mark.parametrize(("trajectory", "reward", "judged"), CHECK_CASES)
async def test_trajectory_checks(fake: FakeProvider, make_judge, trajectory: Trajectory, reward: float, judged: bool) -> None:
    fake.set_responder(zh_judge)
    grader = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"),
                          checks=TrajectoryChecks(require_tool_call=True, tools=[SEARCH_TOOL]))
    result = await grader(seed_sample(), [trajectory])
    assert result.status == GroupStatus.SUCCESS, result.error
    assert result.rewards == [reward]
    assert len(fake.chat_requests()) == (1 if judged else 0)


async def test_checks_can_be_switched_off_and_tools_come_from_the_sample(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(zh_judge)
    sample = sample_from_row({**SEED_ROW, "tools": [SEARCH_TOOL]})
    unknown = traj({"role": "assistant", "content": None, "tool_calls": [call("web_fetch", "{}")]})
    strict = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"))
    assert (await strict(sample, [unknown])).rewards == [-1.0], "the sample's own tool list makes web_fetch unknown"
    lenient = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"),
                           checks=TrajectoryChecks(invalid_tool_call=None, trailing_tool_call=None, empty_answer=None, preset_reward_key=None))
    empty = traj({"role": "assistant", "content": ""}, extra={"reward": 1})
    before = len(fake.chat_requests())
    result = await lenient(sample, [empty])
    assert result.rewards == [0.0], "with every check off, the preset reward is ignored and the judge grades the empty answer"
    assert len(fake.chat_requests()) == before + 1
    required = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"), checks=TrajectoryChecks(required_tools=["web_search", "open_page"]))
    result = await required(sample, [traj(*SEARCHED, {"role": "assistant", "content": "景栗科技和薪勤科技"})])
    assert result.rewards == [-1.0] and "open_page" in result.grades[0].debug[0]


@pytest.mark.parametrize(("row", "reason"), [
    pytest.param({**SEED_ROW, "extra": {}}, "references lack 'answer'", id="no_reference"),
    pytest.param({**SEED_ROW, "extra": None}, "references lack 'answer'", id="no_extra"),
    pytest.param({**SEED_ROW, "messages": [*SEED_ROW["messages"], {"role": "assistant", "content": "hi"}]}, "does not end with a user", id="last_not_user"),
])
async def test_unusable_sample_is_discarded_before_any_judge_call(fake: FakeProvider, make_judge, row: dict, reason: str) -> None:
    grader = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"), sample_checks=SampleChecks(required_references=["answer"]))
    result = await grader(sample_from_row(row), [Trajectory.model_validate(t) for t in SEED_TRAJECTORIES])
    assert result.status == GroupStatus.DISCARD and result.rewards == []
    assert reason in result.error
    assert fake.chat_requests() == []


# ---- policies on judge failure ----------------------------------------------------------------

FAILURES = [
    pytest.param(Reply(status=500), "server_error", id="http_500"),
    pytest.param(Reply(status=429, headers={"Retry-After": "1"}), "rate_limited", id="http_429"),
    pytest.param(Reply(drop=True), "server_error", id="dropped_connection"),
    pytest.param(Reply(raw_body='{"id": "chatcmpl-1", "choices": ['), "server_error", id="broken_body"),
    pytest.param(Reply(content="我无法判断。"), "parse_failure", id="unparseable_reply"),
]


@pytest.mark.parametrize(("failure", "kind"), FAILURES)
@pytest.mark.parametrize("policy", ["FAILURE", "RETRY", "DISCARD"])
async def test_judge_failure_returns_the_configured_status_and_no_rewards(fake: FakeProvider, make_judge, failure: Reply, kind: str, policy: str) -> None:
    fake.set_responder(failing_where("FAIL", failure))
    judge = make_judge(retry=RetryPolicy(max_attempts=2, parse_retries=1))
    grader = group_grader(llm_grader(judge, "semantic_equivalence_zh"), on_judge_error=policy,  # type: ignore[arg-type]
                          on_member_error="drop_group")
    trajectories = [traj({"role": "assistant", "content": t}) for t in ("景栗科技和薪勤科技", "FAIL", "景栗科技")]
    result = await grader(seed_sample(), trajectories)
    assert result.status == GroupStatus(policy)
    assert result.rewards == [], "no judge error turns into a reward"
    assert "trajectory 1" in result.error and kind in result.error
    assert result.metrics["judge_errors"] == 1.0
    assert result.metrics["parse_failures"] == (1.0 if kind == "parse_failure" else 0.0)
    assert [g.status for g in result.grades] == ["ok", "error", "ok"]


@pytest.mark.parametrize("fixed", [0.0, -1.0])
async def test_fixed_score_policy_is_explicit(fake: FakeProvider, make_judge, fixed: float) -> None:
    fake.set_responder(failing_where("FAIL", Reply(status=503)))
    grader = group_grader(llm_grader(make_judge(retry=RetryPolicy(max_attempts=2)), "semantic_equivalence_zh"), on_judge_error=fixed)
    trajectories = [traj({"role": "assistant", "content": t}) for t in ("景栗科技和薪勤科技", "FAIL", "景栗科技")]
    result = await grader(seed_sample(), trajectories)
    assert result.status == GroupStatus.SUCCESS
    assert result.rewards == [1.0, fixed, 0.0]
    assert result.grades[1].status == "error" and result.grades[1].score is None, "the grade itself stays an error"
    assert any("fixed score" in line for line in result.grades[1].debug)
    assert result.metrics["judge_errors"] == 1.0


async def test_default_policy_is_retry_and_invalid_discards(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(failing_where("FAIL", Reply(status=500)))
    judge = make_judge(retry=RetryPolicy(max_attempts=1))
    result = await group_grader(llm_grader(judge, "semantic_equivalence_zh"))(seed_sample(), [traj({"role": "assistant", "content": "FAIL"})])
    assert result.status == GroupStatus.RETRY
    # A sample lacking the rubric's references is invalid for the grader: DISCARD by default, or a configured score.
    bare = sample_from_row({**SEED_ROW, "extra": {}})
    one = [traj({"role": "assistant", "content": "景栗科技"})]
    assert (await group_grader(llm_grader(judge, "semantic_equivalence_zh"))(bare, one)).status == GroupStatus.DISCARD
    result = await group_grader(llm_grader(judge, "semantic_equivalence_zh"), on_invalid=-1.0)(bare, one)
    assert result.status == GroupStatus.SUCCESS and result.rewards == [-1.0]
    with pytest.raises(ValueError):
        group_grader(llm_grader(judge, "semantic_equivalence_zh"), on_judge_error=2.0)


# ---- concurrency through the shared limiter ----------------------------------------------------


async def test_groups_share_one_limiter(fake: FakeProvider, make_judge) -> None:
    in_flight = InFlight(zh_judge, meet=3)
    fake.set_responder(in_flight)
    limiter = Limiter(concurrency=3)
    # Two judges (two graders) and four groups at once: every request still passes the one limiter.
    graders = [group_grader(llm_grader(make_judge(limiter=limiter, timeout=120), "semantic_equivalence_zh")) for _ in range(2)]
    answers = ["景栗科技和薪勤科技", "景栗科技", "薪勤科技和景栗科技", "不知道", "景栗科技、薪勤科技"]
    groups = [[traj({"role": "assistant", "content": f"{a}（{g}）"}) for a in answers] for g in range(4)]
    results = await asyncio.gather(*(graders[i % 2](seed_sample(), group) for i, group in enumerate(groups)))
    expected = [1.0 if all(n in a for n in ("景栗科技", "薪勤科技")) else 0.0 for a in answers]
    assert [r.rewards for r in results] == [expected] * 4, "rewards stay in trajectory order"
    assert len(fake.chat_requests()) == 20
    assert in_flight.peak == 3, "concurrent up to the limiter's cap, never beyond"


# ---- metrics and the spread check ---------------------------------------------------------------


async def test_metrics(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(zh_judge)
    grader = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"), pass_threshold=0.5)
    trajectories = [traj({"role": "assistant", "content": "景栗科技和薪勤科技"}), traj({"role": "assistant", "content": "景栗科技"}),
                    traj({"role": "assistant", "content": "x"}, extra={"reward": -0.5}), traj({"role": "assistant", "content": ""})]
    result = await grader(seed_sample(), trajectories)
    rewards = result.rewards
    assert rewards == [1.0, 0.0, -0.5, -1.0]
    m = result.metrics
    assert m["reward_mean"] == pytest.approx(statistics.fmean(rewards))
    assert m["reward_std"] == pytest.approx(statistics.pstdev(rewards))
    assert (m["reward_min"], m["reward_max"]) == (min(rewards), max(rewards))
    assert m["pass_rate"] == sum(r >= 0.5 for r in rewards) / len(rewards)
    assert (m["n"], m["preset"], m["format_checks"], m["judge_calls"], m["judge_errors"], m["all_equal"]) == (4, 1, 1, 2, 0, 0)


def test_reward_spread() -> None:
    groups = [[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0], [1.0]]
    report = reward_spread(groups)
    flat = [r for g in groups for r in g]
    multi = [g for g in groups if len(g) > 1]
    assert report.groups == 4 and report.rewards == len(flat)
    assert report.all_equal_share == pytest.approx(sum(len(set(g)) == 1 for g in multi) / len(multi))
    assert report.mean == pytest.approx(statistics.fmean(flat))
    assert report.variance == pytest.approx(statistics.pvariance(flat))
    assert report.mean_group_std == pytest.approx(statistics.fmean(statistics.pstdev(g) for g in multi))
    assert not report.too_easy and not report.too_hard


@pytest.mark.parametrize(("groups", "easy", "hard"), [
    ([[1.0] * 4] * 9 + [[1.0, 1.0, 1.0, 0.0]], True, False),
    ([[0.0] * 4] * 9 + [[0.0, 0.0, 1.0, 0.0]], False, True),
    ([[-1.0, 1.0]] * 5, False, False),
])
def test_reward_spread_flags(groups: list[list[float]], easy: bool, hard: bool) -> None:
    report = reward_spread(groups)
    assert (report.too_easy, report.too_hard) == (easy, hard)
    assert any("too easy" in a for a in report.advice) == easy and any("too hard" in a for a in report.advice) == hard
    if easy or hard:
        assert any("all-equal" in a for a in report.advice), "nine of ten groups are flat"


def test_a_grade_is_never_a_reward_in_the_spread() -> None:
    assert Grade.failed("error", "x").score is None
    report = reward_spread([[float("nan"), 1.0, 0.0]])
    assert report.rewards == 2, "NaN (could not judge) is skipped, not counted as a reward"


@pytest.mark.parametrize(("groups", "counts"), [
    pytest.param([[1, 1], [0, 0], [0, 0], [1, 0], [1]], (1, 2), id="all_max_and_all_min"),
    pytest.param([[1, 1], [1, 1]], (2, 0), id="one_value_that_passes_is_too_easy"),
    pytest.param([[-1, -1, -1], [-1, -1]], (0, 2), id="one_value_that_fails_is_too_hard"),
    pytest.param([[0.5, 0.5], [1, 0]], (0, 0), id="flat_in_the_middle_is_neither"),
])
def test_spread_counts_groups_too_easy_and_too_hard(groups, counts) -> None:
    from gradekit.graders import reward_spread

    report = reward_spread(groups)
    assert (report.too_easy_groups, report.too_hard_groups) == counts


async def test_a_groups_usage_is_its_members_sum(fake: FakeProvider, make_judge) -> None:
    """Issue 47: what the members' judges billed adds up in GroupResult.usage and the judge_calls metric."""
    fake.set_responder(zh_judge)
    grader = group_grader(llm_grader(make_judge(), "semantic_equivalence_zh"), checks=TrajectoryChecks(require_tool_call=True, tools=[SEARCH_TOOL]))
    members = [traj(*SEARCHED, {"role": "assistant", "content": "答案是景栗科技和薪勤科技"}),
               traj({"role": "assistant", "content": "景栗科技和薪勤科技"}),  # answered without searching: a check, no judge
               traj(*SEARCHED, {"role": "assistant", "content": "只有薪勤科技"})]
    result = await grader(seed_sample(), members)
    assert result.status == GroupStatus.SUCCESS, result.error
    sent = len(fake.chat_requests())
    assert sent == 2 and result.usage is not None and result.usage.requests == sent and result.metrics["judge_calls"] == sent
    assert result.usage.prompt_tokens == sum(g.usage.prompt_tokens for g in result.grades if g.usage is not None) > 0
    assert result.grades[1].usage is None
