"""The reward server over real HTTP: each platform contract round trip, failures, 400/422/401, 503.

Servers run on a thread (RewardServer, port 0); LLM graders call the loopback FakeProvider.
Clients are plain urllib, so nothing here shares code with the server side.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gradekit.graders import (
    BaseRewardComputer,
    Grade,
    GraderRewardComputer,
    RewardRequest,
    RewardResponse,
    RewardServer,
    Sample,
    create_app,
    load_grader,
)
from gradekit.graders.server import ServerConfigError, build_computer, load_server_config
from gradekit.judge import Judge, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from ..cases import cases
from ..conftest import reference_judge

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "server"


# ---- helpers ---------------------------------------------------------------------------------


def call(url: str, path: str = "/", body: Any = None, *, raw: bytes | None = None, headers: dict[str, str] | None = None,
         method: str | None = None, timeout: float = 30) -> tuple[int, Any, Any]:
    """(status, headers, parsed JSON body) of one request; non-2xx answers are returned, not raised."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"null")


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll until ``predicate()``; the timeout is only a safety net against a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(computer_or_grader, config=None) -> base URL``; every server is stopped at teardown."""
    servers: list[RewardServer] = []

    def start(computer: Any, config: Any = None, **kwargs: Any) -> str:
        server = RewardServer(create_app(computer, config, **kwargs), port=0, log_level="warning").start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


async def _no_wait(_: float) -> None:
    return None


def judge_grader(fake: FakeProvider, *, attempts: int = 2, **node: Any) -> Any:
    """The shipped semantic-equivalence rubric on a Judge pointed at the fake (no real retry waits).

    The judge is made by the config's builder, so closing the grader (the server's shutdown) closes it.
    """
    def make() -> Judge:
        return Judge("fake-judge", base_url=fake.base_url, api_key="test-key", timeout=30, cache=None,
                     limiter=Limiter(concurrency=64, sleep=_no_wait), retry=RetryPolicy(max_attempts=attempts), sleep=_no_wait)

    return load_grader({"type": "llm", "rubric": "semantic_equivalence_en", **node}, judge=make)


class Recorder:
    """A deterministic grader that keeps every sample it was given."""

    def __init__(self, score: float = 1.0) -> None:
        self.score = score
        self.samples: list[Sample] = []

    async def __call__(self, sample: Sample) -> Grade:
        self.samples.append(sample)
        return Grade.scored(self.score, metrics={"chars": float(len(sample.response_text))})


MATCH = {"type": "string_match", "expression": "{{references.answer}}", "operation": "EXACT_MATCH",
         "parse": {"type": "REGEX_EXTRACT", "regex": "<answer>(.*?)</answer>"}, "correct": 1, "wrong": -1}


# ---- Bailian seed 001: /compute_reward and /health ---------------------------------------------


def test_seed_round_trip_with_an_llm_grader(fake: FakeProvider, serve) -> None:
    fake.set_responder(reference_judge)
    url = serve(judge_grader(fake))
    status, _, body = call(url, "/compute_reward", {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "response": "It is Paris.", "extra_params": {"answer": "Paris"}, "request_id": "r-1"})
    assert status == 200
    assert body["status"] == "success" and body["score"] == 1.0 and body["detail"] is None
    assert body["extra_info"]["grade_status"] == "ok" and body["extra_info"]["metrics"]["judge_attempts"] == 1.0
    sent = fake.chat_requests()[-1].body["messages"][-1]["content"]
    assert "What is the capital of France?" in sent and "It is Paris." in sent and "- Paris" in sent

    # The seed's minimal form: a prompt string instead of messages; a wrong answer is a success scoring 0.
    status, _, body = call(url, "/compute_reward", {"prompt": "Capital of Italy?", "response": "Milan", "extra_params": {"answer": "Rome"}})
    assert (status, body["status"], body["score"]) == (200, "success", 0.0)
    assert "Capital of Italy?" in fake.chat_requests()[-1].body["messages"][-1]["content"]


def test_seed_example_config_serves_its_class(serve) -> None:
    """examples/server/configs/config.yaml: the seed's length-based computer, a plain def on the thread pool."""
    config = load_server_config(EXAMPLES / "configs" / "config.yaml")
    url = serve(build_computer(config), config)
    status, _, body = call(url, "/compute_reward", {"response": "x" * 60, "extra_params": {"custom_param": "c"}})
    assert status == 200 and body == {"score": 0.7, "status": "success", "detail": None,
                                      "extra_info": {"response_length": 60, "custom_param": "c"}}
    status, _, health = call(url, "/health")
    assert status == 200
    assert health["status"] == "healthy" and health["message"] == "Length reward computer is healthy"
    assert health["func_type"] == "reward" and health["processor"] == "LengthRewardComputer"


