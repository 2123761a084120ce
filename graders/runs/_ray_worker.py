"""What a Ray judge actor holds: a Judge and rubric, or a grader, with its own limiter and cache.

Plain classes, wrapped with ``ray.remote`` where they are used, so this module imports no Ray
and the actor's code is the same whether the file runner or :func:`grade_dataset` starts it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from gradekit.judge._spec import DEFAULT_CONCURRENCY, JudgeSpec


class WorkerSpec(BaseModel):
    """Everything an actor needs to build its judge or grader on whichever node it lands.

    Paths (a rubric spec given as a path, a grader config and the files it names) must be
    readable at the same place on every node: a shared folder, or the image the nodes run.
    """

    rubric: Any = None  # a Rubric (pickled whole, so a user's spec need not be on the node)
    grader_config: str | None = None  # or: the path of a grader config
    grader: Any = None  # or: a grader callable (grade_dataset), shipped by cloudpickle
    # The judge as one judge._spec.JudgeSpec (limits.url: "ray", the cluster's actor; redis://...; None, this actor only).
    # With a grader file it is the command line's layer, over the file's judge block, as in a local run.
    judge: Any = None
    # With a grader file: the environment's layer (OPENAI_BASE_URL, GRADEKIT_MODEL, ...), beneath the file's block.
    judge_defaults: Any = None
    concurrency: int = DEFAULT_CONCURRENCY  # grades in flight per actor (a rubric's judge paces with its own limiter too)
    cache: str | None = None  # a SQLite path (each node its own file) or redis://host:port/db
    no_cache: bool = False


class JudgeWorker:
    """Judges batches of prepared rows; each batch's outcomes come back in its order.

    Errors stay per row: a row whose grader raises gets that row's error outcome, never a
    failed batch, so the only batch failure the driver sees is the actor dying.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        from gradekit.judge import open_cache

        self.spec = spec
        self.cache = None if spec.no_cache else open_cache(spec.cache)
        judge = spec.judge or JudgeSpec()
        self.limiter = judge.limiter()

        defaults = spec.judge_defaults

        def make_judge(settings: Any = None) -> Any:
            # The layers a local run has: the environment, a grader file's judge: block, the command line.
            wanted = JudgeSpec.merge(defaults or JudgeSpec(), judge) if settings is None else settings.under(judge, defaults)
            return wanted.build(limiter=self.limiter, cache=self.cache)

        self.judge = make_judge() if spec.rubric is not None else None
        if spec.grader_config is not None:
            from .._config import FileJudge, load_grader

            self.grader = load_grader(spec.grader_config, judge=FileJudge(make_judge))
        else:
            self.grader = spec.grader
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots = loop, asyncio.Semaphore(self.spec.concurrency)
        return self._slots  # type: ignore[return-value]

    async def _one(self, item: Any) -> Any:
        from .._sample import Grade

        if self.judge is not None:
            return await self.judge.judge(self.spec.rubric, item)  # the Judge's own limiter caps concurrency
        async with self._semaphore():
            try:
                return await self.grader(item)
            except Exception as e:  # a grader bug is that row's error, not the end of the run
                return Grade.failed("error", f"the grader raised {type(e).__name__}: {e}", error_kind="exception")

    async def judge_batch(self, items: list[Any]) -> list[Any]:
        return list(await asyncio.gather(*(self._one(item) for item in items)))

    def ping(self) -> bool:
        return True
