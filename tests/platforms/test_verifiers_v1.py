"""verifiers v1 and prime-rl: gradekit's v1 reward driven through v1's own scoring path (``Task.score``,
the rollout's error capture) and prime-rl's trace filter, against the loopback fake judge.

Two kits run the same scenarios. "copied": v1's functions copied from verifiers 0.4.0 (the PyPI
wheel; ``verifiers/v1/utils/decorators.py`` ``invoke``/``invoke_all``/``seed``/``mark``,
``verifiers/v1/errors.py`` ``TaskError``/``boundary``, ``verifiers/v1/task.py`` ``Task.score`` (its
reward part), ``verifiers/v1/trace.py`` ``record_reward``/``record_error``/``has_error``,
``verifiers/v1/rollout.py`` ``Rollout.close``'s scoring block) and prime-rl's
``iter_trainable_traces`` (PrimeIntellect-ai/prime-rl 559b447 ``src/prime_rl/orchestrator/algo/base.py``),
verbatim but for what reward scoring does not touch. "verifiers": the real ``verifiers.v1`` when it is
installed (it pins ``openai<3``, so it is not in the ``test`` extra: ``pip install 'verifiers==0.4.*'``
in a venv of its own runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any, get_origin, get_type_hints

import pytest
from pydantic import BaseModel, Field

from gradekit.graders.platforms import GradingError, verifiers_v1_group_reward, verifiers_v1_reward
from gradekit.graders.platforms._verifiers import v1_sample

from .test_trainers_2026 import grader  # noqa: F401  (the fixture: the reference judge; FAIL unparseable, HANG never, BOOM 500)

# ---- the copied kit (verifiers 0.4.0 / prime-rl 559b447) -----------------------------------------------


def mark(attr: str, **extra: Any):
    def decorator(f):
        setattr(f, attr, True)
        for key, value in extra.items():
            setattr(f, key, value)
        return f

    return decorator


def reward(func=None, weight: float = 1.0, priority: int = 0):
    decorator = mark("reward", reward_priority=priority, _vf_weight=weight)
    return decorator if func is None else decorator(func)


def discover_decorated(obj: object, attr: str) -> list[Callable[..., Any]]:
    names = {name for klass in type(obj).__mro__ for name, fn in vars(klass).items() if callable(fn) and hasattr(fn, attr)}
    methods = [method for name in names if hasattr(method := getattr(obj, name), attr)]
    priority_attr = f"{attr}_priority"
    methods.sort(key=lambda m: (-getattr(m, priority_attr, 0), m.__name__))
    return methods


def invoke(fn: Callable[..., Any], available: dict) -> Any:
    params = inspect.signature(fn).parameters
    kwargs = {name: available[name] for name in params if name in available}
    if any(isinstance(key, type) for key in available):
        hints = get_type_hints(fn)
        for name in params:
            annotation = get_origin(hints.get(name)) or hints.get(name)
            if name not in kwargs and annotation in available:
                kwargs[name] = available[annotation]
    return fn(**kwargs)


async def invoke_all(fns: list[Callable[..., Any]], available: dict[str, Any]) -> list[Any]:
    return await asyncio.gather(*(invoke(fn, available) for fn in fns))


def seed(scores: dict[str, Any], names: Iterable[str]) -> None:
    for name in names:
        scores[name] = None


class RolloutError(Exception):
    pass


class TaskError(RolloutError):
    pass


@contextlib.asynccontextmanager
async def boundary(error_cls: type[RolloutError], what: str):
    try:
        yield
    except RolloutError:
        raise
    except TimeoutError as e:
        raise error_cls(f"{what} timed out") from e
    except Exception as e:
        raise error_cls(f"{what}: {type(e).__name__}: {e}") from e


class TaskTimeout(BaseModel):
    scoring: float | None = None


class TaskData(BaseModel):
    idx: int | None = None
    id: str | None = None
    name: str | None = None
    prompt: str | list | None = None
    system_prompt: str | None = None
    timeout: TaskTimeout = TaskTimeout()


class Reward(BaseModel):
    score: float
    weight: float = 1.0

    @property
    def value(self) -> float:
        return self.score * self.weight


class Error(BaseModel):
    type: str
    message: str


class UserMessage(BaseModel):
    role: str = "user"
    content: str


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None


class MessageNode(BaseModel):
    parent: int | None = None
    message: Any
    sampled: bool = False
    token_ids: list[int] = Field(default_factory=list)
    mask: list[bool] = Field(default_factory=list)


class Trace(BaseModel):
    nodes: list[MessageNode] = Field(default_factory=list)
    rewards: dict[str, Reward | None] = Field(default_factory=dict)
    errors: list[Error] = Field(default_factory=list)
    ok: bool = False
    is_timeout: bool = False
    root_reply: str | None = None
    agent: Any = Field(default_factory=lambda: SimpleNamespace(trainable=True))

    @property
    def branches(self) -> list[Any]:  # one linear branch: the graph's leaves are not what scoring reads
        return [SimpleNamespace(nodes=self.nodes)]

    @property
    def reward(self) -> float:
        return sum(r.value for r in self.rewards.values() if r is not None)

    @property
    def has_error(self) -> bool:
        return not self.ok

    def record_reward(self, name: str, value: float, weight: float = 1.0) -> None:
        self.rewards[name] = Reward(score=float(value), weight=float(weight))

    def record_error(self, error: Exception) -> None:
        self.errors.append(Error(type=type(error).__name__, message=str(error)))
        self.ok = False


class Task:
    def __init__(self, data: Any) -> None:
        self.data = data

    async def score(self, trace: Any, runtime: Any = None) -> None:
        def requires_runtime(fn) -> bool:
            param = inspect.signature(fn).parameters.get("runtime")
            return param is not None and param.default is inspect.Parameter.empty

        available = {"task": self.data, "trace": trace}
        if runtime is not None:
            available["runtime"] = runtime
        async with boundary(TaskError, f"task {type(self).__name__} scoring"):
            rewards = discover_decorated(self, "reward")
            if runtime is None:
                rewards = [fn for fn in rewards if not requires_runtime(fn)]
            seed(trace.rewards, (fn.__name__ for fn in rewards))
            reward_results = await invoke_all(rewards, available)
            for fn, result in zip(rewards, reward_results):
                weight = getattr(fn, "_vf_weight", 1.0)
                items = result.items() if isinstance(result, Mapping) else [(fn.__name__, result)]
                for key, value in items:
                    trace.record_reward(key, value, weight)


async def rollout_close_scoring(task: Any, trace: Any, scoring_timeout: float | None, kit: Any) -> Any:
    """Rollout.close's scoring block and its capture (verifiers/v1/rollout.py): a raise is ``fail`` (the
    trace's error, ``ok = False``); an expired scoring deadline is ``timeout`` (a stop: ``ok`` stays true)."""
    failed = False
    try:
        try:
            async with asyncio.timeout(scoring_timeout), kit.boundary(kit.TaskError, "scoring"):
                await asyncio.gather(task.score(trace, None))
        except TimeoutError:
            trace.is_timeout = True
    except Exception as e:
        failed = True
        trace.record_error(e)
    finally:
        trace.ok = not failed
    return trace