def test_grader_example_config_and_dashscope_style_paths(serve, tmp_path: Path) -> None:
    config = load_server_config(EXAMPLES / "configs" / "grader_config.yaml")
    url = serve(build_computer(config), config)
    status, _, body = call(url, "/compute_reward", {"response": "so \\boxed{1,000}", "extra_params": {"answer": "1000"}})
    assert (status, body["status"], body["score"]) == (200, "success", 1.0)

    # "path/file.py:Class" and "path/file.py:function", relative to the config file.
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "rewards.py").write_text(
        "from gradekit.graders import BaseRewardComputer, RewardResponse\n"
        "class Half(BaseRewardComputer):\n"
        "    def compute_reward(self, request):\n"
        "        return RewardResponse(score=0.5)\n"
        "def sick():\n"
        "    return {'status': 'unhealthy', 'message': 'judge unreachable'}\n", encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  class: impl/rewards.py:Half\nhealth_check:\n  function: impl/rewards.py:sick\n", encoding="utf-8")
    config = load_server_config(tmp_path / "config.yaml")
    url = serve(build_computer(config), config)
    assert call(url, "/compute_reward", {"response": "r"})[2]["score"] == 0.5
    status, _, health = call(url, "/health")
    assert status == 503 and health["status"] == "unhealthy" and health["message"] == "judge unreachable"


# ---- DashScope /api/v1 -----------------------------------------------------------------------


def test_dashscope_reward_maps_the_rollout_to_a_sample(serve) -> None:
    recorder = Recorder(score=0.25)
    url = serve(recorder)
    status, _, body = call(url, "/api/v1", {
        "func_type": "reward", "ground_truth": "5", "rollout_id": "ro-1",
        "request_metadata": {"job_id": "j", "sample_id": "s", "rollout_id": "ro-1", "attempt_id": "a"},
        "agent_output": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
                                      {"role": "assistant", "content": "5"}],
                         "rollout_extra": {"topic": "math"}, "rollout_metrics": {"turns": 1.0}, "reward_score": 0.1}})
    assert status == 200
    assert body == {"reward": {"reward_score": 0.25, "reward_metrics": {"chars": 1.0}}, "status": "success", "error": None}
    sample = recorder.samples[-1]
    assert [m.role for m in sample.messages] == ["system", "user"] and sample.prompt_text == "2+3?"
    assert sample.response_text == "5"
    assert sample.references == {"topic": "math", "ground_truth": "5", "answer": "5"}
    assert sample.metadata["reward_score"] == 0.1 and sample.metadata["rollout_metrics"] == {"turns": 1.0}
    assert sample.metadata["request_metadata"]["sample_id"] == "s"

    # A dict ground truth merges into the references (and wins a clash with rollout_extra).
    call(url, "/api/v1", {"ground_truth": {"answer": "5", "topic": "arithmetic"},
                          "agent_output": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                                           "rollout_extra": {"topic": "math"}}})
    assert recorder.samples[-1].references == {"answer": "5", "topic": "arithmetic"}


