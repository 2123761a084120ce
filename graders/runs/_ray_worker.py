"""What a Ray judge actor holds: a Judge and rubric, or a grader, with its own limiter and cache.

Plain classes, wrapped with ``ray.remote`` where they are used, so this module imports no Ray
and the actor's code is the same whether the file runner or :func:`grade_dataset` starts it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from gradekit.judge._spec import JudgeSpec


class WorkerSpec(BaseModel):
    """Everything an actor needs to build its judge or grader on whichever node it lands.

    Paths (a rubric spec given as a path, a grader config and the files it names) must be
    readable at the same place on every node: a shared folder, or the image the nodes run.
    """

    rubric: Any = None  # a Rubric (pickled whole, so a user's spec need not be on the node)
    grader_config: str | None = None  # or: the path of a grader config
    grader: Any = None  # or: a grader callable (grade_dataset), shipped by cloudpickle
    model: str | None = None
    base_url: str | list[str] | None = None  # several: a fleet, each endpoint a bucket of the limiter actor
    api_key: str | list[str] | None = None
    timeout: float = 60.0
    limiter: str | None = "ray"  # a limiter URL: "ray" (the cluster's actor), redis://..., None (this actor only)
    limiter_key: str = "default"
    rps: float | None = None
    tpm: float | None = None
    concurrency: int = 16
    adapt: bool = True  # self-pacing to the provider's rate-limit headers and 429s (--no-adapt: False)
    cache: str | None = None  # a SQLite path (each node its own file) or redis://host:port/db
    no_cache: bool = False
    params: dict[str, Any] = {}  # the judge parameters (--judge-param and its shorthands)
    judge: Any = None  # the judge as one judge._spec.JudgeSpec (the command line's); it wins over the fields above
    # With a grader file: the environment's judge (OPENAI_BASE_URL, GRADEKIT_MODEL, --timeout's default), a JudgeSpec
    # beneath the file's judge block, which ``judge`` (then the command line's alone) goes over.
    judge_defaults: Any = None

    def judge_spec(self) -> JudgeSpec:
        """The judge these settings describe; a grader config's ``judge:`` block goes beneath it, as in a local run."""
        from gradekit.judge._spec import JudgeSpec, Limits

        if self.judge is not None:
            return self.judge

        limits = Limits(rps=self.rps, tpm=self.tpm, concurrency=self.concurrency, adapt=self.adapt, url=self.limiter, key=self.limiter_key)
        return JudgeSpec.of(self.model, base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, params=self.params or None,
                            limits=limits)


class JudgeWorker:
    """Judges batches of prepared rows; each batch's outcomes come back in its order.

    Errors stay per row: a row whose grader raises gets that row's error outcome, never a
    failed batch, so the only batch failure the driver sees is the actor dying.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        from gradekit.judge import open_cache
        from gradekit.judge._spec import JudgeSpec

        self.spec = spec
        self.cache = None if spec.no_cache else open_cache(spec.cache)
        judge = spec.judge_spec()
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