def iter_trainable_traces(episodes: list[Any]):
    """prime-rl 559b447 src/prime_rl/orchestrator/algo/base.py, verbatim."""
    for episode in episodes:
        for trace in episode.traces:
            if trace.has_error or not trace.agent.trainable:
                continue
            if any(any(node.mask) for node in trace.nodes):
                yield episode, trace


# ---- the two kits -----------------------------------------------------------------------------------


def copied_kit() -> Any:
    class MathData(TaskData):
        answer: str = ""

    def make_trace(data: Any, reply: str) -> Trace:
        return Trace(nodes=[MessageNode(message=UserMessage(content=data.prompt), token_ids=[1, 2], mask=[False, False]),
                            MessageNode(parent=0, message=AssistantMessage(content=reply), sampled=True, token_ids=[3], mask=[True])])

    return SimpleNamespace(name="copied", Task=Task, Data=MathData, reward=reward, TaskError=TaskError, boundary=boundary,
                           TaskTimeout=TaskTimeout, make_trace=make_trace, episode=lambda traces: SimpleNamespace(traces=traces))


def real_kit() -> Any:
    vf = pytest.importorskip("verifiers.v1")
    from verifiers.v1.errors import boundary as vf_boundary
    from verifiers.v1.graph import MessageNode as VfNode

    class MathData(vf.TaskData):
        answer: str = ""

    def make_trace(data: Any, reply: str) -> Any:
        nodes = [VfNode(message=vf.UserMessage(content=data.prompt), token_ids=[1, 2], mask=[False, False]),
                 VfNode(parent=0, message=vf.AssistantMessage(content=reply), sampled=True, token_ids=[3], mask=[True])]
        return vf.Trace(task=vf.TraceTask(type="MathTask", data=data), agent=vf.AgentInfo(config=vf.AgentConfig()), nodes=nodes)

    def episode(traces: list[Any]) -> Any:
        return vf.Episode(task=traces[0].task, traces=traces)

    return SimpleNamespace(name="verifiers", vf=vf, Task=vf.Task, Data=MathData, reward=vf.reward, TaskError=vf.TaskError,
                           boundary=vf_boundary, TaskTimeout=vf.TaskTimeout, make_trace=make_trace, episode=episode)