def test_dashscope_group_reward_keeps_order_and_length(serve) -> None:
    url = serve(load_grader(MATCH))
    outputs = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"<answer>{a}</answer>"}]}
               for a in ("5", "6", "5", "x")]
    status, _, body = call(url, "/api/v1", {"func_type": "group_reward", "ground_truth": {"answer": "5"}, "agent_outputs": outputs})
    assert status == 200 and body["status"] == "success" and body["error"] is None
    assert [r["reward_score"] for r in body["reward"]["rewards"]] == [1.0, -1.0, 1.0, -1.0]


# DashScope's processor contract, dashscope 2.0.2 (PyPI) server.py: a failure is 200 status FAILED, which the platform
# retries or drops (tests/platforms/test_platform_sdks.py builds the requests with that package's own models).
def test_dashscope_transient_judge_failure_is_failed_not_a_score(fake: FakeProvider, serve) -> None:
    fake.set_responder(lambda body: Reply(status=500) if "boom" in json.dumps(body) else reference_judge(body))
    url = serve(judge_grader(fake, attempts=2))
    single = {"ground_truth": {"answer": "Paris"},
              "agent_output": {"messages": [{"role": "user", "content": "Capital?"}, {"role": "assistant", "content": "boom"}]}}
    status, _, body = call(url, "/api/v1", single)
    assert status == 200 and body["status"] == "failed"
    assert "server_error" in body["error"] and body["reward"]["reward_metrics"] is None
    assert sum(r.status == 500 for r in fake.chat_requests()) == 2, "the judge retried, then the failure was reported"

    status, _, body = call(url, "/compute_reward", {"prompt": "Capital?", "response": "boom", "extra_params": {"answer": "Paris"}})
    assert (status, body["status"], body["extra_info"]["grade_status"], body["extra_info"]["error_kind"]) == (200, "fail", "error", "server_error")
    assert "server_error" in body["detail"]

    ok = {"messages": [{"role": "user", "content": "Capital?"}, {"role": "assistant", "content": "Paris"}]}
    group = {"func_type": "group_reward", "ground_truth": {"answer": "Paris"}, "agent_outputs": [ok, single["agent_output"], ok]}
    # group.on_member_error: drop_group -- one failed member fails the group, with no rewards at all.
    dropping = serve(judge_grader(fake, attempts=2), {"group": {"on_member_error": "drop_group"}})
    status, _, body = call(dropping, "/api/v1", group)
    assert status == 200 and body["status"] == "failed" and body["reward"]["rewards"] == []
    assert body["error"].startswith("agent_outputs[1]:")
    # renormalize (the default): decided on the two that finished; the failed member carries their
    # mean (its advantage is 0) and reward_metrics.member_failed = 1.
    status, _, body = call(url, "/api/v1", group)
    assert status == 200 and body["status"] == "success"
    scores = [r["reward_score"] for r in body["reward"]["rewards"]]
    assert scores == [1.0, 1.0, 1.0]
    assert [r["reward_metrics"]["member_failed"] for r in body["reward"]["rewards"]] == [0.0, 1.0, 0.0]


# ---- Vertex Cloud Run: POST / ------------------------------------------------------------------


VERTEX = {"example": {"systemInstruction": {"parts": [{"text": "Answer briefly."}]},
                      "contents": [{"role": "user", "parts": [{"text": "Capital of France?"}]}],
                      "references": {"answer": "Paris"}},
          "response": {"role": "model", "parts": [{"text": "Paris."}]},
          "metadata": {"step": 3, "tuning_job_id": 42}}


def test_vertex_round_trip_and_clipping(fake: FakeProvider, serve) -> None:
    fake.set_responder(reference_judge)
    url = serve(judge_grader(fake))
    status, _, body = call(url, "/", VERTEX)
    assert status == 200 and body["reward"] == 1.0
    assert json.loads(body["user_requested_aux_info"])["grade_status"] == "ok"

    recorder = Recorder()
    url = serve(recorder)
    call(url, "/", VERTEX)
    sample = recorder.samples[-1]
    assert sample.system_text == "Answer briefly." and sample.prompt_text == "Capital of France?" and sample.response_text == "Paris."
    assert sample.references == {"answer": "Paris"} and sample.metadata["step"] == 3 and sample.metadata["tuning_job_id"] == 42

    class Loud(BaseRewardComputer):
        def compute_reward(self, request: RewardRequest) -> RewardResponse:
            return RewardResponse(score=float(request.extra_params["raw"]))

    url = serve(Loud())
    assert call(url, "/", {**VERTEX, "example": {"references": {"raw": "5"}}})[2]["reward"] == 1.0
    assert call(url, "/", {**VERTEX, "example": {"references": {"raw": "-3"}}})[2]["reward"] == -1.0


