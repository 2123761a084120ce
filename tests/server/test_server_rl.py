"""The reward server's doors for slime/miles (POST /slime) and NeMo Gym / NeMo-RL (POST /verify), its
group routes under the group keys (a member that never answers, too few finished), and GET /metrics
on a real ``gradekit serve`` subprocess under load."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml
from openai.types.responses import Response

from gradekit.graders.server._metrics import safe_endpoint
from gradekit.judge.testing import FakeProvider

from ..conftest import serve_in
from .test_server import call, judge_grader, serve  # noqa: F401  (serve is a fixture)
from ..platforms.test_trainers_2026 import responder  # the reference judge; FAIL unparseable, HANG never answered


# ---- slime / miles: remote_rm, verbatim from THUDM/slime 624b824 slime/rollout/rm_hub/__init__.py ---------


async def remote_rm(args, sample, max_retries: int = 10):
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
    connector = aiohttp.TCPConnector(limit=64, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        for attempt in range(max_retries):
            try:
                async with session.post(args.rm_url, json=payload) as resp:
                    resp.raise_for_status()
                    return await resp.json()
            except Exception:
                if attempt + 1 >= max_retries:
                    raise
                await asyncio.sleep(min(2**attempt, 30) + random.random())


def test_slime_remote_rm_gets_a_number_and_a_failure_is_non_2xx(fake: FakeProvider, serve) -> None:
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1))
    args = SimpleNamespace(rm_url=url + "/slime")

    def sample(response: str, label: Any = "Paris", prompt: Any = "Capital of France?") -> Any:
        return SimpleNamespace(prompt=prompt, response=response, label=label)

    assert asyncio.run(remote_rm(args, sample("Paris"), max_retries=1)) == 1.0
    assert asyncio.run(remote_rm(args, sample("Lyon"), max_retries=1)) == 0.0
    chat = [{"role": "user", "content": "Capital of France?"}]
    assert asyncio.run(remote_rm(args, sample("Paris", label='{"answer": "Paris"}', prompt=chat), max_retries=1)) == 1.0
    # A judge failure: 502, which remote_rm's raise_for_status turns into an exception (slime retries,
    # then fails the step; it has no mask on this path). Never a 200 with 0.
    with pytest.raises(aiohttp.ClientResponseError) as failed:
        asyncio.run(remote_rm(args, sample("FAIL"), max_retries=1))
    assert failed.value.status == 502
    status, _, body = call(url, "/slime", {"prompt": "Capital of France?", "response": "FAIL", "label": "Paris"})
    assert status == 502 and body["status"] == "fail" and "parse_failure" in body["error"]
    status, _, body = call(url, "/slime", {"prompt": "Capital of France?", "response": "Paris", "label": None})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "label"]


def test_slime_with_a_hung_judge_fails_each_try_at_request_timeout_s(fake: FakeProvider, serve) -> None:
    """slime's shared session waits up to 120 s a try (ClientTimeout(total=120)) and tries 10 times: with
    server.request_timeout_s below that, each try of a hung reward ends at the server's 504 instead."""
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1), {"server": {"request_timeout_s": 1.0}})
    args = SimpleNamespace(rm_url=url + "/slime")
    started = time.monotonic()
    with pytest.raises(aiohttp.ClientResponseError) as failed:
        asyncio.run(remote_rm(args, SimpleNamespace(prompt="Capital of France?", response="HANG", label="Paris"), max_retries=2))
    assert failed.value.status == 504 and time.monotonic() - started < 2 * 1.0 + 2.0 + 5.0  # two tries and one backoff


# ---- OpenRLHF 0.11.2: the agent executor's client, one query per request --------------------------------
# Copied from openrlhf 0.11.2 (PyPI wheel) openrlhf/utils/agent.py: SingleTurnAgentExecutor._fetch_rewards_via_http
# (ClientTimeout(total=180), try_max_times=5 one second apart, then RuntimeError) and execute()'s reward block,
# which catches that error, logs it and leaves the sample's reward None (the experience maker then fails the step).


