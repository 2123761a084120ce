"""Step rewards (process rewards) through the doors of the trainers that take them.

A grader whose rubric has ``granularity: step`` (an ``llm`` node with ``granularity: step``) gives
one score per assistant step, in ``grade.columns["step_scores"]`` (None for a step the judge could
not judge). Two trainers take a reward per step from their own API, read in their code:

=========  ==============================================================================================
verifiers  each model turn of a rollout is one entry of ``state["trajectory"]``, a ``TrajectoryStep``
           with a ``reward`` field (PrimeIntellect-ai/verifiers a60a606 ``verifiers/legacy/types.py``:
           ``TrajectoryStep``, ``State.add_step_reward`` writes ``trajectory[-1]["reward"]``); the Rubric
           fills only the steps whose reward is still None with the rollout's reward
           (``verifiers/legacy/rubrics/rubric.py``). :func:`verifiers_step_reward_func` writes each
           assistant step's score there and returns their aggregate as the rollout's reward.
SkyRL      a multi-turn ``BaseTextEnv.step`` returns a reward per turn, and the generator puts each on
           the last token of that turn (NovaSky-AI/SkyRL a956457 ``skyrl/train/generators/
           skyrl_gym_generator.py``: ``per_step_rewards``, ``_build_per_token_rewards``; the docs'
           "Turn-level Rewards"). :class:`GradekitStepEnv` wraps the environment that runs the tools and
           returns the judge's score of each turn, judged with the turns before it as context.
=========  ==============================================================================================

A step the judge could not judge is never a reward of 0: verifiers gets the rollout marked with
``state["error"]`` (its step keeps no reward) and the call raises; SkyRL raises from ``step``
(the generator does not catch it) unless ``on_error`` names a score.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from .._sample import Grade, Sample
from ._common import GraderSource, GradingError, PrivateGrader, check_fixed, graded_within, grader_name, plain, reference_dict, resolve_grader
from ._skyrl import _TextEnvBase, _get
from ._trainers import FailurePolicy, _failure
from ._verifiers import _mark, reward_func


def step_scores(grade: Grade, where: str) -> list[float | None]:
    """The per-step scores a step grader gave, or a GradingError naming what is missing."""
    scores = grade.columns.get("step_scores")
    if not isinstance(scores, list):
        raise GradingError(f"{where}: the grader gives no step_scores: use an llm grader with granularity: step "
                           f"({grade.status}: {grade.error or 'no per-step verdicts'})", grade)
    return scores


# ---- verifiers ------------------------------------------------------------------------------------


def verifiers_step_reward_func(grader: GraderSource, *, name: str | None = None) -> Any:
    """A verifiers ``Rubric`` reward function that also sets each model turn's reward.

    ``async (prompt, completion, answer, state, info) -> float``: the rollout (prompt and completion,
    tool results included) is graded by a step grader; ``state["trajectory"][i]["reward"]`` gets the
    i-th assistant step's score, and the return value is the steps' aggregate (the row's score). A
    rollout whose model turns and assistant steps do not line up, or with a step the judge could
    not judge, sets ``state["error"]`` and raises.
    """
    inner = resolve_grader(grader)
    label = name or grader_name(inner, "gradekit_steps")

    def set_steps(grade: Grade, state: Any) -> None:
        scores = step_scores(grade, f"step reward {label!r}")
        trajectory = state.get("trajectory") if isinstance(state, Mapping) or hasattr(state, "get") else None
        if isinstance(trajectory, list) and trajectory:
            if len(trajectory) != len(scores):
                raise _mark(state, f"step reward {label!r}: the rollout has {len(trajectory)} model turns but the judge "
                                   f"judged {len(scores)} assistant steps", grade)
            for step, score in zip(trajectory, scores):
                if score is not None and isinstance(step, dict):
                    step["reward"] = float(score)

    return reward_func(inner, label, "step reward", set_steps)


# ---- SkyRL ------------------------------------------------------------------------------------------


_SHARED: dict[str, PrivateGrader] = {}


def _env_class(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"env_config.env must be 'module:Class' (the environment that runs the tools), got {path!r}")
    return getattr(importlib.import_module(module), attr)


class GradekitStepEnv(_TextEnvBase):  # type: ignore[misc, valid-type]
    """A SkyRL multi-turn environment whose reward for each turn is the judge's score of that turn.

    ``env_config``: ``grader`` (a grader config with ``granularity: step``), ``env`` (``module:Class``,
    the environment that runs the tools and says when the episode is done; without it every episode
    is one turn), ``env_config`` (that environment's own config), ``on_error`` (``raise`` or a score),
    ``deadline_s``, ``add_env_reward`` (add the wrapped environment's own reward). ``extras`` is the
    dataset row, as for :class:`GradekitTextEnv` (``reward_spec.ground_truth`` are the references).

    Each turn the trajectory so far is graded and the newest step's score is this turn's reward; the
    steps before it are the same requests as at their own turn, so a judge with a cache answers them
    from it and only the new step is sent.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        source = _get(env_config, "grader")
        if source is None:
            raise ValueError("the gradekit step environment needs env_config.grader (a grader config with granularity: step)")
        if str(source) not in _SHARED:
            _SHARED[str(source)] = PrivateGrader(str(source))
        self.private = _SHARED[str(source)]
        self.on_error: FailurePolicy = _get(env_config, "on_error", "raise")
        check_fixed(self.on_error, "on_error")
        self.deadline_s = _get(env_config, "deadline_s", None)
        self.add_env_reward = bool(_get(env_config, "add_env_reward", False))
        extras = dict(extras or {})
        spec = plain(extras.get("reward_spec") or {})
        self.references = reference_dict(spec.get("ground_truth") if isinstance(spec, Mapping) else None, "ground_truth")
        inner = _get(env_config, "env")
        self.inner = _env_class(str(inner))(_get(env_config, "env_config"), extras) if inner else None
        if self.inner is not None:
            self.max_turns = getattr(self.inner, "max_turns", self.max_turns)
        self.prompt: Any = None
        self.history: list[dict[str, Any]] = []

    def init(self, prompt: Any) -> tuple[Any, dict[str, Any]]:
        self.prompt = plain(prompt)
        self.history = []
        if self.inner is not None:
            return self.inner.init(prompt)
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        self.turns += 1
        if self.inner is not None:
            out = dict(self.inner.step(action))
        else:
            out = {"observations": [], "reward": 0.0, "done": True, "metadata": {}}
        self.history.append({"role": "assistant", "content": action})
        self.history.extend(plain(o) for o in out.get("observations") or [] if isinstance(o, Mapping))
        sample = Sample(messages=self.prompt, response=list(self.history), references=self.references)
        grade = self.private.run(graded_within(self.private.grader, sample, self.deadline_s))
        scores = grade.columns.get("step_scores") if isinstance(grade.columns.get("step_scores"), list) else None
        score = scores[-1] if scores else None
        metadata = {**(out.get("metadata") or {}), "grade_status": grade.status, "error_kind": grade.error_kind, "error": grade.error,
                    "env_reward": out.get("reward")}
        if score is None:  # this turn was not judged: never a 0
            if scores is None and grade.ok:
                step_scores(grade, "SkyRL gradekit step env")  # raises: not a step grader
            reward = _failure(grade, self.on_error, "SkyRL gradekit step env: ")
        else:
            reward = float(score)
        if self.add_env_reward and isinstance(out.get("reward"), (int, float)):
            reward += float(out["reward"])
        return {**out, "reward": reward, "metadata": metadata}

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
