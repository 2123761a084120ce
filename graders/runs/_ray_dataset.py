"""``grade_dataset``: grade columns added to a Ray Data pipeline, lazily, by a pool of judge actors.

For users who build their own pipelines (read from S3, write to a lake): nothing runs until the
dataset is consumed. Each actor of the pool is a :class:`JudgeWorker`, the same that
``gradekit grade --ray`` uses, with its own ``concurrency`` and, by default, the cluster's one
limiter actor.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._ray_worker import JudgeWorker, WorkerSpec

if TYPE_CHECKING:
    from gradekit.judge._spec import Limits


class _GradeBatches:
    """The callable class Ray Data runs on each pool actor: a batch of rows in, rows with grades out."""

    def __init__(self, spec: WorkerSpec, mapping: dict[str, str] | None) -> None:
        self.worker = JudgeWorker(spec)
        self.spec, self.mapping = spec, mapping
        self.loop = asyncio.new_event_loop()  # one loop per actor: the judge's HTTP client lives in it

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        from .._sample import Grade
        from ._file import _variables, grader_row, result_row
        from ._io import RowError
        from ._rows import RowMapping
        from gradekit.judge import Verdict

        rows = batch.to_dict("records")
        items: list[Any] = []
        errors: dict[int, Any] = {}
        rubric = self.spec.rubric
        mapper = None if rubric is not None else RowMapping.build(self.mapping, list(batch.columns))
        for i, row in enumerate(rows):
            row = {k: (None if _missing(v) else v) for k, v in row.items()}
            rows[i] = row
            try:
                items.append(_variables(row, rubric, self.mapping, i) if rubric is not None else mapper.sample(row, f"row {i}"))  # type: ignore[union-attr]
            except RowError as e:
                errors[i] = (Verdict(status="error", error_kind="input", error=str(e)) if rubric is not None
                             else Grade.failed("error", str(e), error_kind="input"))
                items.append(None)
        todo = [i for i in range(len(rows)) if i not in errors]
        outcomes = self.loop.run_until_complete(self.worker.judge_batch([items[i] for i in todo]))
        by_index = {**errors, **dict(zip(todo, outcomes))}
        out = []
        for i, row in enumerate(rows):
            if rubric is not None:
                out.append(result_row(row, by_index[i]))
            else:
                graded = grader_row(row, by_index[i])
                # JSON text, as in a file: a column of objects with varying keys has no one Arrow type.
                graded["parts"] = json.dumps(graded["parts"]) if graded["parts"] is not None else None
                graded["metrics"] = json.dumps(graded["metrics"]) if graded["metrics"] is not None else None
                out.append(graded)
        return pd.DataFrame(out)


def _missing(value: Any) -> bool:
    try:
        return value is None or (isinstance(value, float) and value != value)  # pandas fills gaps with NaN
    except Exception:  # noqa: BLE001
        return False


def _limits(limiter: Any, concurrency: int) -> Limits:
    """A limiter (object or URL) -> the limits each actor builds its own share of it from."""
    from gradekit.judge._spec import Limits

    if limiter is None or isinstance(limiter, str):
        return Limits(url=limiter or "ray", key="default", concurrency=concurrency)
    from gradekit.judge import Limiter, RayLimiter, SharedLimiter

    if isinstance(limiter, RayLimiter):
        return Limits(url="ray", rps=limiter.rps, tpm=limiter.tpm, key=limiter.key, concurrency=limiter.concurrency)
    if isinstance(limiter, SharedLimiter):
        return Limits(url=limiter.url, rps=limiter.rps, tpm=limiter.tpm, key=limiter.key, concurrency=limiter.concurrency)
    if isinstance(limiter, Limiter):  # each actor its own copy: the rates multiply by the pool size
        return Limits(url=None, rps=limiter.rps, tpm=limiter.tpm, key="default", concurrency=limiter.concurrency)
    raise TypeError(f"limiter must be a limiter URL ('ray', 'redis://...') or a Limiter, RayLimiter or SharedLimiter, not {type(limiter).__name__}")


def grade_dataset(
    ds: Any,
    grader_or_rubric: Any,
    mapping: Mapping[str, str] | None = None,
    *,
    workers: int | None = None,
    concurrency: int = 16,
    limiter: Any = None,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    cache: str | None = None,
    batch_size: int = 64,
) -> Any:
    """Add grade columns to a ``ray.data.Dataset``, lazily.

    Args:
        ds: the rows.
        grader_or_rubric: a Rubric, a rubric name or spec path, or a grader (an async callable,
            shipped to the actors by cloudpickle).
        mapping: a rubric's {variable: column} (unmapped variables read their own column), or a
            grader's {sample path: column} as for :func:`grade_frame`.
        workers: judge actors [default: one per CPU of the cluster, at most 64].
        concurrency: requests in flight per actor.
        limiter: ``"ray"`` (default: the cluster's limiter actor, rates shared by every actor),
            ``"redis://..."``, or a ``RayLimiter``/``SharedLimiter`` whose rates and key the
            actors share; a plain ``Limiter`` is copied into each actor (its rates multiply).
        model, base_url, api_key: the judge endpoint [default: this process's environment].
        cache: the actors' response cache: ``redis://host:port/db``, or a SQLite path on each node.
        batch_size: rows per actor call.

    Returns:
        A dataset of the input rows with the result columns a file run writes (an input column
        a result would overwrite is kept as ``input_<name>``).
    """
    import os

    from gradekit.judge import Rubric, load_rubric
    from gradekit.judge._spec import JudgeSpec

    from ._ray import default_workers, import_ray

    import_ray()
    if isinstance(grader_or_rubric, (str, os.PathLike)):
        grader_or_rubric = load_rubric(grader_or_rubric)
    limits = _limits(limiter, concurrency)
    # The judge as a spec: what the arguments give, else this process's environment (read here, on the driver).
    judge = JudgeSpec.of(model or os.environ.get("GRADEKIT_MODEL"), base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
                         api_key=api_key or os.environ.get("OPENAI_API_KEY"), limits=limits)
    common = {"judge": judge, "concurrency": limits.concurrency, "cache": cache, "no_cache": cache is None}
    if isinstance(grader_or_rubric, Rubric):
        variables = {var: var for var in grader_or_rubric.variables}
        variables.update(mapping or {})
        spec = WorkerSpec(rubric=grader_or_rubric, **common)
        mapped: dict[str, str] | None = variables
    else:
        spec = WorkerSpec(grader=grader_or_rubric, **common)
        mapped = dict(mapping) if mapping else None
    import ray.data

    size = workers or default_workers() if ray_initialized() else (workers or 1)
    return ds.map_batches(_GradeBatches, fn_constructor_kwargs={"spec": spec, "mapping": mapped}, batch_size=batch_size,
                          batch_format="pandas", compute=ray.data.ActorPoolStrategy(size=size), num_cpus=0.5)


def ray_initialized() -> bool:
    import ray

    return ray.is_initialized()
