"""Conformance of the in-process adapters for AReaL, SkyRL, verifiers/prime-rl and ROLL, each driven
the way its trainer's own code calls a reward (the call sites are copied below, cited by repo, path
and commit), against the loopback fake judge; and each one's failure channel: a failed reward never
arrives as a bare 0."""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import pytest

from gradekit.graders import load_grader
from gradekit.graders.platforms import AReaLReward, GradekitTextEnv, GradingError, roll_rewards, verifiers_group_reward_func, verifiers_reward_func
from gradekit.judge import Judge, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import reference_judge

HANG = Reply(delay=3600.0, content="{}")


def responder(body: dict) -> Reply:
    """The reference judge; a prediction containing FAIL gets an unparseable reply, HANG never an answer."""
    text = body["messages"][-1]["content"]
    if "HANG" in text:
        return HANG
    if "FAIL" in text:
        return Reply(content="I cannot tell.")
    if "BOOM" in text:
        return Reply(status=500)
    return reference_judge(body)


def config(fake: FakeProvider) -> dict[str, Any]:
    return {"type": "llm", "rubric": "semantic_equivalence_en",
            "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 600}}


@pytest.fixture
def grader(fake: FakeProvider):
    fake.set_responder(responder)

    async def _no_wait(_: float) -> None:
        return None

    def make() -> Judge:
        return Judge("fake-judge", base_url=fake.base_url, api_key="k", timeout=600, cache=None, sleep=_no_wait,
                     limiter=Limiter(concurrency=16, sleep=_no_wait), retry=RetryPolicy(max_attempts=1, parse_retries=0))

    return load_grader({"type": "llm", "rubric": "semantic_equivalence_en"}, judge=make)


# ---- AReaL: AsyncRewardWrapper, copied from inclusionAI/AReaL 4aef98d areal/api/reward_api.py ----------
# (the executor bookkeeping is reduced to one pool; the call, the timeout and the retries are verbatim)


class AsyncRewardWrapper:
    def __init__(self, reward_fn, timeout_seconds: float = 15, max_workers: int = 1, max_retries: int = 3):
        self.reward_fn, self.timeout_seconds, self.max_retries = reward_fn, timeout_seconds, max_retries
        self.executor = ProcessPoolExecutor(max_workers=max_workers)

    async def __call__(self, *args, **kwargs) -> float:
        last_exception = None
        for attempt in range(self.max_retries + 1):
            loop = asyncio.get_event_loop()
            try:
                future = loop.run_in_executor(self.executor, partial(self.reward_fn, *args, **kwargs))
                return await asyncio.wait_for(future, timeout=self.timeout_seconds)
            except TimeoutError:
                last_exception = TimeoutError(f"Reward computation timed out after {self.timeout_seconds}s")
                if attempt < self.max_retries:
                    continue
                return 0  # "Returning 0." -- the path gradekit's own deadline keeps AReaL off
            except Exception as e:
                last_exception = e
                if attempt < self.max_retries:
                    continue
                raise e
        raise last_exception  # type: ignore[misc]


async def rlvr_compute_rewards(wrapper: AsyncRewardWrapper, prompt_str: str, completions_str: str, task_data: dict) -> float:
    """RLVRWorkflow._compute_rewards (areal/workflow/rlvr.py): positional prompt, completion, ids, then the row."""
    return await wrapper(prompt_str, completions_str, [1, 2, 3], [4, 5], **task_data)


async def test_areal_reward_fn_through_its_process_pool_wrapper(fake: FakeProvider) -> None:
    fake.set_responder(responder)
    wrapper = AsyncRewardWrapper(AReaLReward(config(fake), deadline_s=5.0), timeout_seconds=30, max_retries=1)
    try:
        assert await rlvr_compute_rewards(wrapper, "Capital of France?", "Paris", {"answer": "Paris"}) == 1.0
        assert await rlvr_compute_rewards(wrapper, "Capital of France?", "Lyon", {"answer": "Paris", "query_id": "q1"}) == 0.0
        # An unparseable judge reply: the reward function raises, the wrapper retries and raises; AReaL's
        # workflow executor then rejects the trajectory. Never a 0.
        with pytest.raises(GradingError, match="parse_failure"):
            await rlvr_compute_rewards(wrapper, "Capital of France?", "FAIL", {"answer": "Paris"})
    finally:
        wrapper.executor.shutdown(cancel_futures=True)


async def test_areal_deadline_raises_before_the_wrappers_timeout_returns_zero(fake: FakeProvider) -> None:
    fake.set_responder(responder)
    # Without gradekit's deadline, AReaL's own timeout turns a hanging judge into reward 0 (AReaL #548) ...
    bare = AsyncRewardWrapper(AReaLReward(config(fake), deadline_s=None), timeout_seconds=1.5, max_retries=0)
    # ... with it (below the wrapper's timeout) the failure is an exception, which AReaL rejects.
    guarded = AsyncRewardWrapper(AReaLReward(config(fake), deadline_s=0.5), timeout_seconds=5, max_retries=0)
    try:
        assert await rlvr_compute_rewards(bare, "q", "HANG", {"answer": "Paris"}) == 0
        with pytest.raises(GradingError, match="deadline_s"):
            await rlvr_compute_rewards(guarded, "q", "HANG", {"answer": "Paris"})
    finally:
        bare.executor.shutdown(wait=False, cancel_futures=True)
        guarded.executor.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(TypeError, match="config"):
        AReaLReward(lambda s: None)  # type: ignore[arg-type]


# ---- SkyRL: the real skyrl-gym, driven as skyrl/train/generators/skyrl_gym_generator.py (a956457) does ------
# (skyrl-gym 0.4.0 from PyPI, in the conformance extra)


def test_skyrl_text_env_registered_made_and_stepped_like_the_generator(fake: FakeProvider, tmp_path) -> None:
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    fake.set_responder(responder)
    path = tmp_path / "grader.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config(fake)))
    skyrl_gym.envs.register(id="gradekit", entry_point="gradekit.graders.platforms._skyrl:GradekitTextEnv")
    assert issubclass(GradekitTextEnv, BaseTextEnv)
    prompt = [{"role": "user", "content": "Capital of France?"}]

    def episode(output: str, env_config: dict) -> dict:
        env = skyrl_gym.make("gradekit", env_config=env_config, extras={"reward_spec": {"method": "rule", "ground_truth": "Paris"},
                                                                         "max_turns": 1})
        chat_history, _ = env.init([dict(m) for m in prompt])
        try:
            out = env.step(output)
        finally:
            env.close()
        assert out["done"] is True and out["observations"] == []
        return out

    assert episode("Paris", {"grader": str(path)})["reward"] == 1.0
    assert episode("Marseille", {"grader": str(path)})["reward"] == 0.0
    # SkyRL has no mask for a failed reward: step raises (the generator does not catch it), not 0.
    with pytest.raises(GradingError, match="parse_failure"):
        episode("FAIL", {"grader": str(path)})
    out = episode("FAIL", {"grader": str(path), "on_error": -1.0})
    assert out["reward"] == -1.0 and out["metadata"]["grade_status"] == "error"


# ---- verifiers: the legacy Rubric's call paths, from PrimeIntellect-ai/verifiers a60a606
# verifiers/legacy/rubrics/rubric.py (_call_individual_reward_func, _call_group_reward_func) -------------


async def _maybe_await(func, **kwargs):
    result = func(**kwargs)
    return await result if inspect.isawaitable(result) else result


async def rubric_call_individual(func, state: dict) -> float:
    merged = {"prompt": state["prompt"], "completion": state["completion"], "answer": state.get("answer", ""), "state": state,
              "info": state.get("info", {}), "task": None, "parser": object()}
    sig = inspect.signature(func)
    kwargs = merged if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()) else {k: v for k, v in merged.items() if k in sig.parameters}
    try:
        return float(await _maybe_await(func, **kwargs))
    except Exception:
        return 0.0  # the Rubric's own handling: this is why the failure is marked on the state first


