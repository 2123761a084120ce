"""Issue 17: each platform called the way its own code calls gradekit, one test per defect.

Ark's seed harness (``asyncio.run`` per sample), OpenRLHF's templated ``query``/``prompts``/
``labels``, DashScope's plain ground truth, TRL's pre-0.27 synchronous call, a Bailian seed-001
user file served unchanged, and the OpenAI export's score range.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gradekit.graders.platforms import ark_group_grader
from gradekit.graders.platforms._ark import ArkTrajectory, ChatCompletionSample, PluginStatus
from gradekit.judge.testing import FakeProvider

from ..cases import cases
from ..conftest import need, reference_judge

ROOT = Path(__file__).resolve().parents[2]

# ---- defect 1: Ark's harness calls the plugin with asyncio.run(...) per sample -----------------------

# Seed 000's main(): a ChatCompletionSample and two Trajectory objects, context {}, asyncio.run.
SEED_SAMPLE = {"messages": [{"role": "user", "content": "Which two companies grew?"}], "thinking": {"type": "enabled"},
               "extra": {"answer": "Jingli and Xinqin"}}
SEED_TRAJECTORIES = [
    {"messages": [{"role": "assistant", "content": "It was Jingli and Xinqin, together."}], "finish_reason": "stop", "usage": {}},
    {"messages": [{"role": "assistant", "content": "Jingli"}], "finish_reason": "stop", "usage": {}},
]


def seed_main(llm_grader: Any) -> Any:
    """Seed 000's ``main()``, verbatim in shape: build the objects, then ``asyncio.run`` the plugin."""
    sample = ChatCompletionSample(**SEED_SAMPLE)
    trajectories = [ArkTrajectory(**t) for t in SEED_TRAJECTORIES]
    return asyncio.run(llm_grader({}, sample, trajectories))


