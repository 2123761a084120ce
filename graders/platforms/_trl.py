"""TRL: any gradekit grader as a ``GRPOTrainer`` (and ``RLOOTrainer``) reward function.

TRL awaits an async reward function on its own event loop as
``reward_func(prompts=, completions=, completion_ids=, trainer_state=, **columns)`` where every
dataset column except ``prompt`` arrives as a list aligned with ``completions``; newer versions
add ``log_extra``, ``log_metric`` and ``environments``. It logs the rewards under the function's
``__name__``. A ``None`` reward means "not applicable to this row" and is skipped; an exception
stops training.

TRL 0.27 (huggingface/trl#4567) is the first to await an ``async def`` reward function; earlier
versions (GRPOTrainer since 0.14) call it synchronously and would get a coroutine. ``sync=None``
(the default) reads the installed TRL's version and returns a plain function for TRL < 0.27,
which runs the grading on a private event loop in a thread (so it also works when TRL's caller
already runs a loop); ``sync=True``/``False`` decides it explicitly.

Mapping: ``prompts[i]`` (a string, or chat messages in the conversational format) -> the prompt;
``completions[i]`` (a string, or ``[{"role": "assistant", "content": ...}]``) -> the response;
the aligned columns -> ``references`` (``columns`` adds aliases, e.g. ``{"answer": "solution"}``).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import itertools
import logging
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from gradekit.judge import SyncRunner

from .._sample import Grade, Sample
from ._common import GraderSource, GradingError, RaisePolicy, check_fixed, grader_name, plain, resolve_grader

log = logging.getLogger("gradekit.platforms")

# Keyword arguments TRL passes that are not dataset columns.
TRAINER_KWARGS = frozenset({"trainer_state", "num_generations", "completion_ids", "completions_ids", "log_extra", "log_metric",
                            "environments"})

TrlRewardFunc = Callable[..., Awaitable[list[float | None]]]


def _is_column(value: Any, n: int) -> bool:
    return not isinstance(value, (str, bytes, Mapping)) and hasattr(value, "__len__") and hasattr(value, "__getitem__") and len(value) == n


def trl_sample(prompt: Any, completion: Any, references: Mapping[str, Any]) -> Sample:
    """One TRL row (standard or conversational) as a Sample."""
    return Sample(messages=plain(prompt), response=plain(completion), references=dict(references))


def _say_invalid(label: str, grades: Sequence[Grade], columns: list[str]) -> None:
    """Why rows got no reward: a None is TRL's "skip this row", so a wrong column name would train on nothing, silently."""
    invalid = [g for g in grades if g.status == "invalid"]
    example = invalid[0].error or "invalid"
    wanted = re.search(r"references key '([^']+)'", example)
    key = wanted.group(1) if wanted else "answer"
    other = next((c for c in columns if c != key), "<column>")
    log.warning("reward %r: %d of %d completions are invalid and get no reward (None: TRL skips them), e.g. %s. The dataset "
                "columns it was given: %s. A reference under another column name is mapped with trl_reward_func(..., "
                "columns={%r: %r}); on_invalid= gives such rows a score instead. Said once.", label, len(invalid), len(grades),
                example, ", ".join(columns) or "none", key, other)


def trl_reward_func(
    grader: GraderSource,
    *,
    name: str | None = None,
    on_invalid: float | None = None,
    on_error: float | None | RaisePolicy = "raise",
    columns: Mapping[str, str] | None = None,
    sync: bool | None = None,
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
        sync: return a plain (synchronous) function, as TRL before 0.27 needs; None: decide by
            the installed TRL's version (an async function when TRL is absent or >= 0.27).

    The completions are graded concurrently; judge calls pass the judge's shared limiter.
    When TRL passes ``log_metric``, the share of invalid and judge-error rows is logged as
    ``<name>/invalid`` and ``<name>/judge_errors``.
    """
    check_fixed(on_invalid, "on_invalid")
    check_fixed(on_error, "on_error")
    inner = resolve_grader(grader)
    label = name or grader_name(inner, "gradekit")
    aliases = dict(columns or {})
    said: list[bool] = []  # the invalid rows' cause is said once per reward function, not every step

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
        if not said and any(g.status == "invalid" for g in grades):
            said.append(True)
            _say_invalid(label, grades, sorted(table))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and n:
            log_metric(f"{label}/invalid", sum(g.status == "invalid" for g in grades) / n)
            log_metric(f"{label}/judge_errors", sum(g.status == "error" for g in grades) / n)
        return [value(g, i) for i, g in enumerate(grades)]

    if sync is None:
        sync = trl_calls_sync()
    func: Any = reward
    if sync:
        runner: list[SyncRunner] = []
        lock = threading.Lock()

        def sync_reward(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] | None = None,
                        **kwargs: Any) -> list[float | None]:
            # One private loop for every call: the judge's connections and the limiter live across steps.
            with lock:
                if not runner:
                    runner.append(SyncRunner())
            return runner[0].run(reward(prompts, completions, completion_ids, **kwargs))

        func = sync_reward
    func.__name__ = func.__qualname__ = label
    func.grader = inner  # close it with graders.aclose_grader(reward.grader)
    return func  # type: ignore[no-any-return]


ASYNC_SINCE = (0, 27)  # huggingface/trl#4567: "Support async reward functions", first released in v0.27.0


def trl_calls_sync(version: str | None = None) -> bool:
    """Whether this TRL (the installed one by default) calls reward functions synchronously (< 0.27)."""
    if version is None:
        try:
            version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            return False  # no TRL here: the current contract (async) is the one documented
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        numbers.append(int(digits or 0))
    return tuple(numbers) < ASYNC_SINCE
