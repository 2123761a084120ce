"""Ark, verl and TRL adapters, each called the way its platform calls it, with real graders; LLM
graders against the loopback fake provider."""

from __future__ import annotations

import asyncio
import logging
import inspect
import json
import pickle
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from gradekit.graders import Grade, Sample, SampleChecks, aclose_grader, llm_grader, load_grader
from gradekit.graders.platforms import GradingError, ark_group_grader, trl_reward_func, verl_compute_score
from gradekit.graders.platforms._ark import ArkTrajectory, ChatCompletionSample, GroupGraderResult, PluginStatus
from gradekit.judge import Judge, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import InFlight, Waits, reference_judge

DATA = Path(__file__).parents[1] / "data" / "graders"
ANSWER_TAG = {"type": "string_match", "name": "exact_answer", "expression": "{{references.answer}}", "operation": "EXACT_MATCH",
              "parse": {"type": "REGEX_EXTRACT", "regex": "<answer>(.*?)</answer>"}, "correct": 1, "wrong": -1}


def fake_judge(fake: FakeProvider, waits: Waits, attempts: int = 2) -> Judge:
    return Judge("fake-judge", base_url=fake.base_url, api_key="test-key", timeout=5.0, limiter=Limiter(concurrency=8, sleep=Waits()),
                 retry=RetryPolicy(max_attempts=attempts, parse_retries=1), sleep=waits)


def failing_where(marker: str, failure: Reply):
    """The reference judge, except for a prediction containing ``marker``, which gets ``failure`` every time."""

    def respond(body: dict) -> Reply:
        return failure if marker in body["messages"][-1]["content"] else reference_judge(body)

    return respond


# ---- Ark ------------------------------------------------------------------------------------------

# Seed 000's main(): a ChatCompletionSample and Trajectory objects built from dicts, context {}.
SEED_SAMPLE = {"messages": [{"role": "user", "content": "Which two companies grew? Answer in <answer></answer>."}],
               "thinking": {"type": "enabled"}, "extra": {"answer": "Jingli and Xinqin"}}
SEED_TRAJECTORIES = [
    {"messages": [{"role": "assistant", "content": "<answer>Jingli and Xinqin</answer>"}], "finish_reason": "stop", "usage": {}},
    {"messages": [{"role": "assistant", "content": [{"type": "text", "text": "<answer>Jingli</answer>"}]}], "finish_reason": "stop",
     "usage": {}},
    {"messages": [{"role": "assistant", "content": "no tags"}], "finish_reason": "stop", "usage": {}, "extra": {"reward": -0.5}},
]


def request_through_decorator(fn: Any, request: dict[str, Any]) -> Any:
    """What a plugin decorator's test instance does with a JSON request: read the signature and
    the type hints, validate each argument into its annotated type, then await the function."""
    assert inspect.iscoroutinefunction(fn)
    params = list(inspect.signature(fn).parameters)
    assert params == ["context", "sample", "trajectories"]
    hints = typing.get_type_hints(fn)
    sample = hints["sample"].model_validate(request["sample"])
    item_type = typing.get_args(hints["trajectories"])[0]
    trajectories = [item_type.model_validate(t) for t in request["trajectories"]]
    result = asyncio.run(fn(request.get("context", {}), sample, trajectories))
    assert isinstance(result, hints["return"])
    return result


def test_ark_seed_harness_pydantic_and_dict_inputs_give_the_same_result() -> None:
    plugin = ark_group_grader(ANSWER_TAG)
    sample = ChatCompletionSample(**SEED_SAMPLE)
    trajectories = [ArkTrajectory(**t) for t in SEED_TRAJECTORIES]
    result = asyncio.run(plugin({}, sample, trajectories))
    assert isinstance(result, GroupGraderResult)
    assert result.status == PluginStatus.SUCCESS and result.error == ""
    # exact; list content flattened to its text ("Jingli" != reference); the rollout's preset reward wins.
    assert result.rewards == [1.0, -1.0, -0.5]
    assert result.metrics["n"] == 3.0 and result.metrics["preset"] == 1.0
    assert all(isinstance(v, float) for v in result.metrics.values())
    from_dicts = asyncio.run(plugin({}, SEED_SAMPLE, SEED_TRAJECTORIES))
    assert from_dicts == result


def test_ark_function_passes_through_a_decorator_reading_its_signature() -> None:
    plugin = ark_group_grader(ANSWER_TAG, name="answer_tag")
    assert plugin.__name__ == "answer_tag"
    result = request_through_decorator(plugin, {"context": {"phase": "train"}, "sample": SEED_SAMPLE, "trajectories": SEED_TRAJECTORIES})
    assert result.rewards == [1.0, -1.0, -0.5]


