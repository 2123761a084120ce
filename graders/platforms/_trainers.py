"""The 2026 trainers that call Python: AReaL, SkyRL and ROLL (verifiers / prime-rl: ._verifiers).

Each adapter is shaped as its trainer calls it (the code read is named per class), and sends a
failed reward through the trainer's own failure channel, never as a bare 0:

========  ==================================================================================
AReaL     ``reward_fn(prompt, completions, prompt_ids, completion_ids, **data)`` run by
          ``AsyncRewardWrapper`` in a ProcessPoolExecutor under a 15 s timeout that *returns 0*
          (inclusionAI/AReaL 4aef98d ``areal/api/reward_api.py``). :class:`AReaLReward` keeps its
          own deadline below that (``deadline_s``, 12 s) and raises instead: the wrapper retries,
          then raises, and AReaL's workflow executor rejects the trajectory
          (``areal/infra/workflow_executor.py``: a workflow exception -> ``rejected``).
SkyRL     ``BaseTextEnv.step(action) -> {observations, reward, done, metadata}``, called by the
          generator directly or in its executor (NovaSky-AI/SkyRL a956457
          ``skyrl/train/generators/skyrl_gym_generator.py``). SkyRL has no per-sample mask: a
          failure raises from ``step`` (the generator does not catch it, so the step fails),
          unless ``on_error`` names a score.
ROLL      the reward worker's ``compute_rewards`` over decoded prompts, responses,
          ``non_tensor_batch["id"]`` and ``["ground_truth"]`` (alibaba/ROLL 8eb27cc
          ``roll/pipeline/rlvr/rewards/llm_judge_reward_worker.py``). ROLL rebuilds its loss
          mask after the reward (``roll/utils/functionals.py`` ``get_sample_level_mask``), so a
          worker cannot mask one sample: within a group (``origin_prompt_id``) a failed member
          is decided by ``on_member_error`` (a placeholder at the finished members' mean has
          advantage 0); a group that fails as a whole raises.
========  ==================================================================================
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._members import GroupPolicy, MemberPolicy, decide
from .._sample import Grade, Sample
from ._common import GraderSource, GradingError, PrivateGrader, check_fixed, graded_within, plain, reference_dict

FailurePolicy = float | str  # "raise" or a fixed score in [-1, 1]


def _failure(grade: Grade, policy: FailurePolicy, where: str) -> float:
    if policy == "raise":
        raise GradingError(f"{where}{grade.status} ({grade.error_kind or 'error'}): {grade.error}", grade)
    return float(policy)


# ---- AReaL --------------------------------------------------------------------------------------

_AREAL_SHARED: dict[str, PrivateGrader] = {}  # per process: AsyncRewardWrapper pickles the function for every call
_AREAL_LOCK = threading.Lock()


class AReaLReward:
    """AReaL's ``reward_fn`` over a grader config, picklable for ``AsyncRewardWrapper``'s process pool.

    ``completions`` is the decoded completion (one string); ``**data`` are the dataset row's
    fields (``answer``, ``solutions``, ...), which become references (``answer_key`` names the
    one a non-dict reference is stored under too). A judge error or ``deadline_s`` passing
    raises :class:`GradingError`; ``on_error`` may name a fixed score instead.
    """

    def __init__(self, grader: str | Path | Mapping[str, Any], *, deadline_s: float | None = 12.0,
                 on_error: FailurePolicy = "raise", on_invalid: FailurePolicy = "raise", answer_key: str = "answer") -> None:
        if not isinstance(grader, (str, Path, Mapping)):
            raise TypeError("AReaLReward needs a grader config (a file or a mapping): AReaL pickles the reward "
                            "function into its process pool, and a config is what rebuilds it there")
        check_fixed(on_error, "on_error")
        check_fixed(on_invalid, "on_invalid")
        self.source = str(grader) if isinstance(grader, Path) else grader
        self.deadline_s, self.on_error, self.on_invalid, self.answer_key = deadline_s, on_error, on_invalid, answer_key

    def _private(self) -> PrivateGrader:
        key = repr(sorted(self.source.items())) if isinstance(self.source, Mapping) else str(self.source)
        with _AREAL_LOCK:
            if key not in _AREAL_SHARED:
                _AREAL_SHARED[key] = PrivateGrader(self.source)
            return _AREAL_SHARED[key]

    def sample(self, prompt: Any, completions: Any, data: Mapping[str, Any]) -> Sample:
        references: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("prompt", "messages"):
                continue
            value = plain(value)
            references.update(value if isinstance(value, Mapping) else {key: value})
        if self.answer_key not in references:
            for alias in ("solution", "solutions", "ground_truth", "label"):
                if alias in references:
                    references[self.answer_key] = references[alias]
                    break
        messages = plain(data.get("messages")) or (plain(prompt) if prompt is not None else None)
        return Sample(messages=messages, response=plain(completions), references=references)

    def __call__(self, prompt: Any, completions: Any, prompt_ids: Any = None, completion_ids: Any = None, **data: Any) -> float:
        private = self._private()
        grade = private.run(graded_within(private.grader, self.sample(prompt, completions, data), self.deadline_s))
        if grade.ok:
            return float(grade.score)  # type: ignore[arg-type]
        policy = self.on_invalid if grade.status == "invalid" else self.on_error
        return _failure(grade, policy, "AReaL reward: ")


def areal_reward_fn(grader: str | Path | Mapping[str, Any], **kwargs: Any) -> AReaLReward:
    """AReaL's ``reward_fn`` (pass it to ``RLVRWorkflow(reward_fn=...)``); see :class:`AReaLReward`."""
    return AReaLReward(grader, **kwargs)