@pytest.fixture(params=["copied", "verifiers"])
def kit(request: pytest.FixtureRequest) -> Any:
    return copied_kit() if request.param == "copied" else real_kit()


def math_task(kit: Any, judge: Any, **data: Any) -> tuple[Any, Callable[[str], Any]]:
    class MathTask(kit.Task):
        correct = verifiers_v1_reward(judge, name="correct", deadline_s=30.0)

    task_data = kit.Data(prompt="Capital of France?", answer="Paris", **data)
    return MathTask(task_data), lambda reply: kit.make_trace(task_data, reply)


# ---- the scenarios ----------------------------------------------------------------------------------


async def test_v1_task_score_records_the_reward_and_a_failure_is_a_trace_prime_rl_skips(kit: Any, grader: Any) -> None:
    task, trace_of = math_task(kit, grader)
    right, wrong, broken = trace_of("Paris"), trace_of("Lyon"), trace_of("FAIL")
    for trace in (right, wrong, broken):
        await rollout_close_scoring(task, trace, None, kit)
    assert right.rewards["correct"].score == 1.0 and right.reward == 1.0 and not right.has_error
    assert wrong.reward == 0.0 and not wrong.has_error
    # The judge's unparseable reply: the reward raised, v1 recorded a TaskError, has_error is set ...
    assert broken.has_error and broken.errors[-1].type == "TaskError" and "parse_failure" in broken.errors[-1].message
    assert broken.rewards["correct"] is None, "seeded, never scored"
    # ... and prime-rl trains on the two clean traces only, the failed one out of the group's mean too.
    trained = [t for _, t in iter_trainable_traces([kit.episode([right, wrong, broken])])]
    assert trained == [right, wrong]