def test_ark_seed_harness_five_times_in_one_process_all_succeed(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the second asyncio.run answered RETRY "Event loop is closed" (the judge's client
    stayed bound to the first loop). After: every call from a new loop is SUCCESS."""
    fake.set_responder(reference_judge)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    plugin = ark_group_grader({"type": "llm", "rubric": "semantic_equivalence_en",
                               "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 10}}, name="llm_group_grader")
    results = [seed_main(plugin) for _ in range(5)]
    assert [r.status for r in results] == [PluginStatus.SUCCESS] * 5, [r.error for r in results]
    assert [r.rewards for r in results] == [[1.0, 0.0]] * 5


# ---- the reward server, called as OpenRLHF, DashScope and a Bailian user's file call it ---------------

ANSWER_MATCH = {"type": "string_match", "expression": "{{references.answer}}", "operation": "EXACT_MATCH", "correct": 1, "wrong": 0}


def post(url: str, path: str, body: Any = None, *, raw: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30) -> tuple[int, Any]:
    """(status, parsed JSON) of one POST with urllib; non-2xx answers are returned, not raised."""
    import urllib.error
    import urllib.request

    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


# What OpenRLHF's SingleTurnExecutor sends for a Qwen (ChatML) policy: the query is
# decode(prompt + response tokens, skip_special_tokens=False), the prompt is the templated text, the
# label is the dataset's --label_key field (openrlhf/utils/agent.py, commit 3c3be62).
QWEN_PROMPT = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"


def test_openrlhf_plain_label_reaches_references_answer_and_the_end_token_is_cut(serve) -> None:
    """Before: the label was only references.label, so {{references.answer}} failed (502, which
    OpenRLHF retries 5 times and then fails the step), and the response kept <|im_end|>. After: 200."""
    from gradekit.graders import load_grader

    url = serve(load_grader(ANSWER_MATCH))
    body = {"query": [QWEN_PROMPT + "5<|im_end|>", QWEN_PROMPT + "6<|im_end|>\n<|endoftext|><|endoftext|>"],
            "prompts": [QWEN_PROMPT, QWEN_PROMPT], "labels": ["5", "5"]}
    status, reply = post(url, "/get_reward", body)
    assert status == 200, reply
    assert reply["rewards"] == [1.0, 0.0]


def test_openrlhf_templated_prompt_is_read_back_into_messages_and_end_tokens_are_configurable(serve) -> None:
    from gradekit.graders import Grade

    seen: list[Any] = []

    async def recorder(sample: Any) -> Grade:
        seen.append(sample)
        return Grade.scored(1.0)

    url = serve(recorder, {"openrlhf": {"end_tokens": ["<END>"]}})
    status, _ = post(url, "/get_reward", {"query": [QWEN_PROMPT + "five<END> <END>"], "prompts": [QWEN_PROMPT], "labels": ["5"]})
    assert status == 200
    sample = seen[0]
    assert sample.response_text == "five"
    assert [(m.role, m.content) for m in sample.messages] == [("system", "You are helpful."), ("user", "What is 2+3?")]
    assert sample.prompt_text == "What is 2+3?" and sample.metadata["templated_prompt"] == QWEN_PROMPT
    status, _ = post(url, "/get_reward", {"query": [QWEN_PROMPT + "five<|im_end|>"], "prompts": [QWEN_PROMPT], "labels": ["5"]})
    assert status == 200 and seen[1].response_text == "five<|im_end|>", "only the configured tokens are cut"


@pytest.mark.parametrize(("tokens", "expected"), cases("end_tokens"))
def test_end_tokens_of_the_common_templates(tokens: str, expected: str) -> None:
    from gradekit.graders.server._models import strip_end_tokens

    assert strip_end_tokens(tokens) == expected


def test_dashscope_plain_ground_truth_reaches_references_answer(serve) -> None:
    """Before: a plain ground_truth was only references.ground_truth: status failed. After: success."""
    from gradekit.graders import load_grader

    url = serve(load_grader(ANSWER_MATCH))
    body = {"func_type": "reward", "ground_truth": "Paris",
            "agent_output": {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}]}}
    status, reply = post(url, "/api/v1", body)
    assert status == 200 and reply["status"] == "success" and reply["reward"]["reward_score"] == 1.0, reply


def test_one_reference_rule_on_every_platform() -> None:
    """The mapping table's rows: a plain value is under the platform's name and ``answer``; a dict merges."""
    from gradekit.graders.platforms._common import reference_dict
    from gradekit.graders.platforms._verl import verl_references
    from gradekit.graders.server._dashscope import AgentOutput, dashscope_request
    from gradekit.graders.server._models import label_references

    assert label_references("5") == {"label": "5", "answer": "5"}
    assert label_references('{"answer": "5", "unit": "cm"}') == {"answer": "5", "unit": "cm"}
    assert verl_references("5") == {"ground_truth": "5", "answer": "5"}
    assert dashscope_request(AgentOutput(messages=[]), "5", None).extra_params == {"ground_truth": "5", "answer": "5"}
    assert dashscope_request(AgentOutput(messages=[], rollout_extra={"answer": "old"}), "5", None).extra_params["answer"] == "5"
    assert reference_dict(None, "label") == {}


# ---- defect 5: a seed-001 user file served unchanged -----------------------------------------------

SEED_001_CLASS = '''"""
自定义奖励计算实现示例
"""
from core.base_reward import BaseRewardComputer
from core.models import RewardRequest, RewardResponse


class CustomRewardComputer(BaseRewardComputer):
    def compute_reward(self, request: RewardRequest) -> RewardResponse:
        try:
            response_length = len(request.response)
            extra_params = request.extra_params
            if response_length > 100:
                score = 0.9
            elif response_length > 50:
                score = 0.7
            else:
                score = 0.5
            custom_param = extra_params.get('custom_param', 'default')
            return RewardResponse(
                score=score,
                status='success',
                extra_info={
                    'custom_logic': True,
                    'response_length': response_length,
                    'custom_param': custom_param
                }
            )
        except Exception as e:
            return RewardResponse(
                score=0.0,
                status='fail',
                detail=f'Error in custom compute_reward: {str(e)}'
            )

    def health_check(self) -> dict:
        return {
            'status': 'healthy',
            'message': 'Custom reward computer is healthy'
        }
'''


@pytest.mark.parametrize("class_path", ["implementations.custom_reward:CustomRewardComputer", "implementations/custom_reward.py:CustomRewardComputer"])
def test_bailian_seed_class_with_core_imports_is_served_unchanged(tmp_path: Path, serve, class_path: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ServerConfigError "No module named 'core'". After: served, and no ``core`` is left installed."""
    # The loader puts the config's folders on sys.path and imports ``implementations``: undo both,
    # so that other tests' ``implementations`` packages (examples/server) import their own.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "implementations").is_dir()])
    theirs = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "implementations"}
    for name in theirs:
        del sys.modules[name]
    try:
        serve_seed_class(tmp_path, serve, class_path)
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "implementations"]:
            del sys.modules[name]
        sys.modules.update(theirs)