def test_vertex_judge_unreachable_is_a_502_without_a_reward(serve) -> None:
    fake = FakeProvider().start()
    url = serve(judge_grader(fake, attempts=2))
    fake.stop()  # the judge is gone: every attempt fails to connect
    status, _, body = call(url, "/", VERTEX)
    assert status == 502 and "reward" not in body
    assert body["status"] == "fail" and body["failures"][0]["grade_status"] == "error" and "server_error" in body["error"]


# ---- OpenRLHF: POST /get_reward ----------------------------------------------------------------


def test_openrlhf_round_trip_splits_the_response_off_the_query(serve) -> None:
    recorder = Recorder(score=-1.0)
    url = serve(recorder)
    prompts = ["<|user|>2+3?<|assistant|>", "<|user|>Capital?<|assistant|>"]
    body = {"query": [prompts[0] + "5<|end|>", "<s>" + prompts[1] + "Paris"], "prompts": prompts, "labels": ["5", '{"answer": "Paris"}']}
    status, _, reply = call(url, "/get_reward", body)
    assert status == 200
    assert reply == {"rewards": [-1.0, -1.0], "scores": [0.0, 0.0], "extra_logs": {"chars": [1.0, 5.0]}}
    first, second = sorted(recorder.samples, key=lambda s: s.response_text)
    assert (first.response_text, second.response_text) == ("5", "Paris"), "the template's end token is cut off"
    assert first.references == {"label": "5", "answer": "5"} and second.references == {"answer": "Paris"}
    assert second.prompt_text == prompts[1]

    # An old client sends only the query: the whole query is the response.
    status, _, reply = call(url, "/get_reward", {"query": ["just text"]})
    assert status == 200 and reply["rewards"] == [-1.0] and recorder.samples[-1].response_text == "just text"


def test_openrlhf_any_failure_is_non_2xx_never_a_score(fake: FakeProvider, serve) -> None:
    fake.set_responder(lambda body: Reply(status=503) if "boom" in json.dumps(body) else reference_judge(body))
    url = serve(judge_grader(fake, map={"references": "references.label"}))
    body = {"query": ["Q: capital? A: Paris", "Q: capital? A: boom"], "prompts": ["Q: capital? A:"] * 2, "labels": ["Paris", "Paris"]}
    status, _, reply = call(url, "/get_reward", body)
    assert status == 502 and "rewards" not in reply
    assert [(f["item"], f["grade_status"]) for f in reply["failures"]] == [("query[1]", "error")]
    status, _, reply = call(url, "/get_reward", {**body, "query": ["Q: capital? A: Paris", "Q: capital? A: Lyon"]})
    assert status == 200 and reply["rewards"] == [1.0, 0.0]


def test_openrlhf_422_names_the_field(serve) -> None:
    url = serve(Recorder())
    status, _, reply = call(url, "/get_reward", {"query": ["a", "b"], "prompts": ["a"]})
    assert status == 422 and reply["detail"][0]["loc"] == ["body", "prompts"]
    status, _, reply = call(url, "/get_reward", {"query": ["abc", "xyz"], "prompts": ["a", "q"]})
    assert status == 422 and reply["detail"][0]["loc"] == ["body", "query", 1]