# ---- ROLL ---------------------------------------------------------------------------------------


class ROLLRewards:
    """What a ROLL reward worker's ``_compute_rewards_impl`` computes, over a grader.

    Call it with the decoded prompts and responses and the batch's ``ground_truth`` (and
    ``group_ids``: ``origin_prompt_id``, to decide groups with a failed member); it returns
    ``{"response_level_rewards", "scores", "member_failed"}`` lists in batch order, which the
    worker turns into its tensors. A group that fails as a whole raises :class:`GradingError`.
    """

    def __init__(self, grader: GraderSource, *, on_member_error: MemberPolicy = "renormalize", min_members: int = 2,
                 group_deadline_s: float | None = None) -> None:
        self.private = PrivateGrader(grader)
        self.policy = GroupPolicy(on_member_error=on_member_error, min_members=min_members, group_deadline_s=group_deadline_s)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[Any],
                 group_ids: Sequence[Any] | None = None, ids: Sequence[Any] | None = None) -> dict[str, list[float]]:
        from .._members import gather_members  # noqa: PLC0415

        n = len(responses)
        if not len(prompts) == len(ground_truths) == n:
            raise ValueError(f"ROLL rewards: {len(prompts)} prompts, {n} responses, {len(ground_truths)} ground truths")
        keys = list(group_ids) if group_ids is not None else list(range(n))
        samples = [Sample(messages=plain(prompts[i]), response=plain(responses[i]),
                          references=reference_dict(ground_truths[i], "ground_truth")) for i in range(n)]
        groups: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(plain(key), []).append(i)

        async def one_group(members: list[int]) -> list[Grade]:
            calls = [(lambda s=samples[i]: self.private.grader(s)) for i in members]
            return await gather_members(calls, self.policy.group_deadline_s)

        async def all_groups() -> list[list[Grade]]:
            return list(await asyncio.gather(*(one_group(m) for m in groups.values())))

        rewards, failed_flags = [0.0] * n, [0.0] * n
        for members, grades in zip(groups.values(), self.private.run(all_groups())):
            decided, failed, why = decide([g.score if g.ok else None for g in grades], self.policy)
            if decided is None:
                where = ids[members[0]] if ids is not None else members[0]
                first = grades[failed[0]]
                raise GradingError(f"ROLL rewards: group of sample {where}: {why}: {first.error_kind}: {first.error}", first)
            for j, i in enumerate(members):
                rewards[i], failed_flags[i] = decided[j], float(j in failed)
        return {"response_level_rewards": rewards, "scores": list(rewards), "member_failed": failed_flags}

    def close(self) -> None:
        self.private.close()


def roll_rewards(grader: GraderSource, **kwargs: Any) -> ROLLRewards:
    """ROLL's reward computation over a grader; see :class:`ROLLRewards`."""
    return ROLLRewards(grader, **kwargs)