def serve_seed_class(tmp_path: Path, serve: Any, class_path: str) -> None:
    from gradekit.graders.server import build_computer, load_server_config

    (tmp_path / "implementations").mkdir()
    (tmp_path / "implementations" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "implementations" / "custom_reward.py").write_text(SEED_001_CLASS, encoding="utf-8")
    (tmp_path / "configs").mkdir()
    config_file = tmp_path / "configs" / "config.yaml"
    config_file.write_text(f"server:\n  port: 8000\nreward:\n  class: \"{class_path}\"\n", encoding="utf-8")
    config = load_server_config(config_file)
    url = serve(build_computer(config), config)
    assert "core" not in sys.modules and "core.models" not in sys.modules
    status, reply = post(url, "/compute_reward", {"response": "x" * 60, "extra_params": {"custom_param": "p"}})
    assert status == 200 and reply["score"] == 0.7 and reply["extra_info"]["custom_param"] == "p"


def test_config_without_reward_class_serves_the_default_computer(tmp_path: Path, serve) -> None:
    from gradekit.graders.server import build_computer, load_server_config

    config_file = tmp_path / "config.yaml"
    # The seed's own file with the class line commented out.
    config_file.write_text("server:\n  port: 8000\nreward:\n  # class: \"implementations.default_reward:DefaultRewardComputer\"\n"
                           "logging:\n  enable: true\n", encoding="utf-8")
    config = load_server_config(config_file)
    url = serve(build_computer(config), config)
    assert post(url, "/compute_reward", {"response": " 5 ", "extra_params": {"answer": "5"}})[1]["score"] == 1.0
    assert post(url, "/compute_reward", {"response": "6", "extra_params": {"solution": "5"}})[1]["score"] == 0.0
    status, reply = post(url, "/compute_reward", {"response": "6", "extra_params": {}})
    assert status == 200 and reply["status"] == "fail" and "answer" in reply["detail"]


# ---- issue 11: the reward server holds under hostile clients ----------------------------------------