def test_a_rubric_variable_the_request_lacks_is_named_not_graded_empty(fake: FakeProvider, serve) -> None:
    # No prompt: the rubric's question cannot be filled; the judge is never asked with an empty one.
    url = serve(judge_grader(fake))
    status, _, reply = call(url, "/get_reward", {"query": ["Paris"], "labels": ["Paris"]})
    assert status == 422 and reply["detail"][0]["loc"] == ["body", "prompts"] and "'question'" in reply["detail"][0]["msg"], reply
    no_prompt = {**VERTEX, "example": {"contents": [], "references": {"answer": "Paris"}}}
    status, _, reply = call(url, "/", no_prompt)
    assert status == 422 and "'question'" in json.dumps(reply), reply
    status, _, body = call(url, "/compute_reward", {"response": "Paris", "extra_params": {"answer": "Paris"}})
    assert status == 200 and body["status"] == "fail" and body["extra_info"]["grade_status"] == "invalid" and "'question'" in json.dumps(body)
    assert fake.chat_requests() == []


# ---- invalid samples: the configured policy ------------------------------------------------------


def test_invalid_sample_fails_by_default_and_scores_zero_when_configured(fake: FakeProvider, serve) -> None:
    # No reference answer: the rubric cannot be filled, the grade is invalid and the judge is never asked.
    no_reference = {"prompt": "Capital of France?", "response": "Paris"}
    url = serve(judge_grader(fake))
    status, _, body = call(url, "/compute_reward", no_reference)
    assert status == 200 and body["status"] == "fail" and body["extra_info"]["grade_status"] == "invalid"
    status, _, body = call(url, "/api/v1", {"agent_output": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}})
    assert status == 200 and body["status"] == "failed"
    assert call(url, "/", {**VERTEX, "example": {"contents": VERTEX["example"]["contents"]}})[0] == 422, "invalid: retrying cannot help"

    url = serve(judge_grader(fake), {"reward": {"grader": "unused.yaml", "invalid": "zero"}})
    status, _, body = call(url, "/compute_reward", no_reference)
    assert (status, body["status"], body["score"]) == (200, "success", 0.0) and body["extra_info"]["grade_status"] == "invalid"
    assert call(url, "/get_reward", {"query": ["x"]})[2]["rewards"] == [0.0]
    assert fake.chat_requests() == []


# ---- 400 / 422 / 401 / 500 ----------------------------------------------------------------------


@pytest.mark.parametrize(("path", "missing"), cases("server_missing_fields"))
def test_broken_json_is_400_and_a_missing_field_is_422_naming_it(serve, path: str, missing: str) -> None:
    url = serve(Recorder())
    status, _, body = call(url, path, raw=b'{"response": "unterminated')
    assert status == 400 and body["detail"].startswith("Invalid JSON body")
    status, _, body = call(url, path, {"unrelated": 1})
    assert status == 422
    assert ["body", missing] in [d["loc"] for d in body["detail"]]


def test_dashscope_422_cases(serve) -> None:
    url = serve(Recorder())
    status, _, body = call(url, "/api/v1", {"func_type": "rollout", "agent_output": {}})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "func_type"]
    status, _, body = call(url, "/api/v1", {"func_type": "group_reward", "agent_outputs": [{"messages": [{"content": "no role"}]}]})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "agent_outputs", 0, "messages", 0, "role"]


