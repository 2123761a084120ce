"""TRL: any gradekit grader as a ``GRPOTrainer`` (and ``RLOOTrainer``) reward function.

TRL awaits an async reward function on its own event loop as
``reward_func(prompts=, completions=, completion_ids=, trainer_state=, **columns)`` where every
dataset column except ``prompt`` arrives as a list aligned with ``completions``; newer versions
add ``log_extra``, ``log_metric`` and ``environments``. It logs the rewards under the function's
``__name__``. A ``None`` reward means "not applicable to this row" and is skipped; an exception
stops training.

Mapping: ``prompts[i]`` (a string, or chat messages in the conversational format) -> the prompt;
``completions[i]`` (a string, or ``[{"role": "assistant", "content": ...}]``) -> the response;
the aligned columns -> ``references`` (``columns`` adds aliases, e.g. ``{"answer": "solution"}``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .._sample import Grade, Sample
from ._common import GraderSource, GradingError, RaisePolicy, check_fixed, grader_name, plain, resolve_grader

# Keyword arguments TRL passes that are not dataset columns.
TRAINER_KWARGS = frozenset({"trainer_state", "num_generations", "completion_ids", "completions_ids", "log_extra", "log_metric",
                            "environments"})

TrlRewardFunc = Callable[..., Awaitable[list[float | None]]]


def _is_column(value: Any, n: int) -> bool:
    return not isinstance(value, (str, bytes, Mapping)) and hasattr(value, "__len__") and hasattr(value, "__getitem__") and len(value) == n


def trl_sample(prompt: Any, completion: Any, references: Mapping[str, Any]) -> Sample:
    """One TRL row (standard or conversational) as a Sample."""
    return Sample(messages=plain(prompt), response=plain(completion), references=dict(references))


def trl_reward_func(
    grader: GraderSource,
    *,
    name: str | None = None,
    on_invalid: float | None = None,
    on_error: float | None | RaisePolicy = "raise",
    columns: Mapping[str, str] | None = None,
) -> TrlRewardFunc:
    """An async TRL reward function over a grader (a Grader, or a config file or mapping).

    Args:
        name: the function's ``__name__``, which TRL logs the reward under
            (``rewards/<name>/mean``); default: the grader's name.
        on_invalid: an invalid sample (e.g. a missing reference column): None (TRL skips it
            for this function) or a fixed score in [-1, 1].
        on_error: a judge error that outlived its retries: "raise" (the default: TRL stops, as
            it would for any failing reward function), None (skipped) or a fixed score.
        columns: extra reference names for dataset columns, ``{reference_key: column}``.

    The completions are graded concurrently; judge calls pass the judge's shared limiter.
    When TRL passes ``log_metric``, the share of invalid and judge-error rows is logged as
    ``<name>/invalid`` and ``<name>/judge_errors``.
    """
    check_fixed(on_invalid, "on_invalid")
    check_fixed(on_error, "on_error")
    inner = resolve_grader(grader)
    label = name or grader_name(inner, "gradekit")
    aliases = dict(columns or {})

    def value(grade: Grade, index: int) -> float | None:
        if grade.ok:
            return grade.score
        policy = on_invalid if grade.status == "invalid" else on_error
        if policy == "raise":
            raise GradingError(f"reward {label!r}, completion {index}: {grade.status}: {grade.error} "
                               "(set on_error=None to skip such rows, or a score to train on instead)", grade)
        return None if policy is None else float(policy)

    async def reward(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] | None = None,
                     **kwargs: Any) -> list[float | None]:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"reward {label!r}: {len(prompts)} prompts for {n} completions")
        table = {k: v for k, v in kwargs.items() if k not in TRAINER_KWARGS and _is_column(v, n)}
        for key, column in aliases.items():
            if column not in table:
                raise ValueError(f"reward {label!r}: columns maps {key!r} to {column!r}, which is not a dataset column "
                                 f"(columns: {', '.join(sorted(table)) or 'none'})")
            table[key] = table[column]
        samples = [trl_sample(prompts[i], completions[i], {k: plain(v[i]) for k, v in table.items()}) for i in range(n)]
        grades = await asyncio.gather(*(inner(s) for s in samples))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and n:
            log_metric(f"{label}/invalid", sum(g.status == "invalid" for g in grades) / n)
            log_metric(f"{label}/judge_errors", sum(g.status == "error" for g in grades) / n)
        return [value(g, i) for i, g in enumerate(grades)]

    reward.__name__ = reward.__qualname__ = label
    reward.grader = inner  # type: ignore[attr-defined]  # close it with graders.aclose_grader(reward.grader)
    return reward