async def rubric_call_group(func, states: list[dict]) -> list[float]:
    merged = {"prompts": [s["prompt"] for s in states], "completions": [s["completion"] for s in states],
              "answers": [s.get("answer", "") for s in states], "states": states, "tasks": [None] * len(states),
              "infos": [s.get("info", {}) for s in states], "parser": object()}
    try:
        return await _maybe_await(func, **merged)
    except Exception:
        return [0.0] * len(states)


def state(completion: str, answer: str = "Paris") -> dict:
    return {"prompt": [{"role": "user", "content": "Capital of France?"}], "completion": [{"role": "assistant", "content": completion}],
            "answer": answer, "info": {}, "error": None}


async def test_verifiers_reward_func_marks_the_rollouts_error_when_it_cannot_score(grader) -> None:
    func = verifiers_reward_func(grader, name="judge_reward")
    ok, failed = state("Paris"), state("FAIL")
    assert await rubric_call_individual(func, ok) == 1.0 and ok["error"] is None
    assert await rubric_call_individual(func, failed) == 0.0  # the Rubric's 0.0 ...
    assert isinstance(failed["error"], Exception) and "parse_failure" in str(failed["error"])  # ... beside the marker prime-rl reads


async def test_verifiers_group_reward_func_renormalizes_and_fails_whole_groups(grader) -> None:
    func = verifiers_group_reward_func(grader, name="judge_group")
    states = [state("Paris"), state("Lyon"), state("BOOM"), state("Paris")]
    rewards = await rubric_call_group(func, states)
    assert rewards[:2] == [1.0, 0.0] and rewards[3] == 1.0
    assert rewards[2] == pytest.approx(2.0 / 3), "the failed member carries the finished members' mean"
    assert [s["error"] is not None for s in states] == [False, False, True, False]
    too_few = [state("Paris"), state("BOOM"), state("FAIL")]
    assert await rubric_call_group(func, too_few) == [0.0, 0.0, 0.0]
    assert all(s["error"] is not None for s in too_few), "every member of a failed group is marked"