def test_bearer_token_guards_every_route_but_health(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    url = serve(Recorder(), {"server": {"auth_token": "s3cret"}})
    status, headers, body = call(url, "/compute_reward", {"response": "r"})
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer" and body == {"detail": "Not authenticated"}
    for path, payload in [("/api/v1", {"agent_output": {}}), ("/", VERTEX), ("/get_reward", {"query": ["q"]})]:
        assert call(url, path, payload, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert call(url, "/compute_reward", {"response": "r"}, headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert call(url, "/health")[0] == 200

    monkeypatch.setenv("GRADEKIT_SERVER_TOKEN", "from-env")
    url = serve(Recorder())
    assert call(url, "/compute_reward", {"response": "r"})[0] == 401
    assert call(url, "/compute_reward", {"response": "r"}, headers={"Authorization": "Bearer from-env"})[0] == 200


def test_a_computer_that_raises_is_500_with_a_message(serve) -> None:
    class Broken(BaseRewardComputer):
        def compute_reward(self, request: RewardRequest) -> RewardResponse:
            raise RuntimeError("disk on fire")

    url = serve(Broken())
    for path, payload in [("/compute_reward", {"response": "r"}), ("/api/v1", {"agent_output": {}}), ("/get_reward", {"query": ["q"]})]:
        status, _, body = call(url, path, payload)
        assert status == 500 and body == {"message": "RuntimeError: disk on fire"}


def test_every_request_is_logged_with_route_outcome_and_latency(serve, caplog: pytest.LogCaptureFixture) -> None:
    def records() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "gradekit.server" and hasattr(r, "route")]

    url = serve(Recorder())
    with caplog.at_level(logging.INFO, logger="gradekit.server"):
        call(url, "/compute_reward", {"response": "r"})
        call(url, "/get_reward", raw=b"{")
        call(url, "/api/v1", {})
        wait_for(lambda: len(records()) == 3, "the third log line (written once the response is sent)")
    assert [(r.route, r.status, r.outcome) for r in records()] == [
        ("/compute_reward", 200, "success"), ("/get_reward", 400, "invalid json"), ("/api/v1", 422, "unprocessable")]
    assert all(r.latency_ms >= 0 for r in records())

    quiet = serve(Recorder(), {"logging": {"enable": False}})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gradekit.server"):
        call(quiet, "/compute_reward", {"response": "r"})
        call(url, "/health")  # a logged request after the quiet one: once it is logged, the quiet one would have been
        wait_for(lambda: len(records()) == 1, "the health check's log line")
    assert [r.route for r in records()] == ["/health"]


# ---- load: a full queue answers 503 at once ------------------------------------------------------


class Gate(BaseRewardComputer):
    """A sync computer that blocks every call until released: the thread pool path."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self._lock = threading.Lock()

    def compute_reward(self, request: RewardRequest) -> RewardResponse:
        with self._lock:
            self.started += 1
        assert self.release.wait(30), "never released"
        return RewardResponse(score=1.0)


def in_flight(url: str) -> int:
    return call(url, "/health")[2]["in_flight"]


def test_full_queue_is_503_with_retry_after_while_admitted_requests_finish(serve) -> None:
    gate = Gate()
    url = serve(gate, {"thread_pool": {"max_workers": 2, "queue_size": 1}})
    with ThreadPoolExecutor(8) as pool:
        admitted = [pool.submit(call, url, "/compute_reward", {"response": f"r{i}"}) for i in range(3)]
        wait_for(lambda: gate.started == 2 and in_flight(url) == 3, "two running and one queued")
        refused = [call(url, path, payload) for path, payload in
                   [("/compute_reward", {"response": "late"}), ("/api/v1", {"agent_output": {}}), ("/get_reward", {"query": ["q"]})]]
        assert not any(f.done() for f in admitted), "the 503s came back while the admitted requests were still running"
        for status, headers, body in refused:
            assert status == 503 and headers["Retry-After"] == "1" and body == {"detail": "Server is busy, please try again later."}
        gate.release.set()
        results = [f.result(timeout=30) for f in admitted]
    assert [(s, b["status"], b["score"]) for s, _, b in results] == [(200, "success", 1.0)] * 3
    assert in_flight(url) == 0 and gate.started == 3


def test_full_queue_with_an_async_grader_waiting_on_a_slow_judge(serve) -> None:
    release = threading.Event()

    async def slow(body: dict) -> Reply:
        import asyncio
        await asyncio.to_thread(release.wait, 30)
        return reference_judge(body)

    with FakeProvider(responder=slow) as fake:
        url = serve(judge_grader(fake), {"thread_pool": {"max_workers": 1, "queue_size": 1}})
        row = {"prompt": "Capital?", "response": "Paris", "extra_params": {"answer": "Paris"}}
        with ThreadPoolExecutor(4) as pool:
            admitted = [pool.submit(call, url, "/compute_reward", row) for _ in range(2)]
            wait_for(lambda: len(fake.chat_requests()) == 1 and in_flight(url) == 2, "one judging, one queued")
            status, headers, _ = call(url, "/compute_reward", row)
            assert not any(f.done() for f in admitted)
            assert status == 503 and headers["Retry-After"] == "1"
            release.set()
            results = [f.result(timeout=30) for f in admitted]
        assert [(s, b["score"]) for s, _, b in results] == [(200, 1.0), (200, 1.0)]
        assert len(fake.chat_requests()) == 2, "the semaphore let one judge call through at a time, and the refused one never reached it"


# ---- lifecycle ----------------------------------------------------------------------------------


def test_the_grader_is_closed_on_shutdown() -> None:
    closed: list[str] = []

    class Closing(Recorder):
        async def aclose(self) -> None:
            closed.append("grader")

    server = RewardServer(create_app(Closing()), port=0, log_level="warning").start()
    assert call(server.url, "/compute_reward", {"response": "r"})[0] == 200
    assert closed == []
    server.stop()
    assert closed == ["grader"]


# ---- config errors name the file and the key ------------------------------------------------------


@pytest.mark.parametrize(("text", "names"), cases("server_config_errors"))
def test_config_errors_name_the_file_and_key(tmp_path: Path, text: str, names: str) -> None:
    (tmp_path / "bad.yaml").write_text("type: nope\n", encoding="utf-8")
    (tmp_path / "ok.yaml").write_text(json.dumps(MATCH), encoding="utf-8")
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ServerConfigError) as caught:
        config = load_server_config(path)
        create_app(build_computer(config), config)
    message = str(caught.value)
    assert message.startswith(str(path)) and names in message, message


def test_subclassing_the_grader_computer(serve) -> None:
    """examples/server/implementations/boxed_reward.py adapts the legacy ``solution`` key."""
    import sys
    sys.path.insert(0, str(EXAMPLES))
    try:
        from implementations.boxed_reward import BoxedAnswerReward  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLES))
    url = serve(BoxedAnswerReward())
    assert isinstance(BoxedAnswerReward(), GraderRewardComputer)
    status, _, body = call(url, "/compute_reward", {"response": "\\boxed{5}", "extra_params": {"solution": "5"}})
    assert (status, body["score"]) == (200, 1.0)


# ---- hostile clients: deep JSON, slow headers, too many connections, other origins ---------------


@pytest.mark.parametrize("path", ["/compute_reward", "/api/v1", "/", "/get_reward", "/grade"])
def test_json_nested_too_deep_is_400_naming_the_limit(serve, path: str) -> None:
    url = serve(Recorder())
    status, _, body = call(url, path, raw=b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested deeper than 64 levels" in body["detail"], body
    status, _, body = call(url, path, raw=b'{"response": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}")
    assert status == 400 and "nested deeper than 64 levels" in body["detail"], body
    # brackets inside strings are text, not nesting
    status, _, body = call(url, "/compute_reward", {"response": "[" * 10_000, "extra_params": {"note": "{" * 10_000}})
    assert status == 200, body


def _slow_client(url: str, partial: bytes = b"POST /compute_reward HTT") -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)  # the timeout is only a safety net against a hang
    sock.sendall(partial)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Blocks until the server closes the connection (True); False when it is still open at the safety timeout."""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
            if data.startswith(b"HTTP/1.1 503"):
                continue
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def test_a_connection_that_never_finishes_its_headers_is_closed(serve) -> None:
    url = serve(Recorder(), {"server": {"header_timeout_s": 1}})
    slow = [_slow_client(url) for _ in range(30)]
    status, _, body = call(url, "/compute_reward", {"response": "r"})  # a well-behaved client is answered meanwhile
    assert status == 200 and body["status"] == "success"
    trickled = threading.Event()

    def trickle() -> None:  # one byte at a time: each byte must not restart the deadline
        sock = slow[0]
        try:
            for byte in b"P" * 600:
                sock.send(bytes([byte]))
                time.sleep(0.1)
        except OSError:
            trickled.set()

    helper = _slow_client(url, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    slow.append(helper)
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    assert all(_closed_by_server(s) for s in slow[1:]), "a slow client was never closed"
    thread.join(120)
    assert trickled.is_set(), "a client trickling one byte at a time kept its connection"


def test_past_max_connections_the_longest_waiting_idle_connection_makes_room(serve) -> None:
    url = serve(Recorder(), {"server": {"header_timeout_s": 600, "max_connections": 20}})
    slow = []
    for _ in range(30):  # one at a time: accepted together, their order at the server is not the order they connected in
        slow.append(_slow_client(url))
        time.sleep(0.05)
    for sock in slow[:10]:  # the ten that waited longest are closed to make room (the header deadline is far away)
        assert _closed_by_server(sock)
    status, _, body = call(url, "/compute_reward", {"response": "r"})  # a newcomer is answered while 20 slow ones are held
    assert status == 200 and body["status"] == "success"
    for sock in slow[10:]:
        sock.close()


def test_no_cors_headers_and_any_host_is_served(serve) -> None:
    """The reward server may be bound on 0.0.0.0 behind any name (Cloud Run), so it checks no Host; it grants no
    cross-origin reads either: a browser page elsewhere cannot read its answers."""
    url = serve(Recorder())
    for method, path in (("GET", "/health"), ("POST", "/compute_reward"), ("OPTIONS", "/compute_reward")):
        status, headers, _ = call(url, path, {"response": "r"} if method == "POST" else None, method=method,
                                  headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                                           "Host": "reward.internal.example"})
        assert status in (200, 405), (method, path, status)
        assert not [h for h in headers if h.lower().startswith("access-control-")], (method, path, dict(headers))


def test_a_missing_reference_is_each_contracts_own_invalid_answer(serve) -> None:
    """Decided per contract (docs/server.md): DashScope's own server (dashscope-sdk-python's server.py) is 422 only
    when its parser rejects the body, and ``ground_truth`` may be null there, so a sample the grader cannot grade is
    the processor's 200 ``status: failed`` (retried or dropped) -- or success 0 under ``reward.invalid: zero``;
    seed 001 likewise answers 200 ``status: fail``; Vertex and OpenRLHF have no failure field: 422 naming the field."""
    url = serve(load_grader(MATCH))
    assistant = {"role": "assistant", "content": "<answer>5</answer>"}
    named = "no references key 'answer'"
    status, _, body = call(url, "/compute_reward", {"response": "<answer>5</answer>"})
    assert status == 200 and body["status"] == "fail" and named in body["detail"]
    status, _, body = call(url, "/api/v1", {"func_type": "reward", "agent_output": {"messages": [assistant]}})
    assert status == 200 and body["status"] == "failed" and named in body["error"]
    status, _, body = call(url, "/api/v1", {"func_type": "group_reward", "ground_truth": None, "agent_outputs": [{"messages": [assistant]}]})
    assert status == 200 and body["status"] == "failed" and body["error"].startswith("agent_outputs[0]: ") and named in body["error"]
    status, _, body = call(url, "/", {"example": {"contents": [{"role": "user", "parts": [{"text": "2+3?"}]}]},
                                      "response": {"role": "model", "parts": [{"text": "<answer>5</answer>"}]}})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "example"] and named in body["detail"][0]["msg"]
    status, _, body = call(url, "/get_reward", {"query": ["2+3? <answer>5</answer>"], "prompts": ["2+3?"]})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "labels"] and named in body["detail"][0]["msg"]
    zero = serve(load_grader(MATCH), {"reward": {"grader": "unused.yaml", "invalid": "zero"}})
    status, _, body = call(zero, "/api/v1", {"func_type": "reward", "agent_output": {"messages": [assistant]}})
    assert status == 200 and body["status"] == "success" and body["reward"]["reward_score"] == 0.0
