"""`gradekit grade --ray`: the rows of a file judged by a pool of Ray actors, the file written here.

Ray Data's read tasks read the input (graders/runs/_ray_input.py: a file or a folder, parsed
row by row as a local run parses it); the driver (this process) keeps the order, writes the
output and the checkpoint through the same :func:`run_file` loop as a local run, so the output
file, its columns and order, the summary and resuming are those of a local run; a run killed
with or without ``--ray`` resumes with or without it. Only judging moves out: rows go to the actors in
small batches (one actor call per batch, not per row), each actor holds a Judge or grader with
its own ``--concurrency``, and under ``--rps``/``--tpm`` they all book their requests from one
limiter actor (judge/_ray_limiter.py).

An actor that dies (``ray.kill``, a lost node) fails the batches it held; the driver starts a
replacement and sends those rows again, so no row is lost and, since the driver writes each row
once, none is duplicated. Replies that had arrived come back from the cache.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from gradekit._extras import MissingExtra
from gradekit.judge._spec import DEFAULT_CONCURRENCY

from ._ray_worker import JudgeWorker, WorkerSpec

if TYPE_CHECKING:
    from gradekit.judge._spec import JudgeSpec

    from ._io import RunInput

NAMESPACE = "gradekit"
MAX_WORKERS = 64
ROW_ATTEMPTS = 3  # a row whose actor died this many times gets an error row instead of a fourth actor
# That row's error kind: a run's, not a judge's (no judge answered or failed), so judge.ErrorKind does not name it.
WORKER_LOST = "worker_lost"


class RayMissing(MissingExtra):
    """``--ray`` without Ray installed."""


class RayInfo(BaseModel):
    """The ``"ray"`` block of the --json summary."""

    address: str
    nodes: int
    workers: int


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayMissing("`ray`", "ray", "ray") from None
    return ray


def connect(address: str, *, num_cpus: int | None = None) -> str:
    """Join (or start) the cluster ``address`` names; return its GCS address.

    ``auto`` finds the running cluster as ``ray.init()`` does (RAY_ADDRESS, then the local
    one); ``local`` starts a cluster on this machine for this run; ``HOST:PORT`` joins a
    cluster's GCS; ``ray://HOST:PORT`` connects through Ray Client.
    """
    ray = import_ray()
    if address not in ("auto", "local"):
        _probe(address)
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False, "configure_logging": False}
        if address == "local":
            # address="local": a new cluster even when one runs on this machine (ray.init() alone would join it).
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
            _ends_with_this_process()
        else:
            ray.init(address=address, **kwargs)
    return ray.get_runtime_context().gcs_address


_WATCHDOG_PIPE: list[int] = []  # the write end the watchdog waits on: held open until this process ends


def _ends_with_this_process() -> None:
    """The local cluster this process just started ends with it, a SIGKILL included (graders/runs/_ray_watchdog.py)."""
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/proc/self/fd").is_dir():
        return  # the watchdog reads Linux's /proc; elsewhere ray.shutdown() at a clean exit is all there is
    ray = import_ray()
    session = ray._private.worker._global_node.get_session_dir_path()
    read, write = os.pipe()  # not inheritable: no other process of this one holds the write end
    source = (Path(__file__).with_name("_ray_watchdog.py")).read_text(encoding="utf-8")
    subprocess.Popen([sys.executable, "-I", "-S", "-c", source, session, str(read)], pass_fds=(read,), start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(read)
    _WATCHDOG_PIPE.append(write)


def _probe(address: str, timeout: float = 5.0) -> None:
    """Fail at once on an address nothing listens at: ray.init would retry it for minutes."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ConnectionError(f"{address!r} is not auto, local, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port} ({exc})") from exc


def cluster_cpus() -> int:
    ray = import_ray()
    return int(ray.cluster_resources().get("CPU", 1))


def alive_nodes() -> int:
    ray = import_ray()
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def default_workers() -> int:
    """One actor per CPU the cluster offers, at most MAX_WORKERS."""
    return max(1, min(MAX_WORKERS, cluster_cpus()))