# ---- ROLL: the reward worker's _compute_rewards_impl, from alibaba/ROLL 8eb27cc
# roll/pipeline/rlvr/rewards/llm_judge_reward_worker.py (tensors as lists) ---------------------------------


def roll_compute_rewards_impl(rewards_fn, batch: dict) -> dict:
    out = rewards_fn(batch["prompts"], batch["responses"], batch["ground_truth"], group_ids=batch["origin_prompt_id"], ids=batch["id"])
    scores = out["scores"]
    return {"token_level_rewards": [[0.0] * 4 for _ in scores], "response_level_rewards": out["response_level_rewards"], "scores": scores}


def test_roll_rewards_decide_groups_and_raise_when_one_fails_whole(grader) -> None:
    rewards = roll_rewards(grader)
    try:
        batch = {"id": ["a", "a", "a", "b", "b"], "origin_prompt_id": [0, 0, 0, 1, 1],
                 "prompts": ["Capital of France?"] * 3 + ["Capital of Italy?"] * 2,
                 "responses": ["Paris", "BOOM", "Lyon", "Rome", "Milan"],
                 "ground_truth": ["Paris"] * 3 + ["Rome"] * 2}
        out = roll_compute_rewards_impl(rewards, batch)
        assert out["response_level_rewards"] == [1.0, 0.5, 0.0, 1.0, 0.0], "member 1's placeholder is its group's mean"
        bad = {**batch, "responses": ["Paris", "BOOM", "FAIL", "Rome", "Milan"]}
        with pytest.raises(GradingError, match="group of sample a: only 1 of 3 members finished"):
            roll_compute_rewards_impl(rewards, bad)
    finally:
        rewards.close()


# ---- verl 0.9.1: the reward loop's naive manager (the trainer always builds the reward loop) -------------
# Copied from verl 0.9.1 (PyPI wheel) verl/experimental/reward_loop/reward_manager/naive.py
# NaiveRewardManager.run_single (after the response is decoded) and verl/experimental/reward_loop/reward_loop.py
# RewardLoopWorker.compute_score_batch: one call per response, gathered; nothing catches an exception.