async def openrlhf_fetch_rewards_via_http(endpoints: list[str], queries_list, prompts_list, labels_list, try_max_times: int = 5):
    num_servers = len(endpoints)
    batch_size = (len(queries_list) + num_servers - 1) // num_servers
    timeout = aiohttp.ClientTimeout(total=180)
    tasks = []
    for i in range(num_servers):
        start_idx = i * batch_size
        if start_idx >= len(queries_list):
            break
        rm = endpoints[i]
        end_idx = min((i + 1) * batch_size, len(queries_list))
        payload = {"query": queries_list[start_idx:end_idx], "prompts": prompts_list[start_idx:end_idx],
                   "labels": labels_list[start_idx:end_idx]}

        async def _post_request(url, data, try_max_times=try_max_times):
            for _ in range(try_max_times):
                try:
                    async with aiohttp.ClientSession(timeout=timeout) as session:
                        async with session.post(url, json=data) as response:
                            response.raise_for_status()
                            return await response.json()
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(1)
            raise RuntimeError(f"Request error for {try_max_times} times, returning None. Please check the API server.")

        tasks.append(asyncio.create_task(_post_request(rm, payload)))
    return await asyncio.gather(*tasks)


async def openrlhf_execute_reward(url: str, query: str, prompt: str, label: str) -> dict:
    output = {"reward": None, "scores": None, "extra_logs": {}}
    try:
        rewards_info_list = await openrlhf_fetch_rewards_via_http([url], [query], [prompt], [label], try_max_times=2)
        rewards_info = rewards_info_list[0] if rewards_info_list else None
        if rewards_info:
            score_value = rewards_info.get("scores")
            if score_value is None:
                score_value = rewards_info.get("rewards")
            output.update(reward=rewards_info.get("rewards"), scores=score_value, extra_logs=rewards_info.get("extra_logs") or {})
    except Exception:
        pass  # logger.info(...) in OpenRLHF: the sample keeps reward None
    return output


def test_openrlhf_0_11_client_sends_one_query_and_a_failure_leaves_no_reward(fake: FakeProvider, serve) -> None:
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1)) + "/get_reward"
    ok = asyncio.run(openrlhf_execute_reward(url, "France? Paris<|im_end|>", "France?", "Paris"))
    assert ok["reward"] == [1.0] and ok["scores"] == [1.0]
    bodies = [r for r in fake.chat_requests()]
    assert len(bodies) == 1, "one query per request: the server's prompt groups never see a group from this client"
    failed = asyncio.run(openrlhf_execute_reward(url, "France? FAIL", "France?", "Paris"))
    assert failed["reward"] is None, "502 on every try: no reward reaches OpenRLHF, which then fails the step; never a 0"


# ---- NeMo Gym: BaseVerifyRequest -> BaseVerifyResponse (NVIDIA-NeMo/Gym 07d6b0d) ----------------------


def verify_body(text: str, **row: Any) -> dict[str, Any]:
    """What Gym's rollout collection posts to a resources server: the row (resources_servers/math_with_judge
    data/example.jsonl shape) plus the policy's Response, built with the openai SDK's own Response type."""
    response = Response.model_validate({
        "id": "resp_1", "created_at": 0, "model": "policy", "object": "response", "parallel_tool_calls": False,
        "tool_choice": "auto", "tools": [],
        "output": [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "the answer is probably London"}]},
                   {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}]})
    return {"responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]},
            "response": response.model_dump(mode="json"), "question": "Capital of France?", "expected_answer": "Paris", **row}


def nemo_rl_mask_sample(full_result: dict) -> bool:
    """NVIDIA-NeMo/RL 7ea279a nemo_rl/experience/rollouts.py _extract_mask_sample_flags, for one result."""
    return bool((full_result.get("instance_config") or {}).get("mask_sample", False))


def gym_routes_to_sidecar(result: dict) -> bool:
    """Gym's rollout_collection: a result with _ng_failure_class goes to <output>_failures.jsonl."""
    return result.get("_ng_failure_class") is not None


