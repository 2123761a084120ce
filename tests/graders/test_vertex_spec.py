"""Vertex's reinforcementTuningSpec: JSON round trip, loading as graders, and every scorer type."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gradekit.graders import (
    GraderConfigError,
    Sample,
    cloud_run_grader,
    dump_vertex_spec,
    load_grader,
    parse_vertex_spec,
    sample_from_vertex,
    vertex_grader,
)
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import until_sync

DATA = Path(__file__).parents[1] / "data" / "graders"
EXAMPLE = json.loads((DATA / "example_vertex.json").read_text(encoding="utf-8"))


def vertex_sample(text: str) -> Sample:
    return sample_from_vertex(EXAMPLE, {"role": "model", "parts": [{"text": text}]})


FULL_SPEC = {
    "singleRewardConfig": {
        "rewardName": "judge_score",
        "parseResponseConfig": {"parseType": "IDENTITY"},
        "autoraterScorer": {
            "autoraterPrompt": "Rate {{response}} against {{references.answer}} from -1 to 1. <score>x</score>",
            "autoraterConfig": {"autoraterModel": "gemini-2.5-pro", "samplingCount": 3, "flipEnabled": True, "futureField": {"kept": 1}},
            "autoraterResponseParseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": "<score>(.*?)</score>"},
            "parsedResponseConversionScorer": {},
        },
    }
}


@pytest.mark.parametrize("name", ["vertex_single.json", "vertex_composite.json"])
def test_spec_file_round_trips_unchanged(name: str) -> None:
    original = json.loads((DATA / name).read_text(encoding="utf-8"))
    spec = parse_vertex_spec(DATA / name)
    assert dump_vertex_spec(spec, wrap=True) == original
    assert dump_vertex_spec(parse_vertex_spec(original["reinforcementTuningSpec"])) == original["reinforcementTuningSpec"]


@pytest.mark.parametrize("body", [
    pytest.param(FULL_SPEC, id="autorater_numeric_with_unknown_config_fields"),
    pytest.param({"singleRewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": "https://reward-abc.a.run.app"}}}, id="cloud_run"),
    pytest.param({"singleRewardConfig": {"rewardName": "c", "codeExecutionRewardScorer": {"pythonCodeSnippet": "def evaluate(e, r):\n  return 1\n"}}}, id="code"),
    pytest.param({"singleRewardConfig": {"stringMatchRewardScorer": {"stringMatchExpression": {"matchOperation": "REGEX_CONTAINS", "expression": "a+"}}}},
                 id="rewards_omitted_stay_omitted"),
])
def test_round_trip_keeps_exactly_what_was_set(body: dict) -> None:
    assert dump_vertex_spec(parse_vertex_spec(copy.deepcopy(body))) == body


async def test_single_string_match_spec_grades() -> None:
    grader = vertex_grader(DATA / "vertex_single.json")
    assert (await grader(vertex_sample(r"Reasoning... \boxed{Lyon}? No: \boxed{Paris}"))).score == 1.0
    assert (await grader(vertex_sample(r"\boxed{Lyon}"))).score == -1.0
    assert (await grader(vertex_sample("Paris, unboxed"))).score == -1.0


async def test_proto3_default_rewards_are_zero() -> None:
    spec = {"singleRewardConfig": {"stringMatchRewardScorer": {"stringMatchExpression": {"matchOperation": "PARTIAL_MATCH", "expression": "{{references.answer}}"},
                                                               "correctAnswerReward": 0.5}}}
    grader = vertex_grader(spec)
    assert (await grader(vertex_sample("Paris"))).score == 0.5
    assert (await grader(vertex_sample("Lyon"))).score == 0.0


def polite_judge(body: dict) -> Reply:
    answer = body["messages"][-1]["content"].split("Answer: ", 1)[1]
    # One verdict per reply: two different ones (a draft, then the final) would be ambiguous_verdict.
    return Reply(content="Hmm, let me weigh the wording... final <answer>" + ("Yes" if "please" in answer.lower() else "No") + "</answer>")


async def test_composite_spec_with_every_local_scorer(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(polite_judge)
    raw = json.loads((DATA / "vertex_composite.json").read_text(encoding="utf-8"))
    weights = {c["rewardConfig"]["rewardName"]: c["weight"] for c in raw["reinforcementTuningSpec"]["compositeRewardConfig"]["weightedRewardConfigs"]}
    grader = vertex_grader(DATA / "vertex_composite.json", judge=make_judge())
    try:
        grade = await grader(vertex_sample('Please note: {"city": "Paris"}'))
        parts = {name: part.score for name, part in grade.parts.items()}
        assert parts == {"answer": 1.0, "json_city": 1.0, "code": 0.5, "polite": 1.0}
        assert grade.score == pytest.approx(sum(weights[n] * parts[n] for n in weights) / sum(weights.values()))  # type: ignore[operator]
        grade = await grader(vertex_sample('{"city": "Lyon"} ' + "x" * 300))
        parts = {name: part.score for name, part in grade.parts.items()}
        assert parts == {"answer": -1.0, "json_city": 0.0, "code": -0.5, "polite": -1.0}
        assert grade.score == pytest.approx(sum(weights[n] * parts[n] for n in weights) / sum(weights.values()))  # type: ignore[operator]
        assert len(fake.chat_requests()) == 2, "one autorater request per graded response"
    finally:
        await grader.aclose()  # type: ignore[attr-defined]


async def test_numeric_autorater_spec(fake: FakeProvider, make_judge) -> None:
    fake.set_responder(lambda body: Reply(content="Close enough. <score>0.6</score>"))
    grade = await vertex_grader(FULL_SPEC, judge=make_judge())(vertex_sample("Paris"))
    assert grade.score == 0.6
    sent = fake.chat_requests()[0].body["messages"][-1]["content"]  # type: ignore[index]
    assert sent == "Rate Paris against Paris from -1 to 1. <score>x</score>"


@pytest.mark.parametrize(("body", "message"), [
    pytest.param({"singleRewardConfig": {"stringMatchRewardScorer": {"stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "x"}, "bonus": 1}}},
                 "singleRewardConfig.stringMatchRewardScorer.bonus", id="unknown_field_has_its_path"),
    pytest.param({"singleRewardConfig": {"rewardName": "x"}}, "exactly one scorer", id="no_scorer"),
    pytest.param({"singleRewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": "u"}, "codeExecutionRewardScorer": {"pythonCodeSnippet": "x"}}},
                 "exactly one scorer", id="two_scorers"),
    pytest.param({"singleRewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": "u"}}, "compositeRewardConfig": {"weightedRewardConfigs": [{"weight": 1, "rewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": "u"}}}]}},
                 "exactly one of singleRewardConfig", id="single_and_composite"),
    pytest.param({"compositeRewardConfig": {"weightedRewardConfigs": [{"weight": 1, "rewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": "u"}}}] * 17}},
                 "at most 16", id="seventeen_parts"),
    pytest.param({"singleRewardConfig": {"stringMatchRewardScorer": {"stringMatchExpression": {"matchOperation": "FUZZY", "expression": "x"}}}},
                 "matchOperation", id="bad_operation"),
    pytest.param({"singleRewardConfig": {"autoraterScorer": {"autoraterPrompt": "p", "exactMatchScorer": {"expression": "{{response}}"}}}},
                 "only use {{references.key}}", id="exact_match_expression_with_response"),
])
def test_spec_errors_name_the_field(body: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_vertex_spec(body, source="job.json")
    assert "job.json" in str(info.value) and message in str(info.value)


def test_autorater_spec_without_a_judge_says_so() -> None:
    with pytest.raises(ValueError, match="pass a judge"):
        vertex_grader(FULL_SPEC)


async def test_spec_files_load_through_the_config_loader(fake: FakeProvider, make_judge) -> None:
    grader = load_grader(DATA / "vertex_single.json")
    assert (await grader(vertex_sample(r"\boxed{Paris}"))).score == 1.0
    nested = load_grader({"type": "weighted", "parts": {"spec": {"weight": 1, "type": "vertex", "file": str(DATA / "vertex_single.json")},
                                                         "inline": {"weight": 1, "type": "vertex", "spec": FULL_SPEC}}}, judge=make_judge())
    fake.set_responder(lambda body: Reply(content="<score>0</score>"))
    grade = await nested(vertex_sample(r"\boxed{Paris}"))
    assert {n: p.score for n, p in grade.parts.items()} == {"spec": 1.0, "inline": 0.0}
    with pytest.raises(GraderConfigError, match=r"spec\.singleRewardConfig\.oops"):
        load_grader({"type": "vertex", "spec": {"singleRewardConfig": {"oops": 1}}})


# ---- Cloud Run ---------------------------------------------------------------------------------


@pytest.fixture
def reward_service() -> Iterator[tuple[str, list[dict]]]:
    """A loopback stand-in for a user's Cloud Run reward service."""
    seen: list[dict] = []

    async def reward(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        text = body["response"]["parts"][0]["text"]
        if text == "crash":
            return JSONResponse({"message": "boom"}, status_code=500)
        if text == "garbage":
            return JSONResponse({"score": 1})
        right = text == body["example"]["references"]["answer"]
        return JSONResponse({"reward": 1.0 if right else -1.0, "user_requested_aux_info": f"compared {text!r}"})

    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/", reward, methods=["POST"])]), host="127.0.0.1", port=0,
                                           log_level="warning", log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until_sync(lambda: server.started or not thread.is_alive(), "the reward service started")
    assert server.started, "the reward service's thread ended before it started"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/", seen
    server.should_exit = True
    thread.join(timeout=5)


async def test_cloud_run_scorer_posts_the_vertex_shapes(reward_service) -> None:
    uri, seen = reward_service
    grader = vertex_grader({"singleRewardConfig": {"rewardName": "remote", "cloudRunRewardScorer": {"cloudRunUri": uri}}})
    grade = await grader(vertex_sample("Paris"))
    assert grade.status == "ok" and grade.score == 1.0
    assert "remote: compared 'Paris'" in grade.debug
    assert seen[0]["example"]["references"] == {"answer": "Paris"}
    assert seen[0]["example"]["contents"] == EXAMPLE["contents"]
    assert seen[0]["response"] == {"role": "model", "parts": [{"text": "Paris"}]}
    assert (await grader(vertex_sample("Lyon"))).score == -1.0


@pytest.mark.parametrize(("text", "message"), [("crash", "HTTP 500"), ("garbage", "without a numeric reward")])
async def test_cloud_run_failure_is_an_error_not_a_score(reward_service, text: str, message: str) -> None:
    uri, _ = reward_service
    grade = await cloud_run_grader(uri, name="remote")(vertex_sample(text))
    assert grade.status == "error" and grade.score is None and message in (grade.error or "")


async def test_cloud_run_unreachable_is_an_error() -> None:
    grade = await cloud_run_grader("http://127.0.0.1:9/", timeout=2)(vertex_sample("Paris"))
    assert grade.status == "error" and "did not answer" in (grade.error or "")