@pytest.mark.parametrize("sample", [
    pytest.param({**SEED_SAMPLE, "extra": {}}, id="extra_without_answer"),
    pytest.param({**SEED_SAMPLE, "extra": None}, id="no_extra"),
])
def test_ark_invalid_sample_is_discarded_with_no_rewards(sample: dict) -> None:
    result = asyncio.run(ark_group_grader(ANSWER_TAG)({}, sample, SEED_TRAJECTORIES[:2]))
    assert result.status == PluginStatus.DISCARD and result.rewards == []
    assert "references key 'answer'" in result.error
    checked = asyncio.run(ark_group_grader(ANSWER_TAG, sample_checks=SampleChecks(required_references=["answer"]))({}, sample, SEED_TRAJECTORIES))
    assert checked.status == PluginStatus.DISCARD and "lack 'answer'" in checked.error


def test_ark_input_that_is_not_a_sample_is_discarded_and_a_crash_is_a_failure() -> None:
    bad = asyncio.run(ark_group_grader(ANSWER_TAG)({}, {"messages": "x", "tools": 3}, SEED_TRAJECTORIES))
    assert bad.status == PluginStatus.DISCARD and "not valid input" in bad.error

    async def broken(sample: Sample) -> Grade:
        raise RuntimeError("grader bug")

    crashed = asyncio.run(ark_group_grader(broken)({}, SEED_SAMPLE, SEED_TRAJECTORIES[:1]))
    assert crashed.status == PluginStatus.FAILURE and crashed.rewards == [] and "RuntimeError: grader bug" in crashed.error


def test_ark_group_config_file_loads_as_the_group(tmp_path: Path) -> None:
    config = tmp_path / "group.yaml"
    config.write_text(json.dumps({"type": "group", "grader": ANSWER_TAG, "checks": {"preset_reward_key": None}}), encoding="utf-8")
    result = asyncio.run(ark_group_grader(config)({}, SEED_SAMPLE, SEED_TRAJECTORIES))
    assert result.rewards == [1.0, -1.0, -1.0], "the file's checks switched the preset reward off"


@pytest.mark.parametrize(("policy", "status", "rewards"), [
    pytest.param("RETRY", PluginStatus.RETRY, [], id="retry_by_default"),
    pytest.param("FAILURE", PluginStatus.FAILURE, [], id="failure"),
    pytest.param(0.0, PluginStatus.SUCCESS, [1.0, 0.0], id="fixed_score"),
])
async def test_ark_llm_grader_transient_judge_failure(fake: FakeProvider, waits: Waits, policy: Any, status: Any, rewards: list) -> None:
    fake.set_responder(failing_where("FAIL", Reply(status=500)))
    judge = fake_judge(fake, waits)
    plugin = ark_group_grader(llm_grader(judge, "semantic_equivalence_en"), on_judge_error=policy)
    sample = {"messages": [{"role": "user", "content": "Capital of France?"}], "extra": {"answer": "Paris"}}
    trajectories = [{"messages": [{"role": "assistant", "content": [{"type": "text", "text": "It is Paris."}]}]},
                    {"messages": [{"role": "assistant", "content": "FAIL"}]}]
    try:
        result = await plugin({}, ChatCompletionSample(**sample), [ArkTrajectory(**t) for t in trajectories])
    finally:
        await judge.aclose()
    assert result.status == status and result.rewards == rewards
    assert ("server_error" in result.error) == (status != PluginStatus.SUCCESS)
    assert any("- Paris" in r.body["messages"][-1]["content"] and "It is Paris." in r.body["messages"][-1]["content"]
               for r in fake.chat_requests()), "list content reached the judge as text"
    assert waits, "the judge retried the 500 before giving up"


# ---- verl -----------------------------------------------------------------------------------------