def test_nemo_gym_verify_echoes_the_request_with_a_reward_and_fails_through_gyms_markers(fake: FakeProvider, serve) -> None:
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1))
    body = verify_body("Paris")
    status, _, reply = call(url, "/verify", body)
    assert status == 200 and reply["reward"] == 1.0
    assert {k: reply[k] for k in body} == body, "BaseVerifyResponse is the request plus reward"
    assert not gym_routes_to_sidecar(reply) and not nemo_rl_mask_sample(reply)
    judged = fake.chat_requests()[-1].body
    assert "Paris" in json.dumps(judged) and "London" not in json.dumps(judged), "the policy's reasoning item never reaches the judge"
    status, _, reply = call(url, "/verify", verify_body("Lyon"))
    assert status == 200 and reply["reward"] == 0.0 and not gym_routes_to_sidecar(reply)

    # A judge failure: Gym's own judge_failsafe row -- 200, reward 0.0 beside the marker that counts.
    status, _, reply = call(url, "/verify", verify_body("FAIL", instance_config={"seed": 7}))
    assert status == 200 and reply["reward"] == 0.0
    assert reply["_ng_failure_class"] == "judge_failed" and "parse_failure" in reply["_ng_failure_judge_error"]
    assert gym_routes_to_sidecar(reply), "routed to the failures sidecar, out of the aggregate metrics"
    assert nemo_rl_mask_sample(reply) and reply["mask_sample"] is True, "NeMo-RL drops it from the loss"
    assert reply["instance_config"] == {"seed": 7, "mask_sample": True}
    # A sample that can never be graded (no reference): skipped and terminal, never retried.
    bare = verify_body("Paris")
    del bare["expected_answer"]
    status, _, reply = call(url, "/verify", bare)
    assert status == 200 and reply["_ng_failure_class"] == "skipped" and reply["_ng_failure_terminal"] is True
    status, _, reply = call(url, "/verify", {"response": {}})
    assert status == 422 and reply["detail"][0]["loc"] == ["body", "responses_create_params"]


# ---- NeMo Gym's own client path: the simple agent's verify call and rollout collection -----------------
# Copied from NVIDIA-NeMo/Gym 07d6b0d: nemo_gym/server_utils.py (raise_for_status, get_response_json; the
# global aiohttp client has ClientTimeout(), no deadline), responses_api_agents/simple_agent/app.py (the
# verify call inside /run), nemo_gym/rollout_collection.py (_post_subroutine; a result with
# _ng_failure_class goes to the failures sidecar, any other to the main jsonl).


async def gym_raise_for_status(response: aiohttp.ClientResponse) -> None:
    if not response.ok:
        content = await response.content.read()
        try:
            response.raise_for_status()
        except aiohttp.ClientResponseError as e:
            e.response_content = content  # type: ignore[attr-defined]
            raise e


async def gym_get_response_json(response: aiohttp.ClientResponse) -> Any:
    return json.loads(await response.read())


def gym_agent_app(verify_url: str) -> Any:
    """The simple agent's /run after the model call: post the row plus the Response to the resources
    server's /verify, raise_for_status, return the result (an exception is FastAPI's 500)."""
    from fastapi import Body, FastAPI

    app = FastAPI()

    @app.post("/run")
    async def run(body: dict = Body()) -> dict:  # noqa: B008 (FastAPI's own idiom, as Gym writes it)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session:  # on the agent's own loop
            verify_response = await session.post(verify_url, json=body)
            await gym_raise_for_status(verify_response)
            return await gym_get_response_json(verify_response)

    return app


async def gym_collect(run_url: str, rows: list[dict], folder: Path) -> tuple[list[dict], list[dict]]:
    """rollout_collection: _post_subroutine per row (raise_for_status re-raises a failed /run, which
    stops the collection), then the routing rule: failures to <output>_failures.jsonl."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout()) as session:
        async def _post_subroutine(row: dict) -> tuple[dict, dict]:
            res = await session.post(run_url, json=row)
            await gym_raise_for_status(res)
            return row, await gym_get_response_json(res)

        main, failures = [], []
        with open(folder / "rollouts.jsonl", "wb") as results_file, open(folder / "rollouts_failures.jsonl", "wb") as failures_file:
            for future in asyncio.as_completed([_post_subroutine(row) for row in rows]):
                _row, result = await future
                if result.get("_ng_failure_class") is not None:
                    failures_file.write(json.dumps(result).encode() + b"\n")
                    failures.append(result)
                else:
                    results_file.write(json.dumps(result).encode() + b"\n")
                    main.append(result)
    return main, failures


@pytest.fixture
def serve_app():
    """Any ASGI app on a loopback port (Gym's agent server here); stopped at teardown."""
    from gradekit.graders.server import RewardServer

    servers = []

    def start(app: Any) -> str:
        servers.append(RewardServer(app, port=0, log_level="warning").start())
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()


def test_a_hung_judge_reaches_gyms_collection_as_a_transient_row_before_the_servers_timeout(fake: FakeProvider, serve, serve_app,
                                                                                          tmp_path: Path) -> None:
    from gradekit.graders.server._nemo_gym import verify_deadline_s

    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1), {"server": {"request_timeout_s": 2.0}})
    agent = serve_app(gym_agent_app(url + "/verify"))
    rows = [verify_body("Paris"), verify_body("HANG"), verify_body("FAIL"), verify_body("Lyon")]
    started = time.monotonic()
    main, failures = asyncio.run(gym_collect(agent + "/run", rows, tmp_path))
    assert time.monotonic() - started < 2.0 + 5.0, "the hung row ended at the row's deadline, not the judge's"
    assert sorted(r["reward"] for r in main) == [0.0, 1.0], "the collection went on past the hung judge"
    by_class = {r["_ng_failure_class"]: r for r in failures}
    assert set(by_class) == {"transient", "judge_failed"}
    hung = by_class["transient"]
    assert hung["mask_sample"] is True and hung["instance_config"]["mask_sample"] is True and nemo_rl_mask_sample(hung)
    assert f"not graded within {verify_deadline_s(2.0):g} s" in hung["_ng_failure_judge_error"]
    assert len((tmp_path / "rollouts_failures.jsonl").read_text().splitlines()) == 2
    assert verify_deadline_s(120) == 115 and verify_deadline_s(2.0) == pytest.approx(1.8) and verify_deadline_s(0.5) < 0.5