async def test_v1_reward_ends_before_the_tasks_scoring_timeout_so_a_hung_judge_is_an_error_not_a_zero(kit: Any, grader: Any) -> None:
    class HangTask(kit.Task):
        unguarded = verifiers_v1_reward(grader, name="unguarded", deadline_s=None)

    # Without a deadline of its own, v1's scoring timeout stops the trace with ok still true and the
    # reward unscored: prime-rl would train on it as reward 0. This is what the reward's deadline prevents.
    data = kit.Data(prompt="Capital of France?", answer="Paris")
    bare = kit.make_trace(data, "HANG")
    await rollout_close_scoring(HangTask(data), bare, 0.5, kit)
    assert not bare.has_error and bare.reward == 0.0 and [t for _, t in iter_trainable_traces([kit.episode([bare])])] == [bare]

    task, trace_of = math_task(kit, grader, timeout=kit.TaskTimeout(scoring=1.0))
    hung = trace_of("HANG")
    started = time.monotonic()
    await rollout_close_scoring(task, hung, 1.0, kit)
    assert time.monotonic() - started < 1.0 + 2.0
    assert hung.has_error and "timeout" in hung.errors[-1].message and "0.9 s" in hung.errors[-1].message
    assert list(iter_trainable_traces([kit.episode([hung])])) == []


async def test_v1_group_reward_in_env_finalize_marks_only_the_failed_member(kit: Any, grader: Any) -> None:
    group = verifiers_v1_group_reward(grader, name="judge_group", group_deadline_s=30)
    data = kit.Data(prompt="Capital of France?", answer="Paris")
    traces = [kit.make_trace(data, text) for text in ("Paris", "Lyon", "BOOM", "Paris")]
    for trace in traces:
        trace.ok = True  # finished rollouts: Env.finalize runs over the episode's completed traces
    episode = kit.episode(traces)
    assert await group(SimpleNamespace(data=data), episode) == [1.0, 0.0, None, 1.0]
    assert [t.has_error for t in traces] == [False, False, True, False]
    assert [t.rewards.get("judge_group").score for t in traces if not t.has_error] == [1.0, 0.0, 1.0]
    assert len(list(iter_trainable_traces([episode]))) == 3
    too_few = kit.episode([kit.make_trace(data, t) for t in ("Paris", "BOOM", "FAIL")])
    for trace in too_few.traces:
        trace.ok = True
    with pytest.raises(GradingError, match="only 1 of 3 members finished"):
        await group(data, too_few)
    assert all(t.has_error for t in too_few.traces), "a group that fails as a whole fails every member (and the episode)"


async def test_v1_reward_plugged_by_task_config(grader: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """TaskConfig.rewards plugs a function by import path (verifiers/v1/utils/loaders.py load_plugged_fn)."""
    vf = pytest.importorskip("verifiers.v1")
    (tmp_path / "gk_rewards.py").write_text("from gradekit.graders import verifiers_v1_reward\n"
                                            "judge = None  # set by the test: the fake provider's grader\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gk_rewards  # type: ignore[import-not-found]

    gk_rewards.judge = verifiers_v1_reward(grader, name="judge")
    kit = real_kit()

    class Plain(vf.Task):
        pass

    config = vf.TaskConfig(rewards={"judge": {"fn": "gk_rewards:judge", "weight": 2.0}})
    data = kit.Data(prompt="Capital of France?", answer="Paris")
    ok, broken = kit.make_trace(data, "Paris"), kit.make_trace(data, "FAIL")
    for trace in (ok, broken):
        await rollout_close_scoring(Plain(data, config), trace, None, kit)
    assert ok.rewards["judge"].score == 1.0 and ok.rewards["judge"].weight == 2.0 and ok.reward == 2.0
    assert broken.has_error and sys.modules["gk_rewards"] is gk_rewards


def test_v1_sample_reads_task_data_and_the_final_branch() -> None:
    kit = copied_kit()

    class Row(TaskData):
        expected_answer: str

    data = Row(idx=3, prompt="2+3?", system_prompt="Be brief.", expected_answer="5")
    sample = v1_sample(data, kit.make_trace(data, "5"))
    assert [m.role for m in sample.messages] == ["system", "user"] and sample.messages[1].text == "2+3?"
    assert sample.response_text == "5" and sample.references == {"expected_answer": "5", "answer": "5"}
    assert sample.metadata == {"idx": 3}
    sub = kit.make_trace(data, "thinking")
    sub.root_reply = "five"
    assert v1_sample(data, sub).response_text == "five", "the root agent's reply when the trace has sub-agents"
