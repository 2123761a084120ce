"""The library door for a run: ``grade(input, output, plan)`` picks the run and returns its record, filled.

A :class:`GradePlan` says what to grade with (a rubric or a grader config), which judge, and the
run's options; ``grade`` resolves the input once, builds the judge the plan describes and chooses
the run: a rubric's (``runs._file.grade_file``), a grader config's (``grade_file_with``), a pairwise
rubric's (``calibration.grade_pairwise_file``), the provider's Batch API (``runs._provider_batch``) or a
Ray cluster's (``runs._ray``). The run fills its own record (``runs._record``): its cost at the price table,
its pacing, an eval definition's figures, a jury's or cascade's block. `gradekit grade` is this call
with a plan built from its flags; a Python user gets the same output file and the same record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from gradekit.judge import Budget, JudgeProtocol
    from gradekit.judge._limiter import RequestLimiter
    from gradekit.judge._protocol import JudgeStats

    from ..runs._io import RunInput


class GradePlan(BaseModel):
    """What one run grades with, which judge, and how: every choice of ``gradekit grade`` as a field.

    ``judge`` is the run's judge as a spec (a ``JudgeSpec``, a ``JurySpec``, or any spec whose
    ``build(cache=, budget=, limiter=)`` makes one); ``judge_defaults`` holds beneath a grader
    config's ``judge:`` block and ``judge`` over it, so the run's judge without a file is
    ``judge_defaults.merge(judge)``. ``cache`` is where replies are kept: a SQLite path or a
    ``redis://`` URL, None for the user cache directory, False for none.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    rubric: Any = None  # a Rubric, or its name, or the path of its .yaml
    grader: Path | None = None  # instead of a rubric: a grader config file (.yaml/.json)
    mapping: dict[str, str] = Field(default_factory=dict)  # rubric variable (grader: sample path) -> input column
    judge: Any = None  # [JudgeSpec(): the environment's model and endpoint]
    judge_defaults: Any = None  # a JudgeSpec beneath a grader config's judge: block
    tiebreak: Any = None  # a pairwise rubric's third judge (JudgeSpec), asked when the two orders disagree
    cache: str | Path | Literal[False] | None = None
    concurrency: int | None = None  # a grader config's rows at once [the judge's limits.concurrency per endpoint]
    resume: bool = True
    keep_going: bool = False
    retry_errors: bool = False
    group_by: str | None = None
    encoding: str | None = None
    keep_reasoning: bool = False
    swap: bool = True  # a pairwise rubric: ask the swapped order too
    on_conflict: Literal["tie", "first", "third", "vote"] = "tie"  # a pairwise rubric's rule when the orders disagree (third: tiebreak)
    batch: bool = False  # send the requests through the provider's Batch API
    batch_poll: float = 10.0
    ray: str | None = None  # a Ray cluster's address: auto, local, HOST:PORT or ray://HOST:PORT
    ray_workers: int | None = None
    canary: Path | None = None  # rows with known verdicts, judged again as the run goes (runs._canary)
    canary_every: list[str] = Field(default_factory=list)  # N rows and/or a TIME such as 10m
    on_drift: Literal["stop", "flag"] = "stop"