def test_verl_naive_manager_call_shapes_and_fixed_keys() -> None:
    compute_score = verl_compute_score(ANSWER_TAG, on_invalid=-1.0)
    try:
        # the naive manager's call: keywords, ground_truth from reward_model, extra_info with num_turns
        right = compute_score(data_source="openai/gsm8k", solution_str="... <answer>42</answer>", ground_truth="42",
                              extra_info={"index": 0, "num_turns": None})
        # the same function called positionally, and with a dict ground truth that lacks "answer"
        wrong = compute_score("openai/gsm8k", "<answer>41</answer>", "42", None)
        invalid = compute_score("openai/gsm8k", "<answer>41</answer>", {"solution": "42"})
    finally:
        compute_score.close()
    assert right == {"score": 1.0, "reward": 1.0, "ok": 1.0, "invalid": 0.0, "judge_error": 0.0}
    assert wrong["score"] == -1.0 and wrong["ok"] == 1.0
    assert invalid == {"score": -1.0, "reward": -1.0, "ok": 0.0, "invalid": 1.0, "judge_error": 0.0}
    assert list(right) == list(wrong) == list(invalid), "verl appends every key to a list: the same keys on every call"
    assert all(isinstance(v, float) for r in (right, wrong, invalid) for v in r.values())


def test_verl_invalid_raises_by_default_and_dict_ground_truth_merges() -> None:
    compute_score = verl_compute_score(ANSWER_TAG)
    try:
        with pytest.raises(GradingError, match="on_invalid") as caught:
            compute_score("src", "<answer>42</answer>", {"solution": "42"})
        assert caught.value.grade.status == "invalid"
        assert compute_score("src", "<answer>42</answer>", {"answer": "42", "unit": "m"})["score"] == 1.0
        assert compute_score("src", "<answer>42</answer>", np.str_("42"))["score"] == 1.0, "numpy values from parquet"
    finally:
        compute_score.close()
    with pytest.raises(ValueError, match="on_error"):
        verl_compute_score(ANSWER_TAG, on_error=2.0)


def test_verl_batch_manager_keyword_call_with_numpy_columns() -> None:
    compute_score = verl_compute_score(ANSWER_TAG, on_invalid=0.0)
    try:
        n = 6
        kwargs = {"data_sources": np.array(["a"] * n, dtype=object),
                  "solution_strs": [f"<answer>{i}</answer>" for i in range(n)],
                  "ground_truths": [str(i if i % 2 == 0 else 99) for i in range(n - 1)] + [{"other": 1}],
                  "extra_infos": np.array([{"index": i} for i in range(n)], dtype=object)}
        results = compute_score(**kwargs)  # the batch manager's call, through the same name
        assert results == compute_score.batch(**kwargs)
    finally:
        compute_score.close()
    assert [r["score"] for r in results] == [1.0, -1.0, 1.0, -1.0, 1.0, 0.0]
    assert [r["invalid"] for r in results] == [0.0] * 5 + [1.0]
    assert len({tuple(r) for r in results}) == 1
    with pytest.raises(ValueError, match="aligned"):
        verl_compute_score(ANSWER_TAG).batch(["a"], ["x", "y"], ["1", "2"])


def test_verl_config_file_reward_pickles_for_ray_workers() -> None:
    compute_score = verl_compute_score(DATA / "string_match.yaml")
    copy = pickle.loads(pickle.dumps(compute_score))
    try:
        assert copy("d", "<answer>Paris</answer>", "Paris")["score"] == 1.0
    finally:
        copy.close()
        compute_score.close()
    async def constant(sample: Sample) -> Grade:
        return Grade.scored(0.5)

    built = verl_compute_score(constant)
    assert built("d", "anything", "x")["score"] == 0.5
    built.close()
    with pytest.raises(TypeError, match="config file"):
        pickle.dumps(built)


def test_verl_llm_grader_batch_and_transient_error(fake: FakeProvider, waits: Waits) -> None:
    fake.set_responder(failing_where("FAIL", Reply(status=503)))
    config = {"type": "llm", "rubric": "semantic_equivalence_en"}
    raising = verl_compute_score(load_grader(config, judge=lambda: fake_judge(fake, waits)))
    fixed = verl_compute_score(load_grader(config, judge=lambda: fake_judge(fake, waits)), on_error=0.0)
    try:
        out = raising.batch(["geo", "geo"], ["It is Paris.", "Lyon"], ["Paris", "Paris"],
                            [{"question": "Capital of France?"}, {"prompt": [{"role": "user", "content": "Capital of France?"}]}])
        assert [r["score"] for r in out] == [1.0, 0.0]
        sent = [r.body["messages"][-1]["content"] for r in fake.chat_requests()]
        assert all("Capital of France?" in s and "- Paris" in s for s in sent), "extra_info's question/prompt and the ground truth reach the judge"
        with pytest.raises(GradingError, match="server_error"):
            raising("geo", "FAIL", "Paris", {"question": "Capital of France?"})
        failed = fixed("geo", "FAIL", "Paris", {"question": "Capital of France?"})
        assert failed == {"score": 0.0, "reward": 0.0, "ok": 0.0, "invalid": 0.0, "judge_error": 1.0}
    finally:
        raising.close()
        fixed.close()