def raw_http(url: str, head: bytes, body_parts: list[bytes] = (), *, pause: threading.Event | None = None) -> tuple[int, bytes]:
    """Send a request by hand on a socket (a declared length, a body that stops coming) and read the answer."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in body_parts:
            sock.sendall(chunk)
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            more = sock.recv(65536)
            if not more:
                break
            data += more
        if pause is not None:
            pause.set()
        status = int(data.split(b" ", 2)[1])
        return status, data


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_oversized_body_is_413_before_it_is_read(serve) -> None:
    from gradekit.graders import load_grader

    url = serve(load_grader(ANSWER_MATCH), {"server": {"max_body_bytes": 1000}})
    # A declared 5 GB body: refused from its Content-Length, with not one byte of it sent.
    head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000000000\r\n\r\n"
    status, data = raw_http(url, head)
    assert status == 413 and b"server.max_body_bytes" in data
    # A chunked body with no length: refused once it passes the limit.
    chunk = json.dumps({"query": ["x" * 2000]}).encode()
    head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, _ = raw_http(url, head, [b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n"])
    assert status == 413
    assert post(url, "/get_reward", {"query": ["5"], "labels": ["5"]}) == (200, {"rewards": [1.0], "scores": [1.0], "extra_logs": {}})


def test_a_slow_body_is_408_and_holds_no_worker(serve) -> None:
    """One worker, no queue: a client that sends half a body and stalls must not take the only slot."""
    from gradekit.graders import load_grader

    url = serve(load_grader(ANSWER_MATCH), {"server": {"body_timeout_s": 1}, "thread_pool": {"max_workers": 1, "queue_size": 0}})
    body = json.dumps({"query": ["5"], "labels": ["5"]}).encode()
    head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    answered = threading.Event()
    result: dict[str, Any] = {}

    def slow_client() -> None:
        result["slow"] = raw_http(url, head, [body[:5]], pause=answered)

    thread = threading.Thread(target=slow_client)
    thread.start()
    try:
        # While the slow client stalls (before its 408), other requests are served: it holds no slot.
        while not answered.is_set():
            assert post(url, "/get_reward", {"query": ["5"], "labels": ["5"]})[0] == 200
            if answered.wait(0.05):
                break
    finally:
        thread.join(30)
    assert result["slow"][0] == 408 and b"server.body_timeout_s" in result["slow"][1]


def test_a_reward_not_ready_in_time_is_504_with_no_reward(serve) -> None:
    from gradekit.graders import Grade

    release = threading.Event()

    async def stuck(sample: Any) -> Grade:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return Grade.scored(1.0)

    url = serve(stuck, {"server": {"request_timeout_s": 0.5}})
    try:
        status, reply = post(url, "/get_reward", {"query": ["a"], "labels": ["a"]})
        assert status == 504 and "rewards" not in reply and "server.request_timeout_s" in reply["detail"]
        status, reply = post(url, "/", {"example": {"contents": [{"role": "user", "parts": [{"text": "q"}]}]},
                                         "response": {"parts": [{"text": "a"}]}})
        assert status == 504 and "reward" not in reply
    finally:
        release.set()


def test_get_reward_without_labels_for_a_grader_that_needs_them_is_422_naming_labels(serve) -> None:
    """Before: 502 (OpenRLHF retries it 5 times, then fails the step). After: 422 naming ``labels``."""
    from gradekit.graders import load_grader

    url = serve(load_grader(ANSWER_MATCH))
    status, reply = post(url, "/get_reward", {"query": ["Q? 5"], "prompts": ["Q? "]})
    assert status == 422 and reply["detail"][0]["loc"] == ["body", "labels"] and "answer" in reply["detail"][0]["msg"]


def test_a_prompt_over_max_prompt_tokens_is_an_input_error_and_sends_nothing(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradekit.graders import load_grader
    from gradekit.graders import Sample

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    fake.set_responder(reference_judge)
    grader = load_grader({"type": "llm", "rubric": "semantic_equivalence_en",
                          "judge": {"model": "fake-judge", "base_url": fake.base_url, "max_prompt_tokens": 2000}})

    async def grade(text: str) -> Any:
        return await grader(Sample(messages="Capital of France?", response=text, references={"answer": "Paris"}))

    huge = asyncio.run(grade("Paris " * 20_000))
    assert huge.status == "invalid" and "max_prompt_tokens" in huge.error
    assert fake.chat_requests() == []
    assert asyncio.run(grade("Paris")).score == 1.0


def test_serve_on_a_port_in_use_exits_3_with_one_line(tmp_path: Path) -> None:
    import socket

    config = tmp_path / "config.yaml"
    config.write_text("reward:\n  grader: g.yaml\n", encoding="utf-8")
    (tmp_path / "g.yaml").write_text(json.dumps(ANSWER_MATCH), encoding="utf-8")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "gradekit", "serve", "--config", str(config), "--port", str(port)],
                              capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: port {port} on 127.0.0.1 is already in use; stop what holds it or pass --port"]
    assert proc.stdout == ""
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    help_text = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200).output
    assert "3: the port is already in use" in " ".join(help_text.split())


# ---- defect 4: TRL before 0.27 calls reward functions synchronously ---------------------------------


def trl_0_26_calculate_rewards(reward_func: Any, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any]) -> list[float]:
    """GRPOTrainer._calculate_rewards of TRL v0.26.0 (trl/trainer/grpo_trainer.py), the callable
    branch, with torch.tensor replaced by a list of floats."""
    keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
    reward_kwargs["trainer_state"] = object()
    output_reward_func = reward_func(prompts=prompts, completions=completions, completion_ids=[[1, 2]] * len(prompts), **reward_kwargs)
    output_reward_func = [reward if reward is not None else float("nan") for reward in output_reward_func]
    return [float(r) for r in output_reward_func]


def test_trl_before_0_27_gets_a_plain_function_that_returns_rewards() -> None:
    """Before: TRL 0.26 iterated the coroutine ("'coroutine' object is not iterable"). After: rewards."""
    from gradekit.graders.platforms import trl_reward_func

    func = trl_reward_func(ANSWER_MATCH, sync=True)
    assert not asyncio.iscoroutinefunction(func)
    inputs = [{"prompt": "2+3?", "answer": "5"}, {"prompt": "2+2?", "answer": "4"}]
    assert trl_0_26_calculate_rewards(func, inputs, ["2+3?", "2+2?"], ["5", "5"]) == [1.0, 0.0]

    async def inside_a_running_loop() -> list[float]:  # e.g. a notebook, or an accelerate launcher with a loop
        return trl_0_26_calculate_rewards(func, inputs, ["2+3?", "2+2?"], ["5", "4"])

    assert asyncio.run(inside_a_running_loop()) == [1.0, 1.0]
    assert func.__name__ == "string_match"


# TRL 1.16.0 (PyPI wheel) trl/trainer/grpo_trainer.py GRPOTrainer._calculate_rewards, its async branch: a reward
# function is async when trl/trainer/utils.py is_async_callable says so; the async ones are gathered on TRL's own
# loop thread (asyncio.run_coroutine_threadsafe(..., self.async_loop).result()) and a None becomes NaN.


def trl_is_async_callable(func: Any) -> bool:
    import functools
    import inspect

    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(func.__call__)


def trl_1_16_calculate_rewards(reward_func: Any, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any],
                               async_loop: asyncio.AbstractEventLoop) -> list[float]:
    assert trl_is_async_callable(reward_func)
    keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
    reward_kwargs["trainer_state"] = object()

    async def _invoke_async(index: int, func: Any) -> tuple[int, list[float]]:
        output = await func(prompts=prompts, completions=completions, completion_ids=[[1, 2]] * len(prompts), **reward_kwargs)
        output = [r if r is not None else float("nan") for r in output]
        return index, output

    async def _run_async_funcs() -> list[tuple[int, list[float]]]:
        return await asyncio.gather(*[_invoke_async(0, reward_func)])

    return asyncio.run_coroutine_threadsafe(_run_async_funcs(), async_loop).result(timeout=60)[0][1]


def test_trl_1_16_gathers_the_async_reward_and_a_skipped_row_is_nan(fake: FakeProvider) -> None:
    import math

    from gradekit.graders.platforms import trl_reward_func

    def judge(body: dict) -> Any:
        from gradekit.judge.testing import Reply

        return Reply(content="I cannot tell.") if "FAIL" in body["messages"][-1]["content"] else reference_judge(body)

    fake.set_responder(judge)
    grader = {"type": "llm", "rubric": "semantic_equivalence_en",
              "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 30}}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)  # TRL's async_loop thread
    thread.start()
    try:
        inputs = [{"prompt": "Capital of France?", "answer": "Paris"}] * 3
        skipping = trl_reward_func(grader, sync=False, on_error=None)
        got = trl_1_16_calculate_rewards(skipping, inputs, ["Capital of France?"] * 3, ["Paris", "Lyon", "FAIL"], loop)
        assert got[:2] == [1.0, 0.0] and math.isnan(got[2]), "None -> NaN: TRL leaves the row out for this function"
        raising = trl_reward_func(grader, sync=False)
        with pytest.raises(Exception, match="parse_failure"):  # the default: training stops, never a 0
            trl_1_16_calculate_rewards(raising, inputs, ["Capital of France?"] * 3, ["Paris", "Lyon", "FAIL"], loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.mark.parametrize(("version", "sync"), [
    ("0.14.0", True), ("0.26.2", True), ("0.9.6", True), ("0.27.0", False), ("0.27.0.dev0", False), ("1.16.0", False), ("1.0.0rc1", False),
])
def test_trl_version_decides_sync(version: str, sync: bool) -> None:
    from gradekit.graders.platforms._trl import trl_calls_sync

    assert trl_calls_sync(version) is sync


def test_trl_default_follows_the_installed_trl() -> None:
    import importlib.metadata

    from gradekit.graders.platforms import trl_reward_func
    from gradekit.graders.platforms._trl import trl_calls_sync

    try:
        installed = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    func = trl_reward_func(ANSWER_MATCH)
    assert asyncio.iscoroutinefunction(func) is (installed is None or not trl_calls_sync(installed))


# ---- defect 6: gradekit export --to openai of a [-1, 1] grader ---------------------------------------

PY_SOURCE = "def grade(sample, item):\n    return 1.0 if sample['output_text'] == item['answer'] else 0.0\n"


@pytest.mark.parametrize(("config", "exported"), [
    pytest.param({"type": "python", "name": "p", "source": PY_SOURCE}, False, id="python_range_unknown"),
    pytest.param({"type": "python", "name": "p", "source": PY_SOURCE, "range": [-1, 1]}, False, id="python_declared_minus_one"),
    pytest.param({"type": "python", "name": "p", "source": PY_SOURCE, "range": [0, 1]}, True, id="python_declared_0_1"),
    pytest.param({"type": "formula", "name": "f", "formula": "a - b", "graders": {
        "a": {"type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}"},
        "b": {"type": "string_check", "input": "{{response}}", "reference": "{{references.other}}"}}}, False, id="formula_can_go_negative"),
    pytest.param({"type": "formula", "name": "f", "formula": "max(a, b) ^ 2", "graders": {
        "a": {"type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}"},
        "b": {"type": "string_match", "expression": "{{references.answer}}", "wrong": 0}}}, True, id="formula_bounded_in_0_1"),
    pytest.param({"type": "string_match", "expression": "{{references.answer}}"}, False, id="wrong_is_minus_one"),
])
def test_openai_export_refuses_a_range_not_known_in_0_1_without_rescale(tmp_path: Path, config: dict, exported: bool) -> None:
    """Before: a [-1, 1] python grader exported with exit 0. After: exit 2 naming --rescale; with it, exit 0."""
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    path = tmp_path / "grader.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    result = CliRunner().invoke(app, ["export", str(path), "--to", "openai"])
    if exported:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2 and "--rescale" in result.output, result.output
        assert CliRunner().invoke(app, ["export", str(path), "--to", "openai", "--rescale"]).exit_code == 0


# ---- Ark @single_grader: one trajectory in, one reward out ------------------------------------------


def test_ark_single_grader_one_trajectory_per_call_from_new_loops(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradekit.graders import ark_single_grader

    fake.set_responder(reference_judge)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    plugin = ark_single_grader({"type": "llm", "rubric": "semantic_equivalence_en",
                                "judge": {"model": "fake-judge", "base_url": fake.base_url}})
    assert list(__import__("inspect").signature(plugin).parameters) == ["context", "sample", "trajectory"]
    sample = ChatCompletionSample(**SEED_SAMPLE)
    results = [asyncio.run(plugin({}, sample, ArkTrajectory(**t))) for t in SEED_TRAJECTORIES]
    assert [(r.status, r.reward) for r in results] == [(PluginStatus.SUCCESS, 1.0), (PluginStatus.SUCCESS, 0.0)]
    preset = asyncio.run(plugin({}, sample, ArkTrajectory(**{**SEED_TRAJECTORIES[1], "extra": {"reward": -1}})))
    assert preset.reward == -1.0, "the rollout's preset reward wins, as in the group grader"
    discarded = asyncio.run(plugin({}, {**SEED_SAMPLE, "extra": {}}, SEED_TRAJECTORIES[0]))
    assert discarded.status == PluginStatus.DISCARD and discarded.reward == 0.0 and "references" in discarded.error


# ---- OpenAI label_model: load the JSON, run it locally, export it back ------------------------------

LABEL_MODEL = {
    "type": "label_model", "name": "sentiment", "model": "gpt-4o-2024-08-06",
    "input": [{"role": "developer", "content": "Classify the sentiment of the text as positive, neutral or negative."},
              {"role": "user", "content": "Statement: {{ sample.output_text }}\nTopic: {{ item.topic }}"}],
    "labels": ["positive", "neutral", "negative"], "passing_labels": ["positive", "neutral"],
}


def test_label_model_runs_locally_on_the_judge_and_exports_back(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gradekit.graders import export_openai_grader, load_grader
    from gradekit.graders import Sample

    need_sdk = need("openai.types.graders", "pip install 'openai>=1.78'")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")

    def judge(body: dict) -> Any:
        from gradekit.judge.testing import Reply

        user = body["messages"][-1]["content"]
        label = "negative" if "awful" in user else "positive"
        assert body["messages"][0]["role"] == "system" and "Classify" in body["messages"][0]["content"]
        assert body["response_format"]["json_schema"]["schema"]["properties"]["label"]["enum"] == LABEL_MODEL["labels"]
        return Reply(content=json.dumps({"label": label}))

    fake.set_responder(judge)
    grader = load_grader({**LABEL_MODEL, "judge": {"model": "fake-judge", "base_url": fake.base_url}})

    async def grade(text: str) -> Any:
        return await grader(Sample(response=text, references={"topic": "food"}))

    good, bad = asyncio.run(grade("lovely soup")), asyncio.run(grade("awful soup"))
    assert (good.score, good.status) == (1.0, "ok") and (bad.score, bad.status) == (0.0, "ok")
    missing = asyncio.run(grader(Sample(response="x", references={})))
    assert missing.status == "invalid" and "topic" in missing.error

    exported = export_openai_grader(LABEL_MODEL)
    assert exported == LABEL_MODEL, "loaded from OpenAI's JSON and exported back unchanged"
    need_sdk.LabelModelGrader.model_validate(exported)
    # ``gradekit validate`` runs OpenAI's JSON file as it is, on the judge's endpoint.
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    (tmp_path / "label_model.json").write_text(json.dumps(LABEL_MODEL), encoding="utf-8")
    (tmp_path / "example.json").write_text(json.dumps({"contents": [{"role": "user", "parts": [{"text": "Review it."}]}],
                                                       "references": {"topic": "food"}}), encoding="utf-8")
    (tmp_path / "response.txt").write_text("awful soup", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", "--grader", str(tmp_path / "label_model.json"), "--example", str(tmp_path / "example.json"),
                                      "--response", str(tmp_path / "response.txt"), "--json", "--base-url", fake.base_url,
                                      "--api-key", "k", "--model", "fake-judge"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reward"] == 0.0


# ---- OpenAI text_similarity: load, run locally, export back ------------------------------------------


@pytest.mark.parametrize(("metric", "got", "want", "expected"), [
    pytest.param("fuzzy_match", "kitten", "sitting", 2 * 4 / 13, id="fuzzy_indel_ratio"),
    pytest.param("fuzzy_match", "same", "same", 1.0, id="fuzzy_equal"),
    pytest.param("rouge_1", "The cat sat.", "the cat sat on the mat", 2 * 1.0 * 0.5 / 1.5, id="rouge1_f1"),
    pytest.param("rouge_2", "the cat sat", "the cat sat on the mat", 2 * 1.0 * 0.4 / 1.4, id="rouge2_f1"),
    pytest.param("rouge_l", "cat the sat", "the cat sat", 2 / 3, id="rougeL_lcs"),
    pytest.param("bleu", "the cat sat on the mat", "the cat sat on the mat", 1.0, id="bleu_identical"),
    pytest.param("bleu", "", "the cat", 0.0, id="bleu_empty"),
    pytest.param("gleu", "the cat sat", "the cat sat", 1.0, id="gleu_identical"),
    pytest.param("gleu", "a b", "c d", 0.0, id="gleu_disjoint"),
])
def test_text_similarity_metrics(metric: str, got: str, want: str, expected: float) -> None:
    from gradekit.graders._text_similarity import METRICS

    assert METRICS[metric](got, want) == pytest.approx(expected)


def test_text_similarity_from_openai_json_runs_and_exports_back() -> None:
    from gradekit.graders import export_openai_grader, load_grader
    from gradekit.graders import Sample

    config = {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}",
              "evaluation_metric": "rouge_l", "pass_threshold": 0.5}
    grader = load_grader(config)
    grade = asyncio.run(grader(Sample(response="the cat sat", references={"answer": "the cat sat on the mat"})))
    assert grade.status == "ok" and grade.score == pytest.approx(2 * 1.0 * 0.5 / 1.5) and grade.metrics["passed"] == 1.0
    assert asyncio.run(grader(Sample(response="x", references={}))).status == "invalid"
    exported = export_openai_grader(config)
    assert exported == {k: v for k, v in config.items() if k != "pass_threshold"}, "the grader type has no pass_threshold"
    sdk = need("openai.types.graders", "pip install 'openai>=1.78'")
    assert not sdk.TextSimilarityGrader.model_validate(exported).__pydantic_extra__
    with pytest.raises(Exception, match="unknown evaluation_metric 'rouge_6'"):
        load_grader({**config, "evaluation_metric": "rouge_6"})


# ---- the relative group judge: one call ranks all n trajectories ---------------------------------------


def ranking_judge(biased: bool = False):
    """Ranks the shown responses by the number each contains (higher is better); ``biased`` ranks
    them in the order shown instead, whatever they say: the worst case of position bias."""
    import re as _re

    from gradekit.judge.testing import Reply

    def respond(body: dict) -> Any:
        user = body["messages"][-1]["content"]
        shown = _re.findall(r'<response id="([A-Z])">\n(.*?)\n</response>', user, _re.S)
        if biased:
            order = [letter for letter, _ in shown]
        else:
            order = [letter for letter, _ in sorted(shown, key=lambda x: -int(_re.search(r"\d+", x[1]).group()))]
        return Reply(content=f"Compared them.\n<ranking>{' > '.join(order)}</ranking>")

    return respond


def relative_plugin(fake: FakeProvider, **relative: Any) -> Any:
    return ark_group_grader({"type": "group", "relative": relative, "judge": {"model": "fake-judge", "base_url": fake.base_url}})


def trajectories(*texts: str) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "assistant", "content": t}]} for t in texts]


def test_relative_judge_ranks_in_one_call_per_shuffle_and_maps_back(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    fake.set_responder(ranking_judge())
    result = asyncio.run(relative_plugin(fake)({}, SEED_SAMPLE, trajectories("score 3", "score 1", "score 2", "score 4")))
    assert result.status == PluginStatus.SUCCESS, result.error
    assert result.rewards == pytest.approx([1 / 3, -1.0, -1 / 3, 1.0])
    assert result.metrics["position_bias"] == 0.0 and result.metrics["shuffles"] == 2.0
    requests = fake.chat_requests()
    assert len(requests) == 2, "one judge call per shuffle"
    shown = [__import__("re").findall(r'<response id="[A-Z]">\n(.*?)\n</response>', r.body["messages"][-1]["content"]) for r in requests]
    assert sorted(shown[0]) == sorted(shown[1]) and shown[0] == shown[1][::-1], "the second shuffle shows the reverse order"
    again = asyncio.run(relative_plugin(fake)({}, SEED_SAMPLE, trajectories("score 3", "score 1", "score 2", "score 4")))
    assert again.rewards == result.rewards


def test_relative_judge_measures_position_bias(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    fake.set_responder(ranking_judge(biased=True))
    result = asyncio.run(relative_plugin(fake)({}, SEED_SAMPLE, trajectories("score 3", "score 1", "score 2")))
    # Each trajectory's two rewards are opposite (r and -r): they average to 0; the bias is mean |r| = (1 + 0 + 1) / 3.
    assert result.rewards == pytest.approx([0.0, 0.0, 0.0]) and result.metrics["position_bias"] == pytest.approx(2 / 3)
    single = asyncio.run(relative_plugin(fake, shuffles=1)({}, SEED_SAMPLE, trajectories("score 3", "score 1", "score 2")))
    assert sorted(single.rewards) == [-1.0, 0.0, 1.0] and "position_bias" not in single.metrics


def test_relative_judge_unreadable_ranking_is_retry_not_a_score(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradekit.judge.testing import Reply

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    fake.set_responder(lambda body: Reply(content="<ranking>A > A</ranking>"))
    result = asyncio.run(relative_plugin(fake)({}, SEED_SAMPLE, trajectories("score 3", "score 1")))
    assert result.status == PluginStatus.RETRY and result.rewards == [] and "parse_failure" in result.error


@pytest.mark.parametrize(("text", "n", "expected"), [
    ("B > A > C", 3, [1, 0, 2]), ("C, A, B", 3, [2, 0, 1]), ("1. B\n2. A", 2, [1, 0]),
    ("A > B", 3, None), ("A > A > B", 3, None), ("", 2, None), ("B > A > D", 3, None),
])
def test_parse_ranking(text: str, n: int, expected: Any) -> None:
    from gradekit.graders._relative import parse_ranking

    assert parse_ranking(text, n) == expected