def test_verify_answers_a_row_for_a_raising_computer_and_for_a_full_server(serve) -> None:
    import threading

    from gradekit.graders.server import BaseRewardComputer, RewardResponse

    release = threading.Event()

    class Flaky(BaseRewardComputer):
        async def compute_reward(self, request):  # type: ignore[override]
            if "boom" in request.response:
                raise KeyError("answer")
            if "wait" in request.response:
                await asyncio.to_thread(release.wait, 30)
            return RewardResponse(score=1.0, status="success")

    url = serve(Flaky(), {"thread_pool": {"max_workers": 1, "queue_size": 0}})
    status, _, reply = call(url, "/verify", verify_body("boom"))
    assert status == 200 and reply["_ng_failure_class"] == "reward_failed" and "KeyError" in reply["_ng_failure_judge_error"]
    status, _, reply = call(url, "/verify", verify_body("boom", instance_config="seed-7"))  # a row's odd instance_config: still a row
    assert status == 200 and reply["mask_sample"] is True and reply["instance_config"] == "seed-7"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(call, url, "/verify", verify_body("wait"))
        try:
            deadline = time.monotonic() + 30
            while call(url, "/health")[2]["in_flight"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            status, _, reply = call(url, "/verify", verify_body("Paris"))
            assert status == 200 and reply["_ng_failure_class"] == "transient" and "busy" in reply["_ng_failure_judge_error"]
            assert reply["reward"] == 0.0 and reply["mask_sample"] is True
            status, headers, _ = call(url, "/compute_reward", {"response": "x"})
            assert status == 503 and headers["Retry-After"] == "1", "other routes keep their 503"
        finally:
            release.set()
        assert held.result(timeout=30)[2]["reward"] == 1.0


@pytest.mark.parametrize("where, value", [
    pytest.param(("responses_create_params", "input"), 5, id="input_a_number"),
    pytest.param(("responses_create_params", "input"), {"role": "user"}, id="input_an_object"),
    pytest.param(("response", "output"), 7, id="output_a_number"),
])
def test_nemo_gym_verify_with_a_field_of_the_wrong_type_is_a_422_naming_it(fake: FakeProvider, serve, where, value) -> None:
    """Issue 48: a number as responses_create_params.input was a 500 with Python's TypeError text; the other routes answer 422."""
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1))
    body = verify_body("Paris")
    body[where[0]] = {**body[where[0]], where[1]: value}
    status, _, reply = call(url, "/verify", body)
    assert status == 422, reply
    assert reply["detail"][0]["loc"] == ["body", *where] and "TypeError" not in json.dumps(reply), reply
    assert not fake.chat_requests()


# ---- group routes: deadlines and too few finished ---------------------------------------------------


