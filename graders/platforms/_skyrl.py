"""SkyRL: a gradekit grader as a SkyRL text environment (``BaseTextEnv``), in its own module
because ``skyrl_gym`` (when installed) imports pandas. See graders.platforms._trainers for the
contract as read (NovaSky-AI/SkyRL a956457 ``skyrl/train/generators/skyrl_gym_generator.py``,
``examples/train/llm_as_a_judge/llm_judge_env.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._sample import Sample
from ._common import PrivateGrader, check_fixed, graded_within, plain, reference_dict
from ._trainers import FailurePolicy, _failure

# ---- SkyRL --------------------------------------------------------------------------------------


def _get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if callable(getter):  # OmegaConf DictConfig
        return getter(key, default)
    return getattr(config, key, default)


try:  # SkyRL's base class when skyrl-gym is installed (it is light: pip install skyrl-gym)
    from skyrl_gym.envs.base_text_env import BaseTextEnv as _TextEnvBase
except ImportError:  # the same three methods, so the adapter works (and is tested) without it
    class _TextEnvBase:  # type: ignore[no-redef]
        def __init__(self) -> None:
            self.turns, self.max_turns = 0, 1

        def init(self, prompt: Any) -> tuple[Any, dict[str, Any]]:
            return prompt, {}

        def close(self) -> None:
            pass


_SKYRL_SHARED: dict[str, PrivateGrader] = {}


class GradekitTextEnv(_TextEnvBase):  # type: ignore[misc, valid-type]
    """A single-turn SkyRL text environment whose reward is a gradekit grader.

    Register it: ``skyrl_gym.envs.register(id="gradekit", entry_point="gradekit.graders.platforms:GradekitTextEnv")``
    and set ``environment.env_class: gradekit`` with ``skyrl_gym.gradekit: {grader: grader.yaml}``
    (``on_error``: ``raise`` or a score; ``deadline_s``). ``extras`` is the dataset row:
    ``reward_spec.ground_truth`` becomes the references (a dict merges; anything else is
    ``ground_truth`` and ``answer``). ``metadata`` carries the grade's status and error.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        source = _get(env_config, "grader")
        if source is None:
            raise ValueError("the gradekit SkyRL environment needs env_config.grader (a grader config file)")
        key = str(source)
        if key not in _SKYRL_SHARED:  # one grader (and judge, and limiter) per process, not per episode
            _SKYRL_SHARED[key] = PrivateGrader(str(source))
        self.private = _SKYRL_SHARED[key]
        self.on_error: FailurePolicy = _get(env_config, "on_error", "raise")
        check_fixed(self.on_error, "on_error")
        self.deadline_s = _get(env_config, "deadline_s", None)
        extras = dict(extras or {})
        spec = plain(extras.get("reward_spec") or {})
        self.references = reference_dict(spec.get("ground_truth") if isinstance(spec, Mapping) else None, "ground_truth")
        self.prompt: Any = None

    def init(self, prompt: Any) -> tuple[Any, dict[str, Any]]:
        self.prompt = plain(prompt)
        return prompt, {}

    def step(self, action: str) -> dict[str, Any]:
        sample = Sample(messages=self.prompt, response=action, references=self.references)
        grade = self.private.run(graded_within(self.private.grader, sample, self.deadline_s))
        metadata = {"grade_status": grade.status, "error_kind": grade.error_kind, "error": grade.error}
        reward = float(grade.score) if grade.ok else _failure(grade, self.on_error, "SkyRL gradekit env: ")  # type: ignore[arg-type]
        return {"observations": [], "reward": reward, "done": True, "metadata": metadata, "postprocessed_action": None}