async def test_verl_sync_call_works_inside_a_running_event_loop() -> None:
    compute_score = verl_compute_score(ANSWER_TAG)
    try:
        assert compute_score("d", "<answer>7</answer>", "7")["score"] == 1.0  # called from a coroutine, synchronously
    finally:
        compute_score.close()


# ---- TRL ------------------------------------------------------------------------------------------


class TrainerState(BaseModel):
    global_step: int = 3


def trl_call(func: Any, inputs: list[dict[str, Any]], completions: list[Any], log_metric: Any = None) -> list[float | None]:
    """GRPOTrainer._calculate_rewards for an async reward function: every column but prompt as an
    aligned list, trainer_state, log_extra and log_metric, gathered on TRL's own loop."""
    assert inspect.iscoroutinefunction(func)
    prompts = [x["prompt"] for x in inputs]
    keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs: dict[str, Any] = {key: [example[key] for example in inputs] for key in keys}
    reward_kwargs["trainer_state"] = TrainerState()
    reward_kwargs["log_extra"] = lambda column, values: None
    reward_kwargs["log_metric"] = log_metric or (lambda name, value: None)
    completion_ids = [[1, 2, 3] for _ in completions]

    async def run() -> list:
        (out,) = await asyncio.gather(func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs))
        return out

    return asyncio.run(run())


def test_trl_standard_format_columns_become_references() -> None:
    reward = trl_reward_func(ANSWER_TAG)
    assert reward.__name__ == "exact_answer", "TRL logs rewards/<__name__>/mean"
    inputs = [{"prompt": "2+2?", "answer": "4", "difficulty": 1}] * 2 + [{"prompt": "3+3?", "answer": "6", "difficulty": 2}] * 2
    completions = ["<answer>4</answer>", "<answer>5</answer>", "<answer>6</answer>", "six"]
    metrics: list[tuple[str, float]] = []
    assert trl_call(reward, inputs, completions, log_metric=lambda n, v: metrics.append((n, v))) == [1.0, -1.0, 1.0, -1.0]
    assert metrics == [("exact_answer/invalid", 0.0), ("exact_answer/judge_errors", 0.0)]


def test_trl_conversational_format_and_aliases() -> None:
    reward = trl_reward_func(ANSWER_TAG, name="answer_reward", columns={"answer": "solution"})
    assert reward.__name__ == "answer_reward"
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    inputs = [{"prompt": prompt, "solution": np.str_("4")}] * 2
    completions = [[{"role": "assistant", "content": "<answer>4</answer>"}],
                   [{"role": "assistant", "content": [{"type": "text", "text": "<answer>5</answer>"}]}]]
    assert trl_call(reward, inputs, completions) == [1.0, -1.0]
    # older TRL spelled it completions_ids, and recent versions add num_generations: both ignored
    out = asyncio.run(reward(prompts=["2+2?"], completions=["<answer>4</answer>"], completions_ids=[[1]], num_generations=1, solution=["4"]))
    assert out == [1.0]


def test_trl_invalid_is_none_by_default_or_the_configured_score() -> None:
    inputs = [{"prompt": "q", "other": "x"}]
    metrics: list[tuple[str, float]] = []
    assert trl_call(trl_reward_func(ANSWER_TAG), inputs, ["<answer>4</answer>"], lambda n, v: metrics.append((n, v))) == [None]
    assert ("exact_answer/invalid", 1.0) in metrics
    assert trl_call(trl_reward_func(ANSWER_TAG, on_invalid=-1.0), inputs, ["<answer>4</answer>"]) == [-1.0]
    with pytest.raises(ValueError, match="not a dataset column"):
        trl_call(trl_reward_func(ANSWER_TAG, columns={"answer": "solution"}), inputs, ["x"])


