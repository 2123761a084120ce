"""verifiers and prime-rl: verifiers v1's ``Task.score`` (verifiers 0.4 on PyPI ships only ``verifiers.v1``)
and the legacy ``Rubric`` (verifiers before 0.4, kept for installs that have it).

==========  ==============================================================================
v1          ``Task.score(trace, runtime)`` calls each ``@vf.reward`` (and each reward plugged by
            ``TaskConfig.rewards``) by parameter name from ``{"task": task.data, "trace": trace,
            "runtime": runtime}`` and gathers them; the result is ``trace.record_reward(name,
            float(value), weight)`` (verifiers 0.4.0 ``verifiers/v1/task.py``,
            ``verifiers/v1/utils/decorators.py`` ``invoke``). An exception (and a ``None``,
            whose ``float()`` raises) leaves ``boundary(TaskError, ...)`` as ``TaskError``; the
            rollout records it (``Trace.record_error``) and closes with ``trace.ok = False``
            (``verifiers/v1/rollout.py`` ``Rollout.close``), so ``trace.has_error`` is true and
            prime-rl's ``iter_trainable_traces`` skips the trace, in the loss and in the group's
            mean (PrimeIntellect-ai/prime-rl 559b447 ``src/prime_rl/orchestrator/algo/base.py``,
            ``algo/grpo.py``). That raise is the channel that masks. A *scoring timeout* is not:
            ``Rollout.close`` records it as a stop with ``ok`` still true and the reward unscored,
            which prime-rl trains on as reward 0; so the reward keeps its own deadline, below
            the task's ``timeout.scoring``, and raises when it passes.
v1 groups   ``Env.finalize(task, episode)`` is v1's cross-trace judgement ("a raise fails the
            episode"); :func:`verifiers_v1_group_reward` grades ``episode.traces`` as one group
            there, records each member's reward, and marks a member that could not be graded
            with ``trace.record_error`` (``has_error``: prime-rl skips it alone).
legacy      ``Rubric`` reward functions, called with the names they ask for (``prompt``,
            ``completion``, ``answer``, ``state``, ``info``; group functions ``prompts``,
            ``completions``, ``answers``, ``states``) (PrimeIntellect-ai/verifiers a60a606
            ``verifiers/legacy/rubrics/rubric.py``). The Rubric turns an exception into 0.0, so the
            failure is first written to ``state["error"]`` (the rollout's error field, which
            verifiers saves with the rollout and prime-rl reads as ``has_error``), then raised.
==========  ==============================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._members import GroupPolicy, MemberPolicy, decide
from .._sample import Grade, Sample
from ._common import GraderSource, GradingError, graded_within, grader_name, plain, reference_dict, resolve_grader

# TaskData's own fields (verifiers 0.4.0 verifiers/v1/task.py): the prompt, placement and limits, never references.
_TASK_FIELDS = frozenset({"idx", "id", "name", "description", "prompt", "system_prompt", "image", "workdir", "agent_user", "skills",
                          "network_allow", "network_block", "artifacts", "artifact_max_bytes", "timeout", "resources"})
_ANSWER_ALIASES = ("expected_answer", "solution", "ground_truth", "label", "target")
SCORING_SHARE = 0.9  # of a task's timeout.scoring: the reward raises first, so v1 records an error, not an unscored stop


def _dump(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return plain(dump(mode="json", exclude_none=True)) if callable(dump) else plain(value)


def _message(message: Any) -> dict[str, Any]:
    """A v1 message as a chat message: v1's ``ToolCall`` ``{id, name, arguments}`` becomes the chat
    ``{id, type, function: {name, arguments}}``; ``provider_state`` (opaque to a judge) is dropped."""
    out = _dump(message)
    out.pop("provider_state", None)
    calls = out.get("tool_calls")
    if calls:
        out["tool_calls"] = [{"id": c.get("id"), "type": "function",
                              "function": {"name": ".".join(x for x in (c.get("namespace"), c.get("name")) if x),
                                           "arguments": c.get("arguments") or ""}} for c in calls]
    return out


def v1_sample(task: Any, trace: Any, answer_key: str = "answer") -> Sample:
    """A gradekit Sample from what v1 passes a reward: ``task`` (the TaskData) and ``trace``.

    The prompt is the task's ``system_prompt`` and ``prompt`` (else the trace's messages before its
    first sampled one); the response is the final branch from its first sampled message on (the
    assistant turns with their tool calls, tool results between them), or the root agent's reply
    when the trace has sub-agents; the task's own fields (``answer``, a WireTaskData's extras) are
    the references, and ``expected_answer``/``solution``/``ground_truth``/``label`` also ``answer``.
    """
    data = _dump(task) if task is not None else {}
    if not isinstance(data, Mapping):
        raise TypeError(f"verifiers v1 reward: task must be a TaskData, got {type(task).__name__}")
    messages: list[dict[str, Any]] = []
    if data.get("system_prompt"):
        messages.append({"role": "system", "content": data["system_prompt"]})
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt:
        messages.extend(_message(m) for m in prompt)
    nodes = list(trace.branches[-1].nodes) if trace is not None and getattr(trace, "nodes", None) else []
    first = next((i for i, node in enumerate(nodes) if node.sampled), None)
    response: Any = ""
    if trace is not None and getattr(trace, "root_reply", None) is not None:
        response = trace.root_reply
    elif first is not None:
        response = [_message(node.message) for node in nodes[first:]]
        if not messages:
            messages = [_message(node.message) for node in nodes[:first]]
    references = {k: v for k, v in data.items() if k not in _TASK_FIELDS}
    if answer_key not in references:
        alias = next((a for a in _ANSWER_ALIASES if a in references), None)
        if alias is not None:
            references[answer_key] = references[alias]
    metadata = {k: data[k] for k in ("idx", "id", "name") if data.get(k) is not None}
    return Sample(messages=messages, response=response, references=references, metadata=metadata)


def _scoring_deadline(task: Any, deadline_s: float | None) -> float | None:
    timeout = getattr(getattr(task, "timeout", None), "scoring", None)
    share = timeout * SCORING_SHARE if isinstance(timeout, (int, float)) and timeout > 0 else None
    return min(x for x in (deadline_s, share) if x is not None) if deadline_s is not None or share is not None else None


class VerifiersV1Reward:
    """A verifiers v1 reward over a grader, marked as ``@vf.reward`` marks a function.

    v1 calls it by parameter name with ``task`` (the TaskData), ``trace`` and ``runtime``. A grade
    that failed raises :class:`GradingError`, which v1 records on the trace as a ``TaskError``:
    ``has_error``, so prime-rl never trains on it (a bare 0 would be trained on). It is a callable
    object, not a function, so it also works as a class attribute of a ``vf.Task`` subclass
    (``correct = verifiers_v1_reward("judge.yaml")``): nothing binds ``self`` to ``task``.
    """

    reward = True  # what @vf.reward sets (verifiers/v1/utils/decorators.py mark)

    def __init__(self, grader: GraderSource, *, name: str | None = None, weight: float = 1.0, priority: int = 0,
                 deadline_s: float | None = 60.0, answer_key: str = "answer") -> None:
        self.grader = resolve_grader(grader)
        self.__name__ = self.__qualname__ = name or grader_name(self.grader, "gradekit")
        self.reward_priority, self._vf_weight = priority, float(weight)
        self.deadline_s, self.answer_key = deadline_s, answer_key
        self.__doc__ = f"gradekit reward {self.__name__!r}"

    async def __call__(self, task: Any = None, trace: Any = None, runtime: Any = None) -> float:
        grade = await graded_within(self.grader, v1_sample(task, trace, self.answer_key), _scoring_deadline(task, self.deadline_s),
                                    what=f"deadline_s, or {SCORING_SHARE:g} of the task's timeout.scoring")
        if grade.ok:
            return float(grade.score)  # type: ignore[arg-type]
        raise GradingError(f"reward {self.__name__!r}: {grade.status} ({grade.error_kind or 'error'}): {grade.error}", grade)


def verifiers_v1_reward(grader: GraderSource, **kwargs: Any) -> VerifiersV1Reward:
    """A verifiers v1 ``@vf.reward`` over a grader (plug it with ``TaskConfig.rewards``, set it as a
    ``vf.Task`` attribute, or await it from your own ``@vf.reward``); see :class:`VerifiersV1Reward`."""
    return VerifiersV1Reward(grader, **kwargs)


def verifiers_v1_group_reward(grader: GraderSource, *, name: str | None = None, weight: float = 1.0,
                              on_member_error: MemberPolicy = "renormalize", min_members: int = 2,
                              group_deadline_s: float | None = 60.0, answer_key: str = "answer") -> Any:
    """v1's group form: ``await group(task, episode)`` inside ``Env.finalize`` grades ``episode.traces``
    as one group (their members at once, a ``type: group`` grader's policy for a failed one).

    Each graded trace gets ``trace.record_reward(name, score, weight)``. A member that could not be
    graded gets ``trace.record_error(GradingError)`` instead: ``has_error``, which prime-rl skips on
    its own (its GRPO mean is over the clean traces only, so no placeholder is needed). A group that
    fails as a whole (``drop_group``, ``retry`` still failing, fewer than ``min_members`` finished)
    marks every member and raises, which fails the episode, as v1's ``finalize`` asks.
    """
    from .._members import gather_members  # noqa: PLC0415

    inner = resolve_grader(grader)
    label = name or grader_name(inner, "gradekit")
    policy = GroupPolicy(on_member_error=on_member_error, min_members=min_members, group_deadline_s=group_deadline_s)

    async def group(task: Any, episode: Any) -> list[float | None]:
        traces = list(episode.traces)
        data = getattr(task, "data", task)  # Env.finalize gets the Task; Task.score's rewards get its data
        samples = [v1_sample(data, t, answer_key) for t in traces]
        grades = await gather_members([(lambda s=s: inner(s)) for s in samples], policy.group_deadline_s)
        decided, failed, why = decide([g.score if g.ok else None for g in grades], policy)
        if decided is None:
            error = GradingError(f"group reward {label!r}: {why}", grades[failed[0]] if failed else grades[0])
            for t in traces:
                t.record_error(error)
            raise error
        out: list[float | None] = []
        for i, t in enumerate(traces):
            if i in failed:
                g = grades[i]
                t.record_error(GradingError(f"group reward {label!r}, member {i}: {g.error_kind or 'error'}: {g.error}", g))
                out.append(None)
            else:
                t.record_reward(label, decided[i], weight)
                out.append(decided[i])
        return out

    group.__name__ = group.__qualname__ = label
    group.grader = inner  # type: ignore[attr-defined]
    return group


# ---- the legacy Rubric (verifiers before 0.4; PrimeIntellect-ai/verifiers a60a606 verifiers/legacy) ------------


def _verifiers_error_class() -> type[Exception]:
    """verifiers' own InfraError when verifiers is installed (its error chain names it), else GradingError."""
    try:
        import verifiers as vf  # noqa: PLC0415

        return getattr(vf, "InfraError", GradingError)  # type: ignore[no-any-return]
    except Exception:
        return GradingError


def _mark(state: Any, message: str, grade: Grade) -> GradingError:
    error = GradingError(message, grade)
    if isinstance(state, dict) or hasattr(state, "__setitem__"):
        cls = _verifiers_error_class()
        state["error"] = error if cls is GradingError else cls(message)
    return error


def _completion(value: Any) -> Any:
    value = plain(value)
    return value


def verifiers_sample(prompt: Any, completion: Any, answer: Any, info: Any) -> Sample:
    """What a verifiers reward function is called with, as a Sample: ``answer`` and ``info`` are the references."""
    references = {**(plain(info) if isinstance(info, Mapping) else {}), **reference_dict(answer, "answer")}
    return Sample(messages=plain(prompt), response=_completion(completion), references=references)


def verifiers_reward_func(grader: GraderSource, *, name: str | None = None) -> Any:
    """A legacy verifiers ``Rubric`` reward function: ``async (prompt, completion, answer, state, info) -> float``
    (verifiers before 0.4; 0.4 ships only ``verifiers.v1``, whose tasks take :func:`verifiers_v1_reward`).

    A reward that could not be computed sets ``state["error"]`` and raises (the Rubric logs it
    and scores 0.0 beside the marker; the rollout is saved with its error and prime-rl skips it).
    """
    inner = resolve_grader(grader)
    return reward_func(inner, name or grader_name(inner, "gradekit"), "reward")


def reward_func(inner: Any, label: str, what: str, on_grade: Callable[[Grade, Any], None] | None = None) -> Any:
    """The legacy verifiers reward function around a resolved grader, named ``label``: ``on_grade(grade, state)``
    sees each grade first (a step reward writes the trajectory); a grade with no score marks ``state`` and raises."""

    async def reward(prompt: Any = None, completion: Any = None, answer: Any = None, state: Any = None,
                     info: Any = None, **kwargs: Any) -> float:
        grade = await inner(verifiers_sample(prompt, completion, answer, info))
        if on_grade is not None:
            on_grade(grade, state)
        if grade.ok:
            return float(grade.score)  # type: ignore[arg-type]
        raise _mark(state, f"{what} {label!r}: {grade.status} ({grade.error_kind or 'error'}): {grade.error}", grade)

    reward.__name__ = reward.__qualname__ = label
    reward.grader = inner  # type: ignore[attr-defined]
    return reward


def verifiers_group_reward_func(grader: GraderSource, *, name: str | None = None, on_member_error: MemberPolicy = "renormalize",
                                min_members: int = 2, group_deadline_s: float | None = None) -> Any:
    """A legacy verifiers group reward function: ``async (prompts, completions, answers, states, infos) -> list[float]``.

    The members are graded at once; ``on_member_error`` decides a group with a failed member
    (graders._members). A placeholder member's state gets ``state["error"]``, so it is not
    trained on while the group's baseline stays the finished members' mean; a group that fails
    as a whole marks every state and raises.
    """
    from .._members import gather_members  # noqa: PLC0415

    inner = resolve_grader(grader)
    label = name or grader_name(inner, "gradekit")
    policy = GroupPolicy(on_member_error=on_member_error, min_members=min_members, group_deadline_s=group_deadline_s)

    async def group_reward(prompts: Sequence[Any], completions: Sequence[Any], answers: Sequence[Any] | None = None,
                           states: Sequence[Any] | None = None, infos: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
        n = len(completions)
        answers = list(answers) if answers is not None else [None] * n
        infos = list(infos) if infos is not None else [{}] * n
        states = list(states) if states is not None else [None] * n

        def call(i: int) -> Any:
            info = plain(infos[i]) if isinstance(infos[i], Mapping) else {}
            sample = Sample(messages=plain(prompts[i]), response=_completion(completions[i]),
                            references={**info, **reference_dict(answers[i], "answer")})
            return lambda: inner(sample)

        grades = await gather_members([call(i) for i in range(n)], policy.group_deadline_s)
        decided, failed, why = decide([g.score if g.ok else None for g in grades], policy)
        if decided is None:
            for i in range(n):
                error = _mark(states[i], f"group reward {label!r}: {why}", grades[failed[0]] if failed else grades[i])
            raise error
        for i in failed:
            _mark(states[i], f"group reward {label!r}, member {i}: {grades[i].error_kind or 'error'}: {grades[i].error}", grades[i])
        return decided

    group_reward.__name__ = group_reward.__qualname__ = label
    group_reward.grader = inner  # type: ignore[attr-defined]
    return group_reward