def test_dashscope_group_with_a_member_hanging_forever_is_decided_by_the_deadline(fake: FakeProvider, serve) -> None:
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1), {"group": {"group_deadline_s": 1.0, "min_members": 2}})

    def out(text: str) -> dict:
        return {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": text}]}

    group = {"func_type": "group_reward", "ground_truth": {"answer": "Paris"}, "agent_outputs": [out("Paris"), out("HANG"), out("Lyon")]}
    started = time.monotonic()
    status, _, body = call(url, "/api/v1", group)
    assert time.monotonic() - started < 1.0 + 2.0
    assert status == 200 and body["status"] == "success"
    rewards = body["reward"]["rewards"]
    assert [r["reward_score"] for r in rewards] == [1.0, 0.5, 0.0]
    assert [r["reward_metrics"]["member_failed"] for r in rewards] == [0.0, 1.0, 0.0]
    started = time.monotonic()
    status, _, body = call(url, "/api/v1", {**group, "agent_outputs": [out("Paris"), out("HANG"), out("HANG too")]})
    assert time.monotonic() - started < 1.0 + 2.0
    assert status == 200 and body["status"] == "failed" and body["reward"]["rewards"] == []
    assert "group_deadline_s" in body["error"]


def test_a_member_cut_by_group_deadline_s_is_counted_as_timeout_in_metrics(fake: FakeProvider, serve) -> None:
    """Issue 48: GET /metrics counted it as status="exception", as if the grader had raised."""
    import urllib.request

    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1), {"group": {"group_deadline_s": 1.0, "min_members": 2}})
    out = lambda text: {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": text}]}  # noqa: E731
    status, _, body = call(url, "/api/v1", {"func_type": "group_reward", "ground_truth": {"answer": "Paris"},
                                            "agent_outputs": [out("Paris"), out("HANG"), out("Lyon")]})
    assert status == 200 and body["status"] == "success"
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    rewards = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("gradekit_rewards_total{")}
    assert rewards.get('gradekit_rewards_total{error_kind="timeout",status="timeout"}') == 1.0, rewards
    assert not any('status="exception"' in name for name in rewards), rewards


def test_openrlhf_batch_is_decided_per_prompt_group(fake: FakeProvider, serve) -> None:
    fake.set_responder(responder)
    url = serve(judge_grader(fake, attempts=1))
    batch = {"query": ["France? Paris", "France? FAIL", "France? Paris", "Italy? Rome", "Italy? Milan"],
             "prompts": ["France?", "France?", "France?", "Italy?", "Italy?"],
             "labels": ["Paris", "Paris", "Paris", "Rome", "Rome"]}
    status, _, body = call(url, "/get_reward", batch)
    assert status == 200 and body["rewards"] == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert body["extra_logs"]["member_failed"] == [0.0, 1.0, 0.0, 0.0, 0.0]
    # The Italy group of two with one failed member has fewer than min_members (2) finished: the
    # batch is a 502 naming it (OpenRLHF retries, then fails the step), not a made-up score.
    status, _, body = call(url, "/get_reward", {**batch, "query": [*batch["query"][:4], "Italy? FAIL"]})
    assert status == 502 and [f["item"] for f in body["failures"]] == ["query[4]"]


# ---- GET /metrics on a serving subprocess --------------------------------------------------------


def families(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items() if (k == name or k.startswith(name + "{")) and all(w in k for w in want))