async def verl_naive_run_single(compute_score, data_source, response_str, ground_truth, extra_info) -> dict:
    extra_info = dict(extra_info)
    extra_info["num_turns"] = None
    extra_info["rollout_reward_scores"] = {}
    loop = asyncio.get_running_loop()
    if inspect.iscoroutinefunction(compute_score):
        result = await compute_score(data_source=data_source, solution_str=response_str, ground_truth=ground_truth, extra_info=extra_info)
    else:
        result = await loop.run_in_executor(None, lambda: compute_score(data_source=data_source, solution_str=response_str,
                                                                        ground_truth=ground_truth, extra_info=extra_info))
    reward_extra_info = {}
    if isinstance(result, dict):
        score = result["score"]
        for key, value in result.items():
            reward_extra_info[key] = value
    else:
        score = result
        reward_extra_info["acc"] = score
    return {"reward_score": score, "reward_extra_info": reward_extra_info}


async def verl_compute_score_batch(compute_score, items: list[tuple]) -> list[dict]:
    tasks = [asyncio.create_task(verl_naive_run_single(compute_score, *item)) for item in items]
    return await asyncio.gather(*tasks)


async def test_verl_0_9_reward_loop_naive_manager_scores_and_a_failure_stops_the_step(fake: FakeProvider) -> None:
    from gradekit.graders.platforms import verl_compute_score

    fake.set_responder(responder)
    compute_score = verl_compute_score(config(fake))
    try:
        extra = {"question": "Capital of France?"}
        out = await verl_compute_score_batch(compute_score, [("qa", "Paris", "Paris", extra), ("qa", "Lyon", "Paris", extra)])
        assert [o["reward_score"] for o in out] == [1.0, 0.0]
        assert set(out[0]["reward_extra_info"]) == {"score", "reward", "ok", "invalid", "judge_error"}, "the same keys every call"
        # verl has no per-sample mask: the default raises, which the naive manager lets stop the step (never a 0).
        with pytest.raises(GradingError, match="parse_failure"):
            await verl_compute_score_batch(compute_score, [("qa", "Paris", "Paris", extra), ("qa", "FAIL", "Paris", extra)])
    finally:
        compute_score.close()


# ---- AReaL 1.0.4: a group is GroupedRolloutWorkflow over RLVRWorkflow episodes ---------------------------
# Copied from areal 1.0.4 (PyPI wheel) areal/infra/remote_inf_engine.py GroupedRolloutWorkflow.arun_episode:
# asyncio.gather over group_size episodes (no return_exceptions); a None episode is dropped, an exception
# rejects the whole group (areal/infra/workflow_executor.py).


async def areal_grouped_arun_episode(episode, group_size: int) -> list | None:
    results = await asyncio.gather(*[episode(k) for k in range(group_size)])
    valid_results = [r for r in results if r is not None]
    if not valid_results:
        return None
    return valid_results


async def test_areal_group_with_a_failed_member_is_rejected_whole(fake: FakeProvider) -> None:
    fake.set_responder(responder)
    wrapper = AsyncRewardWrapper(AReaLReward(config(fake), deadline_s=5.0), timeout_seconds=30, max_retries=0)
    try:
        answers = ["Paris", "Lyon", "Paris"]

        async def episode(k: int) -> float:  # RLVRWorkflow.arun_episode's reward, one sample (n_samples=1)
            return await rlvr_compute_rewards(wrapper, "Capital of France?", answers[k], {"answer": "Paris"})

        assert await areal_grouped_arun_episode(episode, 3) == [1.0, 0.0, 1.0]
        answers[1] = "FAIL"
        with pytest.raises(GradingError, match="parse_failure"):  # the workflow executor rejects the group: no 0 is trained on
            await areal_grouped_arun_episode(episode, 3)
    finally:
        wrapper.executor.shutdown(cancel_futures=True)