async def test_trl_llm_grader_concurrent_and_transient_error(fake: FakeProvider, waits: Waits) -> None:
    in_flight = InFlight(failing_where("FAIL", Reply(status=500)), meet=2, hold=0.02)
    fake.set_responder(in_flight)
    judge = fake_judge(fake, waits)
    try:
        strict = trl_reward_func(llm_grader(judge, "semantic_equivalence_en"), name="semantic")
        lenient = trl_reward_func(llm_grader(judge, "semantic_equivalence_en"), on_error=None)
        prompts = ["Capital of France?"] * 4
        ok = await strict(prompts=prompts, completions=["Paris", "Lyon", "It is Paris", "Nice"], completion_ids=None,
                          trainer_state=TrainerState(), answer=["Paris"] * 4)
        assert ok == [1.0, 0.0, 1.0, 0.0]
        assert in_flight.peak > 1, "the completions are graded concurrently"
        with pytest.raises(GradingError, match="on_error"):
            await strict(prompts=prompts[:2], completions=["Paris", "FAIL"], answer=["Paris"] * 2, trainer_state=TrainerState())
        assert await lenient(prompts=prompts[:2], completions=["Paris", "FAIL"], answer=["Paris"] * 2) == [1.0, None]
    finally:
        await judge.aclose()


def test_trl_reward_from_a_config_file_closes() -> None:
    reward = trl_reward_func(DATA / "string_match.yaml")
    assert trl_call(reward, [{"prompt": "q", "answer": "Paris"}], ["<answer>Paris</answer>"]) == [1.0]
    asyncio.run(aclose_grader(reward.grader))


# ---- the example files, loaded the way each trainer loads them -----------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "adapters"


def load_like_verl(path: Path, name: str) -> Any:
    """verl's get_custom_reward_fn: import the file as ``custom_module``, wrap the function with reward_kwargs."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("custom_module", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["custom_module"] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        del sys.modules["custom_module"]
    raw_fn = getattr(module, name)
    reward_kwargs = {"unused_setting": 1}

    def wrapped_fn(*args: Any, **kwargs: Any) -> Any:
        return raw_fn(*args, **kwargs, **reward_kwargs)

    return wrapped_fn, raw_fn


def test_verl_example_file_as_verl_loads_and_calls_it() -> None:
    compute_score, raw = load_like_verl(EXAMPLES / "verl_reward.py", "compute_score")
    try:
        one = compute_score(data_source="math", solution_str=r"So \boxed{1,000}", ground_truth="1000", extra_info={"index": 0})
        assert one["score"] == pytest.approx(1.0)
        batch = compute_score(data_sources=["math"] * 2, solution_strs=[r"\boxed{999}", "no box"], ground_truths=["1000", "1000"],
                              extra_infos=[None, None])
        assert [r["score"] for r in batch] == [pytest.approx(0.8 * -1 + 0.2 * 1), pytest.approx(-1.0)]
        assert compute_score("math", r"\boxed{1}", {"other": 1}, None)["invalid"] == 1.0
    finally:
        raw.close()


def test_trl_example_file_reward_called_as_trl_calls_it() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_reward_example", EXAMPLES / "trl_reward.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    reward = module.math_answer
    assert reward.__name__ == "math_answer"
    inputs = [{"prompt": [{"role": "user", "content": "999 + 1?"}], "answer": "1000"}] * 2
    out = trl_call(reward, inputs, [[{"role": "assistant", "content": r"\boxed{1000}"}], [{"role": "assistant", "content": "1000"}]])
    assert out == [pytest.approx(1.0), pytest.approx(-1.0)]
    asyncio.run(aclose_grader(reward.grader))


def test_ark_example_file_uses_public_names() -> None:
    import ast

    from gradekit import graders

    # ark_sdk is not on PyPI, so the file is not run here (the adapter's behaviour is tested above):
    # it must parse, and everything it takes from gradekit must be public.
    tree = ast.parse((EXAMPLES / "ark_plugin.py").read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "gradekit.graders" for a in n.names]
    assert imported and set(imported) <= set(graders.__all__)


def test_trl_says_once_which_reference_column_it_looked_for_and_how_to_map_it(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 48: a dataset whose reference column is not ``answer`` made every reward None, silently."""
    inputs = [{"prompt": "2+2?", "solution": "4"}, {"prompt": "3+3?", "solution": "6"}]
    reward = trl_reward_func(ANSWER_TAG)
    logger = logging.getLogger("gradekit")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="gradekit"):
            for _ in range(3):  # three training steps
                assert trl_call(reward, inputs, ["<answer>4</answer>", "<answer>6</answer>"]) == [None, None]
    finally:
        logger.removeHandler(caplog.handler)
    said = list({id(r): r.getMessage() for r in caplog.records if "exact_answer" in r.getMessage()}.values())
    assert len(said) == 1, said  # once, not every step
    assert "'answer'" in said[0] and "solution" in said[0] and "columns={'answer': 'solution'}" in said[0], said[0]