def test_metrics_on_a_serving_process_exist_and_move_under_load(fake: FakeProvider, tmp_path: Path) -> None:
    fake.set_responder(responder)
    (tmp_path / "grader.yaml").write_text(yaml.safe_dump({"type": "llm", "rubric": "semantic_equivalence_en",
        "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 60}}), encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  grader: grader.yaml\n", encoding="utf-8")
    secret = "sk-gradekit-test-secret-4242"
    proc, url = serve_in(tmp_path, OPENAI_API_KEY=secret)
    try:
        status, headers, _ = call(url, "/health")
        before = urllib_text(url + "/metrics")
        for family in ("gradekit_requests_total", "gradekit_request_seconds_bucket", "gradekit_rewards_total",
                       "gradekit_reward_seconds_bucket", "gradekit_judge_requests_total", "gradekit_limiter_wait_seconds_total",
                       "gradekit_breaker_state", "gradekit_hedges_sent_total", "gradekit_hedges_won_total", "gradekit_in_flight"):
            assert f"# TYPE {family.removesuffix('_bucket').removesuffix('_total')}" in before, family
        bodies = [{"prompt": "Capital of France?", "response": r, "extra_params": {"answer": "Paris", "sample_id": f"s{i}"}}
                  for i, r in enumerate(["Paris", "Lyon", "FAIL"] * 10)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda b: call(url, "/compute_reward", b), bodies))
            results += list(pool.map(lambda b: call(url, "/slime", {"prompt": "Capital of France?", "response": "Paris", "label": "Paris"}),
                                     range(5)))
        assert [s for s, _, _ in results].count(200) == 35
        after = families(urllib_text(url + "/metrics"))
        assert total(after, "gradekit_requests_total", route="/compute_reward", status="200") == 30
        assert total(after, "gradekit_requests_total", route="/slime", status="200") == 5
        assert total(after, "gradekit_request_seconds_count", route="/compute_reward") == 30
        assert total(after, "gradekit_rewards_total", status="success", error_kind="none") == 25
        assert total(after, "gradekit_rewards_total", status="fail", error_kind="parse_failure") == 10
        assert total(after, "gradekit_reward_seconds_count") == 35
        endpoint = safe_endpoint(fake.base_url)
        assert total(after, "gradekit_judge_requests_total", endpoint=endpoint, outcome="ok") >= 35
        assert total(after, "gradekit_breaker_state", endpoint=endpoint) == 0.0
        assert total(after, "gradekit_hedges_sent_total") == 0.0
        text = urllib_text(url + "/metrics")
        assert secret not in text and "api_key" not in text
        stats = call(url, "/stats")[2]
        assert stats["rewards"] == 35 and stats["reward_seconds_p50"] <= stats["reward_seconds_p99"]
        assert len(stats["slowest"]) == 10 and all(s["seconds"] >= 0 for s in stats["slowest"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert safe_endpoint("https://user:pa55@judge.example:8443/v1?key=abc#x") == "https://judge.example:8443/v1"


def urllib_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def test_each_route_of_the_app_labels_its_requests_and_any_other_path_is_other(serve) -> None:
    from gradekit.graders import BaseRewardComputer
    from gradekit.graders.server._app import REWARD_ROUTES
    from gradekit.graders.server._metrics import BUCKETS

    class Length(BaseRewardComputer):
        def compute_reward(self, request):
            return self.success_response(float(len(request.response or "")))

    url = serve(Length())
    for path in sorted(REWARD_ROUTES) + ["/health", "/no/such/route", "/wp-login.php"]:
        try:
            call(url, path, {})
        except Exception:  # noqa: BLE001 - only the count matters here
            pass
    labels = {k.split('route="', 1)[1].split('"', 1)[0] for k in families(urllib_text(url + "/metrics"))
              if k.startswith("gradekit_requests_total{")}
    assert labels == {*REWARD_ROUTES, "/health", "other"}, labels
    assert BUCKETS[-1] == float("inf") and all(re.fullmatch(r"/[a-z_/0-9]*", r) for r in labels - {"other"})


def test_a_type_group_reward_grader_brings_its_group_keys_to_the_server(fake: FakeProvider, tmp_path: Path, serve) -> None:
    from gradekit.graders.server import build_computer, load_server_config

    fake.set_responder(responder)
    (tmp_path / "group.yaml").write_text(yaml.safe_dump({
        "type": "group", "on_member_error": "renormalize", "min_members": 2, "group_deadline_s": 1.0,
        "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 600},
        "grader": {"type": "llm", "rubric": "semantic_equivalence_en"}}), encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  grader: group.yaml\n", encoding="utf-8")
    cfg = load_server_config(tmp_path / "config.yaml")
    computer = build_computer(cfg)
    assert cfg.group.group_deadline_s == 1.0 and cfg.group.min_members == 2
    url = serve(computer, cfg)

    def out(text: str) -> dict:
        return {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": text}]}

    started = time.monotonic()
    status, _, body = call(url, "/api/v1", {"func_type": "group_reward", "ground_truth": "Paris",
                                            "agent_outputs": [out("Paris"), out("HANG"), out("Paris")]})
    assert time.monotonic() - started < 3.0
    assert status == 200 and body["status"] == "success"
    assert [r["reward_metrics"]["member_failed"] for r in body["reward"]["rewards"]] == [0.0, 1.0, 0.0]
    status, _, body = call(url, "/compute_reward", {"prompt": "Capital of France?", "response": "Paris", "extra_params": {"answer": "Paris"}})
    assert status == 200 and body["score"] == 1.0, "the group file's grader: node grades each member"
