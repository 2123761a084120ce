"""verl: any gradekit grader as a ``custom_reward_function``.

verl calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` once per
response (the ``naive`` and ``prime`` managers) or ``compute_score(data_sources=, solution_strs=,
ground_truths=, extra_infos=)`` once per batch (the ``batch`` manager), synchronously, with the
config's ``reward_kwargs`` merged in. A dict result is read by its ``score`` key (one historical
version asserted ``reward``: both are set) and every key is appended to a per-key list, so every
call returns the same keys, all numbers.

How a verl row becomes a Sample:

- ``solution_str`` -> the response.
- ``ground_truth`` -> ``references``: a dict is merged as is; anything else is stored as
  ``references["ground_truth"]`` and also as ``references["answer"]`` (``reference_key``), so a
  grader written for ``{{references.answer}}`` (Vertex, Ark's ``extra.answer``) works unchanged.
- ``extra_info`` -> ``metadata`` (``{{metadata.key}}``), plus ``metadata["data_source"]``; its
  ``prompt`` (a string or chat messages) or else ``question`` becomes the prompt, which LLM
  rubrics read as ``question``. verl does not pass the prompt itself: put it in ``extra_info``.

An invalid sample or a judge error becomes a number only by the configured policy: a fixed
score, or ``"raise"`` (the default, as verl has no channel for "could not grade").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from .._sample import Grade, Sample
from ._common import GraderSource, GradingError, PrivateGrader, RaisePolicy, check_fixed, plain, reference_dict

VerlPolicy = float | RaisePolicy
RESULT_KEYS = ("score", "reward", "ok", "invalid", "judge_error")


def verl_references(ground_truth: Any, reference_key: str | None = "answer") -> dict[str, Any]:
    """``ground_truth`` as references: a dict merges; anything else is ``ground_truth`` and ``reference_key``."""
    if plain(ground_truth) is None:
        return {"ground_truth": None, **({reference_key: None} if reference_key else {})}
    return reference_dict(ground_truth, "ground_truth", answer_key=reference_key)


class VerlReward(PrivateGrader):
    """verl's ``compute_score`` (call it) and its batch form (:meth:`batch`) over one grader.

    Build it with :func:`verl_compute_score`. Grading runs on one private event loop in a
    thread (judge's SyncRunner), so the judge's connection pool and limiter live across calls
    and it works from a thread that already runs an event loop.
    """

    def __init__(self, grader: GraderSource, *, on_invalid: VerlPolicy = "raise", on_error: VerlPolicy = "raise",
                 reference_key: str | None = "answer", prompt_keys: Sequence[str] = ("prompt", "question")) -> None:
        check_fixed(on_invalid, "on_invalid")
        check_fixed(on_error, "on_error")
        super().__init__(grader)
        self.on_invalid, self.on_error = on_invalid, on_error
        self.reference_key, self.prompt_keys = reference_key, tuple(prompt_keys)

    # ---- the two call shapes ------------------------------------------------------------------

    def __call__(self, data_source: Any = None, solution_str: str | None = None, ground_truth: Any = None,
                 extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, float] | list[dict[str, float]]:
        """One response -> ``{"score", "reward", "ok", "invalid", "judge_error"}``.

        Called with the batch keywords (``data_sources=`` ...) it is the batch form, so one
        ``custom_reward_function.name`` serves every reward manager.
        """
        if "solution_strs" in kwargs:
            return self.batch(**kwargs)
        if not isinstance(solution_str, str):
            raise TypeError(f"compute_score needs solution_str as a string, got {type(solution_str).__name__}")
        grade = self.run(self.grader(self.sample(data_source, solution_str, ground_truth, extra_info)))
        return self.result(grade, where="")

    def batch(self, data_sources: Sequence[Any], solution_strs: Sequence[str], ground_truths: Sequence[Any],
              extra_infos: Sequence[Any] | None = None, **kwargs: Any) -> list[dict[str, float]]:
        """Every response of the batch graded concurrently (bounded by the judge's limiter), in order."""
        n = len(solution_strs)
        infos = [None] * n if extra_infos is None else list(extra_infos)
        sources, truths = list(data_sources), list(ground_truths)
        if not len(sources) == len(truths) == len(infos) == n:
            raise ValueError(f"compute_score batch: {len(sources)} data_sources, {n} solution_strs, {len(truths)} ground_truths "
                             f"and {len(infos)} extra_infos; they must be aligned")
        samples = [self.sample(sources[i], solution_strs[i], truths[i], infos[i]) for i in range(n)]

        async def all_of() -> list[Grade]:
            return list(await asyncio.gather(*(self.grader(s) for s in samples)))

        grades = self.run(all_of())
        return [self.result(g, where=f"batch item {i}: ") for i, g in enumerate(grades)]

    # ---- conversion -------------------------------------------------------------------------

    def sample(self, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> Sample:
        info = plain(extra_info) if extra_info is not None else {}
        if not isinstance(info, Mapping):
            info = {"extra_info": info}
        prompt = next((info[k] for k in self.prompt_keys if info.get(k)), None)
        return Sample(messages=prompt, response=solution_str, references=verl_references(ground_truth, self.reference_key),
                      metadata={**info, "data_source": plain(data_source)})

    def result(self, grade: Grade, *, where: str) -> dict[str, float]:
        """The same numeric keys on every call; a failed grade by the policy."""
        if grade.ok:
            score = float(grade.score)  # type: ignore[arg-type]
        else:
            knob = "on_invalid" if grade.status == "invalid" else "on_error"
            policy = self.on_invalid if grade.status == "invalid" else self.on_error
            if policy == "raise":
                raise GradingError(f"{where}{grade.status}: {grade.error} (set {knob}= a score in [-1, 1] to train on instead)", grade)
            score = float(policy)
        return {"score": score, "reward": score, "ok": float(grade.ok), "invalid": float(grade.status == "invalid"),
                "judge_error": float(grade.status == "error")}

    def __getstate__(self) -> dict[str, Any]:
        if self._source is None:
            raise TypeError("a VerlReward built from a grader object cannot be pickled; build it from a config file to send it "
                            "to Ray workers or process pools")
        return {"source": self._source, "on_invalid": self.on_invalid, "on_error": self.on_error,
                "reference_key": self.reference_key, "prompt_keys": self.prompt_keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("source"), **state)  # type: ignore[misc]


def verl_compute_score(grader: GraderSource, *, on_invalid: VerlPolicy = "raise", on_error: VerlPolicy = "raise",
                       reference_key: str | None = "answer", prompt_keys: Sequence[str] = ("prompt", "question")) -> VerlReward:
    """A verl ``compute_score`` over a grader (a Grader, or a config file or mapping).

    Args:
        on_invalid: an invalid sample (a missing reference, a python grader that raised): a
            fixed score in [-1, 1], or "raise" (:class:`GradingError`, which stops verl's step).
        on_error: a judge error that outlived its retries: a fixed score, or "raise".
        reference_key: the second name a non-dict ``ground_truth`` is stored under (besides
            ``ground_truth``); None for only ``ground_truth``.
        prompt_keys: ``extra_info`` keys tried, in order, for the prompt.

    Returns a callable for the ``naive`` manager (one response per call) whose :meth:`~VerlReward.batch`
    (or a call with the batch keywords) serves the ``batch`` manager.
    """
    return VerlReward(grader, on_invalid=on_invalid, on_error=on_error, reference_key=reference_key, prompt_keys=prompt_keys)