class GradeRun(BaseModel):
    """What ``grade`` returns: the run's record, filled by the run, and what its judge saw.

    ``model`` is the judge model the run names; ``endpoints`` and ``hedges`` a fleet's part;
    ``panel`` a jury's or cascade's block; ``ray`` the cluster a Ray run used.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    summary: Any  # RunSummary, or PairwiseRunSummary for a pairwise rubric
    model: str | None = None
    pacing: Any = None  # judge._pacing.Pacing: the rate the run held at its end
    endpoints: list[dict[str, Any]] = Field(default_factory=list)
    hedges: dict[str, int] = Field(default_factory=dict)
    panel: dict[str, Any] | None = None
    ray: Any = None  # runs._ray.RayInfo

    @property
    def failed_rows(self) -> int:
        """Rows that carry an error or were skipped (a budget's cap): nonzero is the CLI's exit 1."""
        results = self.summary.results
        return results.errors + getattr(results, "skipped", 0)


class Progress(Protocol):
    """How a caller watches a live run: told each row's outcome, shown while the run lasts."""

    def row(self, outcome: Any) -> None: ...

    def showing(self) -> contextlib.AbstractAsyncContextManager[Any]: ...


# A Progress from the input and the judge's figures so far (None before the judge is built).
ProgressFactory = Callable[["RunInput", Callable[[], "JudgeStats | None"]], Progress]


def grade(input: str | Path | RunInput, output: str | Path, plan: GradePlan, *, budget: Budget | None = None,
          limiter: RequestLimiter | Callable[[], RequestLimiter] | None = None, file_judge: Callable[[Any], Any] | None = None,
          progress: ProgressFactory | None = None, on_event: Callable[[str], None] | None = None) -> GradeRun:
    """Grade every row of ``input`` into ``output`` as ``plan`` says; the run's record comes back filled.

    ``budget`` caps and prices the run (default: counts only, at the built-in prices); ``limiter`` is
    the run's, shared by its judge, tiebreak and canary, or a function making it on first need (default: built
    from the judge's limits);
    ``file_judge`` turns a grader config's ``judge:`` block into the spec its LLM nodes use (default:
    the block between ``plan.judge_defaults`` and ``plan.judge``); ``progress`` shows a rubric or
    grader run as it goes; ``on_event`` hears a Batch API run's steps.

    Raises before or instead of a run: InputError (the input, the output, a canary), RubricError,
    GraderConfigError, BatchRunError, GradeError (a plan that cannot run; a judge, cache or limiter
    that cannot be built or reached; a Ray cluster that cannot); and judge.BreakerTripped when the
    judge looks broken (the output is resumable; its ``endpoints`` say the fleet's state then).
    """
    run = _Run(input, Path(output), plan, budget=budget, limiter=limiter, file_judge=file_judge, progress=progress,
               on_event=on_event)
    if plan.ray is not None:  # Ray's driver calls are blocking: this process reads, writes and checkpoints
        return run.on_ray()
    return asyncio.run(run.local())


async def agrade(input: str | Path | RunInput, output: str | Path, plan: GradePlan, **parts: Any) -> GradeRun:
    """:func:`grade` in a running event loop (a notebook, a server). A Ray run's driver blocks: call ``grade`` for it."""
    if plan.ray is not None:
        raise GradeError("a `ray` run blocks the process that drives it: call grade(), not agrade()")
    return await _Run(input, Path(output), plan, **parts).local()


def resolve_input(input: Path, output: Path, encoding: str | None = None) -> RunInput:
    """The input, once for the whole run: a folder's files are listed here, so an empty or mixed one, an output that
    is the input, or an unknown encoding fails (InputError) before any request."""
    from ..runs._io import InputError, RunInput, codec, file_format, input_format
    from ..runs._lock import check_not_input

    if not input.is_dir():
        input_format(input)  # a row file, or one ATIF trajectory (.json)
    file_format(output)
    if not input.exists():
        raise InputError(f"{input}: no such file")
    source = RunInput.resolve(input, encoding)
    check_not_input(source, output)
    rows = source.read()  # read lazily: the first row, or the first unreadable one, answers
    try:
        empty = next(rows, None) is None
    finally:
        rows.close()
    if empty:  # a silent 0-row "success" hides a wrong file or a failed export upstream
        raise InputError(f"{input}: no rows to grade (the input is empty{', or only a header' if source.format == 'csv' else ''}); "
                         "nothing was sent and no output written")
    if encoding is not None:
        codec(encoding)  # an unknown name fails here, before any request
    return source


class _NoProgress:
    def row(self, outcome: Any) -> None:
        pass

    @contextlib.asynccontextmanager
    async def showing(self) -> AsyncIterator[Any]:
        yield self


class _Run:
    """One ``grade`` call: the plan resolved (rubric, input, judge spec), then the run that fits it."""

    def __init__(self, input: Any, output: Path, plan: GradePlan, *, budget: Any = None, limiter: Any = None,
                 file_judge: Callable[[Any], Any] | None = None, progress: ProgressFactory | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        from gradekit.judge import Budget, load_rubric
        from gradekit.judge._spec import JudgeSpec

        from ..runs._io import RunInput

        self.plan, self.output, self.on_event = plan, output, on_event
        self.spec = load_rubric(plan.rubric) if isinstance(plan.rubric, (str, Path)) else plan.rubric
        if (self.spec is None) == (plan.grader is None):
            raise GradeError("a plan grades with a `rubric` or a `grader` config, one of the two")
        self.source = input if isinstance(input, RunInput) else resolve_input(Path(input), output, plan.encoding)
        judge = plan.judge if plan.judge is not None else JudgeSpec()
        # One judge model (a spec), else a panel (a jury, a cascade) that builds itself and paces each member.
        self.single = isinstance(judge, JudgeSpec)
        self.whole = plan.judge_defaults.merge(judge) if self.single and plan.judge_defaults is not None else judge
        self.budget = budget if budget is not None else Budget()
        self._limiter = limiter
        self.file_judge = file_judge or (lambda settings: settings.under(judge, plan.judge_defaults))
        self.progress = progress
        self.made: list[Any] = []  # the run's judge, once built (a grader config builds it on first need)
        self.cache: Any = None
        single_rubric = self.spec is not None and self.spec.pairwise is None
        if (plan.keep_reasoning or plan.canary is not None) and not single_rubric:
            raise GradeError("`keep_reasoning` and `canary` work with a single-answer rubric, not a grader config or a pairwise rubric")
        if plan.grader is not None and (plan.batch or plan.tiebreak is not None):
            raise GradeError("`batch` and `tiebreak` work with a rubric, not a grader config")
        if self.spec is not None:
            unknown = sorted(set(plan.mapping) - set(self.spec.variables))
            if unknown:
                raise GradeError(f"`mapping`: rubric {self.spec.name!r} has no variable {unknown[0]!r} (it has: "
                                 f"{', '.join(self.spec.variables)})")
        self.mapping = {**({v: v for v in self.spec.variables} if self.spec is not None else {}), **plan.mapping}

    # ---- the judge ---------------------------------------------------------------------------------------------

    @functools.cached_property
    def limiter(self) -> RequestLimiter:
        """The run's limiter, built on first need (a Ray run's actors pace themselves): the caller's, or the judge's
        limits' (a panel's first member's: each member paces itself, this one only says how the run was paced)."""
        from gradekit.judge._spec import JudgeSpec

        given = self._limiter
        if given is not None:
            return given() if callable(given) and not hasattr(given, "slot") else given
        jurors = getattr(self.whole, "jurors", None)
        return self.whole.limiter() if self.single else jurors[0].limiter() if jurors else JudgeSpec().limiter()

    def make_judge(self, settings: Any = None) -> JudgeProtocol:
        """The run's judge, once: a panel as it is; one model's spec, or a grader config's ``judge:`` layered with it."""
        wanted = self.whole if not self.single or settings is None else self.file_judge(settings)
        self.made.append(self._built(wanted, cache=self.cache))
        return self.made[-1]

    def _built(self, spec: Any, *, cache: Any) -> Any:
        """Every judge the run makes (its own, the tiebreak, the canary's): the run's budget holds and counts its
        requests, and one model's shares the run's limiter (a panel's members pace themselves)."""
        from gradekit.judge._spec import JudgeSpec

        if isinstance(spec, JudgeSpec):
            return spec.build(limiter=self.limiter, cache=cache, budget=self.budget)
        return spec.build(cache=cache, budget=self.budget)

    def stats(self) -> JudgeStats | None:
        return self.made[0].stats() if self.made else None

    def watch(self) -> Progress:
        return self.progress(self.source, self.stats) if self.progress is not None else _NoProgress()

    # ---- a run in this process ---------------------------------------------------------------------------------

    async def local(self) -> GradeRun:
        """The rubric, grader, pairwise or Batch API run, and its record; the cache is this call's to close."""
        from gradekit.judge._breaker import BreakerTripped

        from ..runs._io import InputError
        from ..runs._record import endpoints_of

        plan = self.plan
        self.cache = _open_cache(plan.cache)
        try:
            # The run's judge last: a tiebreak or canary that cannot be built leaves no client open (a pairwise run has
            # no canary, so they never both are).
            try:
                tiebreak = self._built(plan.tiebreak, cache=self.cache) if plan.tiebreak is not None else None
                canary = self._canary() if plan.canary is not None else None
                judge = self.make_judge() if self.spec is not None else None  # a grader config builds it on first need
            except (GradeError, InputError):
                raise
            except ValueError as e:  # a judge that cannot be built: a bad URL, parameter or limit
                raise GradeError(str(e)) from e
            try:
                if self.spec is None:
                    summary = await self._grader()
                elif plan.batch:
                    summary = await self._batch(judge)
                elif self.spec.pairwise is not None:
                    summary = await self._pairwise(judge, tiebreak)
                else:
                    summary = await self._rubric(judge, canary)
            except BreakerTripped as e:
                e.endpoints = endpoints_of(self.stats())  # type: ignore[attr-defined]  # the fleet's state when it stopped
                raise
            return self._record(summary, judge)
        finally:
            if self.cache is not None:
                self.cache.close()

    def _options(self) -> dict[str, Any]:
        p = self.plan
        return {"group_by": p.group_by, "resume": p.resume, "keep_going": p.keep_going, "retry_errors": p.retry_errors,
                "encoding": p.encoding}

    async def _rubric(self, judge: Any, canary: Any) -> Any:
        from ..runs._file import grade_file

        options = self._options()
        if self.plan.keep_reasoning:
            options["keep_reasoning"] = True
        if canary is not None:
            options["canary"] = canary
        async with judge:
            try:
                progress = self.watch()
                async with progress.showing():
                    return await grade_file(judge, self.spec, self.source, self.output, self.mapping, on_row=progress.row, **options)
            finally:
                if canary is not None:
                    await canary.fresh.aclose()

    async def _grader(self) -> Any:
        """A grader config over the file; its LLM nodes share the plan's judge, limiter and cache.

        The checkpoint is keyed by the config's bytes and the judge the plan names, so another judge starts over.
        """
        from .._config import FileJudge, load_grader
        from .._evals import EvalGrader, run_figures
        from ..runs._file import grade_file_with
        from ..runs._io import InputError, written_rows
        from ..runs._record import EvalFigures

        config = self.plan.grader
        assert config is not None
        if not config.exists():
            raise InputError(f"{config}: no such grader config")
        grader = load_grader(config, judge=FileJudge(self.make_judge), media_root=_media_root(self.source))
        settings = {"config": hashlib.sha256(config.read_bytes()).hexdigest(), **self._endpoint()}
        try:
            progress = self.watch()
            async with progress.showing():
                summary = await grade_file_with(grader, self.source, self.output, self.mapping, concurrency=self._concurrency() + 2,
                                                settings=settings, on_row=progress.row, **self._options())
        finally:
            await grader.aclose()
        if isinstance(grader.grader, EvalGrader):  # read back from the output, so a resumed run reports every row
            counts, per = run_figures(written_rows(self.output), grader.grader.names)
            summary.results.evals = EvalFigures(result_counts=counts.model_dump(), per_testing_criteria_results=[p.model_dump() for p in per])
        return summary

    def _endpoint(self) -> dict[str, Any]:
        """The judge a grader run's checkpoint names: its model(s) and first endpoint (and a jury's rule)."""
        from gradekit.judge._client import DEFAULT_MODEL

        if self.single:
            return {"model": self.whole.model or DEFAULT_MODEL, "base_url": self.whole.first_base_url}
        jurors = getattr(self.whole, "jurors", ())
        return {"model": ", ".join(str(j.model) for j in jurors), "base_url": jurors[0].first_base_url if jurors else None,
                "jury": getattr(self.whole, "aggregate", None), "quorum": getattr(self.whole, "quorum", None)}

    def _concurrency(self) -> int:
        if self.plan.concurrency is not None:
            return self.plan.concurrency
        if not self.single:
            return 16
        where = self.whole.base_url or self.whole.endpoints or ()
        return (self.whole.limits.concurrency or 16) * max(1, len(where))  # per endpoint: a fleet keeps each of them as busy

    async def _batch(self, judge: Any) -> Any:
        from ..runs._provider_batch import grade_file_batch

        async with judge:
            return await grade_file_batch(judge, self.spec, self.source, self.output, self.mapping, poll_interval=self.plan.batch_poll,
                                          group_by=self.plan.group_by, resume=self.plan.resume, on_event=self.on_event)

    async def _pairwise(self, judge: Any, tiebreak: Any) -> Any:
        from ..calibration._pairwise import grade_pairwise_file

        async with judge:
            try:
                return await grade_pairwise_file(judge, self.spec, self.source, self.output, self.mapping, swap=self.plan.swap,
                                                 on_conflict=self.plan.on_conflict, tiebreak=tiebreak,  # type: ignore[arg-type]
                                                 encoding=self.plan.encoding)
            finally:
                if tiebreak is not None:
                    await tiebreak.aclose()

    def _canary(self) -> Any:
        """The canary: its rows (read like labelled rows, with the run's mapping), and the run's judge built again
        without a cache (a check never reads one), sharing the run's limiter and budget."""
        from ..calibration._judging import read_labelled
        from ..runs._canary import Canary, parse_every
        from ..runs._io import InputError, RowError

        plan = self.plan
        assert plan.canary is not None
        try:
            every_rows, every_seconds = parse_every(plan.canary_every)
            rows = read_labelled(plan.canary, self.spec, self.mapping, "label")
            fresh = self._built(self.whole, cache=None)
        except (InputError, RowError, ValueError) as e:
            raise InputError(f"`canary`: {e}") from e
        return Canary(rows.rows, rows.human, self.spec, fresh, every_rows=every_rows, every_seconds=every_seconds,
                      on_drift=plan.on_drift, source={"name": rows.name, "sha256": rows.sha256})  # type: ignore[arg-type]

    def _record(self, summary: Any, judge: Any) -> GradeRun:
        """The run fills its own record: money, pacing and a panel's block; the judge's fleet beside it."""
        from gradekit.judge._client import DEFAULT_MODEL

        from ..runs._record import RunSummary, add_money, endpoints_of, panel_summary

        stats = self.stats()
        # The rate the run held at its end, learnt or told (a fleet's: the sum of its endpoints').
        pacing = stats.pacing if stats is not None and stats.pacing is not None else self.limiter.pacing()
        # Hedged requests (a fleet's stragglers sent once more): sent, won, lost, over every endpoint; zeros when none hedges.
        hedges = {k: sum(getattr(e.hedges, k) for e in (stats.endpoints if stats is not None else [])) for k in ("sent", "won", "lost")}
        model = judge.model if judge is not None else (self.whole.model if self.single else None)
        block = None
        if isinstance(summary, RunSummary):
            add_money(summary, self.budget, model or DEFAULT_MODEL, batch=self.plan.batch)
            summary.stats.pacing = pacing
            if judge is not None:
                block = panel_summary(judge, summary, self.budget.prices)  # None for a single judge
                if block is not None:  # priced per member model
                    summary.stats.money.cost_usd = block["cost_usd"]
        return GradeRun(summary=summary, model=model, pacing=pacing, endpoints=endpoints_of(stats), hedges=hedges, panel=block)

    # ---- a run on a Ray cluster --------------------------------------------------------------------------------

    def on_ray(self) -> GradeRun:
        """Actors judge, this process reads, writes and checkpoints (runs._ray); priced here, as a local run is."""
        from gradekit.judge._client import DEFAULT_MODEL
        from gradekit.judge._spec import Limits

        from .._config import FileJudge, load_grader
        from .._sample import aclose_grader
        from ..runs._file import rubric_settings
        from ..runs._io import InputError
        from ..runs._ray import RayInfo, alive_nodes, connect, default_workers, grade_file_ray, import_ray, worker_spec

        plan, spec, judge = self.plan, self.spec, self.whole
        if not self.single or plan.batch or plan.canary is not None or (spec is not None and spec.pairwise is not None):
            raise GradeError("a `ray` run grades a single-answer rubric or a grader config with one judge model: "
                             "no jury or cascade, `batch`, `canary` or pairwise rubric")
        ray = import_ray()
        cache = _open_cache(plan.cache)
        if cache is not None:
            cache.close()  # opened to fail here when it cannot be; the actors open their own, this process sends no request
        model, first_url = judge.model, judge.first_base_url  # a fleet is named by its first endpoint
        try:
            gcs = connect(plan.ray)
        except Exception as e:  # noqa: BLE001 -- Ray raises ConnectionError, RuntimeError, ValueError... for a bad address
            if plan.ray == "auto" and isinstance(e, ConnectionError):
                # Ray's own text suggests an address flag, which gradekit does not have.
                raise GradeError("`ray` auto: no running Ray cluster found (none on this machine, and RAY_ADDRESS is not set); "
                                 "start one with `ray start --head`, or use `ray=local` to start one for this run") from e
            raise GradeError(f"`ray` {plan.ray}: cannot reach the Ray cluster: {e}") from e
        try:
            count = plan.ray_workers or default_workers()
            # Without a shared limiter, the rates and Retry-After holds are the cluster's one limiter actor.
            judge = replace(judge, limits=replace(judge.limits, url=judge.limits.url or "ray"))
            if judge.limits.url == "ray" and (judge.limits.rps or judge.limits.tpm):
                try:
                    judge.limiter()  # the actor exists before the first row
                except (ValueError, ConnectionError) as e:
                    raise GradeError(str(e)) from e
            encoding = {"encoding": plan.encoding} if plan.encoding else {}
            # The checkpoint's settings are a local run's, so a run killed with or without Ray resumes either way.
            if spec is not None:
                probe = replace(judge, api_key=judge.api_key or ("unused",), limits=Limits()).build()
                settings = rubric_settings(probe, spec, self.mapping, **encoding)
            else:
                assert plan.grader is not None
                if not plan.grader.exists():
                    raise InputError(f"{plan.grader}: no such grader config")

                def layered(settings: Any = None) -> None:  # the file's judge is the actors' to build; said here
                    if settings is not None:
                        self.file_judge(settings)

                # Built here too, only for its name (part of the checkpoint) and to fail before any actor starts.
                local = load_grader(plan.grader, judge=FileJudge(layered))  # type: ignore[arg-type]
                asyncio.run(aclose_grader(local))
                settings = {"grader": getattr(local, "__name__", type(local).__name__), "mapping": dict(self.mapping),
                            "config": hashlib.sha256(plan.grader.read_bytes()).hexdigest(), "model": model or DEFAULT_MODEL,
                            "base_url": first_url, **encoding}
            beneath = None
            if plan.grader is not None and plan.judge_defaults is not None:
                # A grader file's judge goes between the defaults and the plan's judge, on every actor too.
                beneath, judge = plan.judge_defaults, replace(plan.judge, limits=judge.limits)
            cache_path = None if plan.cache is None or plan.cache is False else str(plan.cache)
            ws = worker_spec(rubric=spec, grader_config=plan.grader, judge=judge, judge_defaults=beneath, cache=cache_path,
                             no_cache=plan.cache is False)
            try:
                summary = asyncio.run(grade_file_ray(ws, self.source, self.output, self.mapping, workers=count, settings=settings,
                                                     resume=plan.resume, encoding=plan.encoding))
            except ray.exceptions.RayError as e:  # an actor that cannot build its judge or grader, a cluster gone
                raise GradeError(f"`ray` {plan.ray}: {type(e).__name__}: {e}") from e
            info = RayInfo(address=gcs, nodes=alive_nodes(), workers=count)
        finally:
            ray.shutdown()
        from ..runs._record import price

        price(summary, self.budget.prices, model or DEFAULT_MODEL)
        return GradeRun(summary=summary, model=model or DEFAULT_MODEL, ray=info)


class GradeError(ValueError):
    """A plan that cannot run: an option its run kind cannot honour, a judge, cache or shared limiter that cannot be
    built or reached, a Ray cluster that cannot be reached or an actor that cannot build its judge."""


def _open_cache(where: str | Path | Literal[False] | None) -> Any:
    """The response cache a plan names (None: the user cache directory), or None for ``False``."""
    if where is False:
        return None
    from gradekit.judge import open_cache

    try:
        return open_cache(None if where is None else str(where))
    except ConnectionError as e:  # a redis:// cache that does not answer: before any request
        raise GradeError(str(e)) from e


def _media_root(source: Any) -> Path:
    """The folder local media paths must stay inside: the input folder, or the input file's folder."""
    path = Path(getattr(source, "source", source))
    return path if path.is_dir() else path.parent