class ActorPool:
    """Judge items on a pool of Ray actors, one awaitable per item, batched per actor call.

    ``judge(item)`` queues the item; a batch leaves when it is full or a moment later, to the
    actor with the fewest items in hand. ``inflight`` is how many items the caller should keep
    in the air so that every actor always has a batch queued behind the one it is judging.
    """

    def __init__(self, spec: WorkerSpec, workers: int, *, batch: int, lost: Callable[[str], Any], cpus_per_actor: float = 1.0) -> None:
        self.ray = import_ray()
        self.spec, self.batch, self.lost = spec, batch, lost
        self._run, self._numbers = uuid.uuid4().hex[:8], itertools.count()
        self._remote = self.ray.remote(JudgeWorker)
        self._options = {"num_cpus": cpus_per_actor, "scheduling_strategy": "SPREAD", "max_concurrency": max(1000, 4 * batch)}
        self.actors: list[Any] = [self._start() for _ in range(workers)]
        self._load: dict[Any, int] = dict.fromkeys(self.actors, 0)
        self._queue: list[tuple[Any, asyncio.Future[Any], int]] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.replaced = 0  # actors started to replace dead ones

    @property
    def inflight(self) -> int:
        return len(self.actors) * self.batch * 2

    def _start(self) -> Any:
        # Named, so that `ray list actors` shows whose they are (and a test can kill one).
        name = f"gradekit-judge-{self._run}-{next(self._numbers)}"
        return self._remote.options(name=name, namespace=NAMESPACE, **self._options).remote(self.spec)

    def ready(self, timeout: float = 120.0) -> None:
        """Wait until every actor is built; an actor that cannot build its judge or grader fails here, once."""
        self.ray.get([actor.ping.remote() for actor in self.actors], timeout=timeout)

    async def judge(self, item: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._enqueue(item, future, 1)
        return await future

    def _enqueue(self, item: Any, future: asyncio.Future[Any], attempt: int) -> None:
        self._queue.append((item, future, attempt))
        if len(self._queue) >= self.batch:
            self._flush()
        elif self._flush_at is None:
            # Items arrive from many coroutines in one loop turn; a millisecond gathers them into one call.
            self._flush_at = asyncio.get_running_loop().call_later(0.001, self._flush)

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        while self._queue:
            batch, self._queue = self._queue[: self.batch], self._queue[self.batch:]
            actor = min(self.actors, key=lambda a: self._load[a])
            self._load[actor] += len(batch)
            task = asyncio.ensure_future(self._send(actor, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, actor: Any, batch: list[tuple[Any, asyncio.Future[Any], int]]) -> None:
        ref = actor.judge_batch.remote([item for item, _, _ in batch])
        try:
            outcomes = await asyncio.wrap_future(ref.future())
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError) as exc:
            self._replace(actor)
            for item, future, attempt in batch:
                if attempt >= ROW_ATTEMPTS:
                    future.set_result(self.lost(f"the Ray actor judging this row died {attempt} times ({type(exc).__name__})"))
                else:
                    self._enqueue(item, future, attempt + 1)
            return
        except Exception as exc:  # noqa: BLE001 -- an object store or pickling failure is these rows' error
            for _, future, _ in batch:
                future.set_result(self.lost(f"the Ray task failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            if actor in self._load:
                self._load[actor] -= len(batch)
        for (_, future, _), outcome in zip(batch, outcomes):
            future.set_result(outcome)

    def _replace(self, dead: Any) -> None:
        if dead not in self._load:
            return  # another batch of the same actor already replaced it
        index = self.actors.index(dead)
        del self._load[dead]
        self.actors[index] = fresh = self._start()
        self._load[fresh] = 0
        self.replaced += 1

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 -- already gone
                pass


def worker_spec(*, rubric: Any = None, grader_config: Path | None = None, judge: JudgeSpec, cache: str | None, no_cache: bool,
                judge_defaults: JudgeSpec | None = None) -> WorkerSpec:
    """The actors' settings: ``judge`` (a spec; with a grader file the command line's layer) and ``judge_defaults`` (the
    environment's layer, beneath a grader file's judge block). The API key is read here, on the driver, so nodes need
    no secret of their own."""
    key = os.environ.get("OPENAI_API_KEY")
    if not judge.api_key and key:
        judge = replace(judge, api_key=(key,))
    return WorkerSpec(rubric=rubric, grader_config=str(grader_config.resolve()) if grader_config else None, judge=judge,
                      judge_defaults=judge_defaults, concurrency=judge.limits.concurrency or DEFAULT_CONCURRENCY, cache=cache,
                      no_cache=no_cache)


async def run_on_pool(pool: ActorPool, run: Callable[[Callable[[Any], Awaitable[Any]], int], Awaitable[Any]]) -> Any:
    """Run a file loop whose judging goes to ``pool``; the pool's actors are killed after, whatever happens."""
    try:
        return await run(pool.judge, pool.inflight)
    finally:
        pool.close()


async def grade_file_ray(spec: WorkerSpec, source: Path | RunInput, destination: Path, mapping: Mapping[str, str], *, workers: int,
                         settings: Mapping[str, Any], group_by: str | None = None, resume: bool = True,
                         on_row: Callable[[Any], None] | None = None, batch: int | None = None, encoding: str | None = None) -> Any:
    """A rubric (``spec.rubric``) or grader config (``spec.grader_config``) over a file, judged on the cluster.

    ``settings`` are the checkpoint's, computed as the local run computes them, so the same
    command resumes a run killed with or without ``--ray``. ``source`` is a file or a folder;
    Ray Data reads it (``encoding`` for CSV/JSONL as in a local run).
    """
    from ._file import RESULT_COLUMNS, RESULT_TYPES, _variables, check_columns, grader_grading, result_row, run_file, verdict_input_error
    from ._io import RunInput
    from ._plan import Grading, RunOptions, RunPlan
    from ._ray_input import ray_rows

    # A judge request dwarfs an actor call: batches as large as an actor's concurrency keep few rows
    # in a killed actor's hands. A grader may be pure CPU: 64 rows per call pay for the call.
    size = batch or (spec.concurrency + 2 if spec.rubric is not None else max(spec.concurrency + 2, 64))
    cpus = cluster_cpus()
    source = RunInput.resolve(source, encoding)  # the run's door: past it the input is this RunInput
    if spec.rubric is not None:
        rubric = spec.rubric
        check_columns(source, rubric, mapping)
        grading: Grading[Any] = Grading(RESULT_COLUMNS, RESULT_TYPES, settings, 0, prepare=lambda row, number: _variables(row, rubric, mapping, number),
                                        judge_row=_unjudged, input_error=verdict_input_error, to_row=result_row)
    else:
        grading = grader_grading(source, mapping, settings, 0, _unjudged)
    plan = RunPlan(source, destination, grading, RunOptions(resume=resume, group_by=group_by), on_row=on_row, reader=ray_rows)

    def lost(message: str) -> Any:
        outcome = grading.input_error(message)
        outcome.error_kind = WORKER_LOST
        return outcome

    pool = ActorPool(spec, workers, batch=size, lost=lost, cpus_per_actor=min(1.0, cpus / workers))
    try:
        await asyncio.to_thread(pool.ready)
    except BaseException:
        pool.close()
        raise

    async def run(judge_row: Callable[[Any], Awaitable[Any]], inflight: int) -> Any:
        return await run_file(plan.judged_by(judge_row, inflight))  # the pool judges: its actors' rows in flight

    return await run_on_pool(pool, run)


async def _unjudged(values: Any) -> Any:
    """A Ray plan's rows are judged by its pool (``RunPlan.judged_by``), never here."""
    raise AssertionError("a Ray plan is judged by its actor pool")


