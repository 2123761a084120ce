"""Grade a file through the provider's Batch API: the live run's output, at batch prices, resumably.

The run goes through phases recorded in ``<output>.batch.json``, so a killed process started
again with the same command picks up where it stopped and never creates a batch twice:

1. *preparing*: stream the rows; each is prepared exactly as the live judge would ask it
   (same request, cache key, ask mode). Cache hits and bad rows are settled here and never
   enter a batch; the rest become request lines in JSONL chunk files beside the output, split
   at ``max_requests_per_batch`` lines or ~190 MB.
2. *submitting*: upload each chunk and create its batch; every id is saved as soon as it exists
   (a kill between creating a batch and saving its id is healed by finding the batch made from
   the saved upload).
3. *polling*: poll the batches with exponential backoff; a finished batch's output and error
   files are streamed into a small SQLite store beside the output, keyed by row: the Verdicts
   themselves, so the output carries the tokens and ``cached`` a live run would write, with or
   without a judge cache (successes also go to the judge's cache, as live replies do). Rows of a failed, expired or cancelled batch
   that got no answer become error rows naming the batch and why; they are not resubmitted,
   so a run's cost is bounded. A line rejected as a bad request in a structured ask mode (a
   server without json_schema, say) is asked again in the next mode of the fallback chain in a
   follow-up batch, as the live judge would fall back.
4. *writing*: one ordered pass writes the output from the store, with the live run's columns,
   through the same resumable file loop as ``grade_file``.

Memory does not grow with the file: rows, request lines and results are streamed, and what a
run must remember lives in SQLite. A parse failure is not re-asked (live re-asks up to
``parse_retries`` times): a reply at temperature 0 rarely changes, and a re-ask costs a batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import openai
from openai.types import Batch
from pydantic import BaseModel, Field

from gradekit.judge import Judge, Rubric, Verdict

from ._file import (
    RESULT_COLUMNS,
    RESULT_TYPES,
    _variables,
    check_columns,
    result_row,
    rubric_settings,
    run_file,
    verdict_input_error,
)
from ._io import InputError, RowError, RunInput
from ._lock import output_lock
from ._plan import Grading, RunOptions, RunPlan
from ._record import RunSummary

ENDPOINT = "/v1/chat/completions"
MAX_BATCH_BYTES = 190_000_000  # the Batch API takes files up to 200 MB; keep a margin for the multipart wrapping
TERMINAL = ("completed", "failed", "expired", "cancelled")
_UPLOAD_TIMEOUT_S = 600.0

T = TypeVar("T")


class BatchRunError(RuntimeError):
    """The provider refused a Batch API call for good (no batch support, bad key, unknown file).

    The state file is saved first, so the same command resumes once the cause is fixed.
    """


class _BatchRecord(BaseModel):
    round: int  # 0, then one more per ask-mode fallback
    chunk: int
    lines: int
    input_file_id: str | None = None
    batch_id: str | None = None
    status: str | None = None
    collected: bool = False


class BatchState(BaseModel):
    """``<output>.batch.json``: which run this is, how far it got, and every batch it created."""

    version: int = 1
    identity: dict[str, Any]
    phase: Literal["preparing", "submitting", "polling", "writing", "done"] = "preparing"
    round: int = 0
    batches: list[_BatchRecord] = Field(default_factory=list)
    summary: dict[str, Any] | None = None  # the RunSummary, once done


def state_path_for(destination: Path) -> Path:
    return destination.with_name(destination.name + ".batch.json")


async def grade_file_batch(
    judge: Judge,
    rubric: Rubric,
    source: Path | RunInput,
    destination: Path,
    mapping: Mapping[str, str],
    *,
    state_path: Path | None = None,
    poll_interval: float = 10.0,
    max_poll_interval: float = 300.0,
    max_requests_per_batch: int = 50_000,
    max_batch_bytes: int = MAX_BATCH_BYTES,
    group_by: str | None = None,
    resume: bool = True,
    on_event: Callable[[str], None] | None = None,
) -> RunSummary:
    """Grade ``source`` into ``destination`` through the Batch API; same rows as :func:`grade_file`.

    Args:
        judge: its model, base URL, key, cache and sampling are used; its limiter is not (the
            Batch API meters itself).
        state_path: where the run's state lives [default: ``<output>.batch.json``]; the SQLite
            result store and chunk files sit beside it until the run is done.
        poll_interval: seconds before the first re-poll; doubled after each poll up to
            ``max_poll_interval``.
        max_requests_per_batch: request lines per batch (the API allows 50,000).
        resume: False discards an earlier run's state, cancelling batches it left open, and starts over.
        on_event: told each step in a line of text (uploads, batch ids, status changes).

    Raises:
        InputError: the input cannot be read, or the state belongs to another input or settings
            while its batches are still running.
        BatchRunError: the provider refused a Batch API call (after retrying transient errors).
    """
    if max_requests_per_batch < 1 or max_batch_bytes < 1:
        raise ValueError("max_requests_per_batch and max_batch_bytes must be positive")
    if rubric.pairwise is not None:
        raise InputError(f"rubric {rubric.name!r} is pairwise: batch mode grades single-output rubrics only")
    if not isinstance(source, RunInput) and not source.exists():
        raise InputError(f"{source}: no such file")
    source = RunInput.resolve(source)  # the run's door: past it the input is this RunInput
    with output_lock(source, destination):  # held from the first upload to the last row written
        check_columns(source, rubric, mapping)
        run = _BatchRun(judge, rubric, source, destination, mapping, state_path or state_path_for(destination),
                        poll_interval=poll_interval, max_poll_interval=max_poll_interval,
                        max_lines=max_requests_per_batch, max_bytes=max_batch_bytes, group_by=group_by,
                        on_event=on_event or (lambda _: None))
        return await run.go(resume)


class _BatchRun:
    def __init__(self, judge: Judge, rubric: Rubric, source: RunInput, destination: Path, mapping: Mapping[str, str],
                 state_path: Path, *, poll_interval: float, max_poll_interval: float, max_lines: int, max_bytes: int,
                 group_by: str | None, on_event: Callable[[str], None]) -> None:
        self.judge, self.rubric, self.source, self.destination, self.mapping = judge, rubric, source, destination, mapping
        self.state_path = state_path
        self.store_path = state_path.with_name(state_path.name.removesuffix(".json") + ".sqlite3")
        self.work = state_path.with_name(state_path.name.removesuffix(".json") + ".chunks")
        self.poll_interval, self.max_poll_interval = poll_interval, max_poll_interval
        self.max_lines, self.max_bytes = max_lines, max_bytes
        self.group_by = group_by
        self.say = on_event
        self.settings = rubric_settings(judge, rubric, mapping, batch=True)
        self.identity = json.loads(json.dumps({"input": source.fingerprint, "settings": self.settings}, default=str))
        self.state = BatchState(identity=self.identity)
        self.db: sqlite3.Connection | None = None
        self.resumed = False  # a resumed writing phase continues the output; a fresh one starts it over
        self.started = time.perf_counter()

    # ---- the phases ------------------------------------------------------------------------

    async def go(self, resume: bool) -> RunSummary:
        earlier = self._load()
        if earlier is not None and not resume:
            await self._cancel_open(earlier)
            earlier = None
        if earlier is not None and earlier.identity != self.identity:
            in_flight = [b.batch_id for b in earlier.batches if b.batch_id and not b.collected]
            if in_flight:
                raise InputError(
                    f"{self.state_path} belongs to another input or other settings and its batches are still open "
                    f"({', '.join(in_flight)}): run the original command to collect them, or use `resume=False` to abandon them")
            earlier = None
        if earlier is not None and earlier.phase == "done" and earlier.summary is not None and self.destination.exists():
            self.say(f"{self.destination} is already complete (state in {self.state_path}); nothing to do")
            summary = RunSummary.model_validate(earlier.summary)
            summary.already_complete = True
            summary.resumed_from = summary.results.rows
            return summary
        if earlier is not None and earlier.phase != "done":
            self.state, self.resumed = earlier, True
            opened = [b.batch_id for b in earlier.batches if b.batch_id and not b.collected]
            self.say(f"resuming from {self.state_path}: phase {earlier.phase}"
                     + (f", batches {', '.join(opened)}" if opened else ""))
        else:
            self._discard_work()
        self.db = _open_store(self.store_path)
        try:
            while True:
                phase = self.state.phase
                if phase == "preparing":
                    self._prepare()
                elif phase == "submitting":
                    await self._submit()
                elif phase == "polling":
                    await self._poll()
                elif phase == "writing":
                    summary = await self._write()
                    break
                else:  # pragma: no cover - "done" never reaches the loop
                    raise AssertionError(phase)
        finally:
            self.db.close()
        self.state.phase, self.state.summary = "done", summary.model_dump(mode="json")
        self._save()
        self._discard_work(keep_state=True)
        return summary

    def _prepare(self) -> None:
        """Prepare round ``state.round``'s rows into chunk files; idempotent, so a rerun redoes it."""
        db, r = self._db(), self.state.round
        self.state.batches = [b for b in self.state.batches if b.round != r]
        db.execute("BEGIN")
        db.execute("DELETE FROM sent WHERE round = ?", (r,))
        db.execute("DELETE FROM verdicts WHERE round = ?", (r,))
        self.work.mkdir(parents=True, exist_ok=True)
        chunks: list[_BatchRecord] = []
        handle: IO[bytes] | None = None
        size = 0
        settled = {"cache": 0, "input": 0}
        for number, row in enumerate(self.source.read(), start=1):
            mode = None
            if r > 0:
                found = db.execute("SELECT fallback FROM verdicts WHERE row = ? AND round = ? AND fallback IS NOT NULL",
                                   (number, r - 1)).fetchone()
                if found is None:
                    continue
                mode = found[0]
            if isinstance(row, RowError):
                continue  # the writing pass gives it its error row
            try:
                values = _variables(row, self.rubric, self.mapping, number)
            except RowError:
                continue
            prepared = self.judge.prepare(self.rubric, values, mode)
            if isinstance(prepared, Verdict):
                settled["cache" if prepared.ok else "input"] += 1
                prepared = prepared.model_copy(update={"usage": prepared.usage.model_copy(update={"requests": r})})  # the earlier rounds' lines were sent
                self._put(number, r, prepared)
                continue
            line = json.dumps({"custom_id": f"row-{number}", "method": "POST", "url": ENDPOINT, "body": prepared.request},
                              ensure_ascii=False).encode("utf-8") + b"\n"
            if handle is None or chunks[-1].lines >= self.max_lines or size + len(line) > self.max_bytes:
                if handle is not None:
                    handle.close()
                chunks.append(_BatchRecord(round=r, chunk=len(chunks), lines=0))
                handle = self._chunk_path(chunks[-1]).open("wb")
                size = 0
            handle.write(line)
            size += len(line)
            chunks[-1].lines += 1
            db.execute("INSERT INTO sent (row, round, chunk, key, row_key, mode) VALUES (?, ?, ?, ?, ?, ?)",
                       (number, r, chunks[-1].chunk, prepared.key, prepared.row_key, prepared.mode))
        if handle is not None:
            handle.close()
        db.execute("COMMIT")
        lines = sum(c.lines for c in chunks)
        self.say(f"round {r + 1}: {lines} request(s) in {len(chunks)} batch file(s); "
                 f"{settled['cache']} answered from the cache, {settled['input']} not renderable")
        self.state.batches += chunks
        self.state.phase = "submitting"
        self._save()

    async def _submit(self) -> None:
        for record in self.state.batches:
            if record.round != self.state.round or record.batch_id is not None:
                continue
            if record.input_file_id is not None:  # uploaded before a kill: was the batch created too?
                record.batch_id = await self._adopt(record.input_file_id)
            if record.batch_id is None:
                if record.input_file_id is None:
                    path = self._chunk_path(record)
                    uploaded = await self._call("upload", self.judge.client.with_options(timeout=_UPLOAD_TIMEOUT_S).files.create,
                                                file=path, purpose="batch")
                    record.input_file_id = uploaded.id
                    self._save()
                batch = await self._call("create batch", self.judge.client.batches.create, input_file_id=record.input_file_id,
                                         endpoint=ENDPOINT, completion_window="24h",
                                         metadata={"gradekit_output": self.destination.name[:500]})
                record.batch_id, record.status = batch.id, batch.status
                self.say(f"created {batch.id} ({record.lines} requests, file {record.input_file_id})")
            self._save()
            self._chunk_path(record).unlink(missing_ok=True)
        self.state.phase = "polling"
        self._save()

    async def _poll(self) -> None:
        interval = self.poll_interval
        while True:
            open_batches = [b for b in self.state.batches if b.round == self.state.round and not b.collected]
            for record in open_batches:
                assert record.batch_id is not None
                batch = await self._call("poll", self.judge.client.batches.retrieve, record.batch_id)
                if batch.status != record.status:
                    counts = batch.request_counts
                    done = f" ({counts.completed + counts.failed}/{counts.total} done)" if counts else ""
                    self.say(f"{batch.id}: {batch.status}{done}")
                    record.status = batch.status
                    self._save()
                if batch.status in TERMINAL:
                    await self._collect(record, batch)
                    record.collected = True
                    self._save()
            if all(b.collected for b in open_batches):
                break
            await asyncio.sleep(interval)
            interval = min(interval * 2, self.max_poll_interval)
        db, r = self._db(), self.state.round
        again = db.execute("SELECT count(*) FROM verdicts WHERE round = ? AND fallback IS NOT NULL", (r,)).fetchone()[0]
        if again:
            self.say(f"{again} row(s) were rejected in their ask mode: asking them in the next mode of the fallback chain")
            self.state.round, self.state.phase = r + 1, "preparing"
        else:
            self.state.phase = "writing"
        self._save()

    async def _collect(self, record: _BatchRecord, batch: Batch) -> None:
        """Store a finished batch's results by row; rows it left unanswered get an error naming why."""
        db, r = self._db(), record.round
        db.execute("BEGIN")
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            path = await self._download(file_id)
            with path.open(encoding="utf-8") as handle:
                for text in handle:
                    if text.strip():
                        self._store_line(text, r)
            path.unlink()
        reason = _unanswered_reason(batch)
        missing = db.execute(
            "SELECT s.row, s.mode FROM sent s LEFT JOIN verdicts v ON v.row = s.row AND v.round = s.round "
            "WHERE s.round = ? AND s.chunk = ? AND v.row IS NULL", (r, record.chunk)).fetchall()
        for number, mode in missing:
            self._put(number, r, Verdict(status="error", error_kind="server_error", error=reason, mode=mode, attempts=r))
        db.execute("COMMIT")

    def _store_line(self, text: str, r: int) -> None:
        try:
            line = json.loads(text)
            number = int(str(line.get("custom_id", "")).removeprefix("row-"))
        except (ValueError, AttributeError):
            return  # not a line of ours
        sent = self._db().execute("SELECT key, row_key, mode FROM sent WHERE row = ? AND round = ?", (number, r)).fetchone()
        if sent is None:
            return
        key, row_key, mode = sent
        response, error = line.get("response") or {}, line.get("error") or {}
        status = response.get("status_code")
        if status == 200 and not error and isinstance(response.get("body"), dict):
            verdict = self.judge.verdict_from_completion(self.rubric, response["body"], mode=mode, key=key, row_key=row_key,
                                                         attempts=r + 1)
        else:
            verdict = self.judge.verdict_from_error(mode=mode, status_code=status, body=response.get("body"),
                                                    code=error.get("code"), message=error.get("message"),
                                                    attempts=r + 1 if response else r)
        fallback = None
        if verdict.error_kind == "bad_request":
            chain = self.rubric.ask_modes
            if mode != chain[-1]:
                fallback = chain[chain.index(mode) + 1]
            elif r > 0:  # like the live judge: when every mode is rejected, report the first rejection
                first = self._get(number, 0)
                if first is not None and first.error_kind == "bad_request":
                    verdict.error = first.error
        self._put(number, r, verdict, fallback)

    async def _write(self) -> RunSummary:
        def prepare(row: dict[str, Any], number: int) -> int:
            _variables(row, self.rubric, self.mapping, number)  # a row that lacks a variable gets its input error row
            return number

        async def stored(number: int) -> Verdict:
            verdict = self._get(number)
            return verdict or Verdict(status="error", error_kind="server_error", error="no batch result was recorded for this row")

        grading = Grading(RESULT_COLUMNS, RESULT_TYPES, self.settings, 1, prepare=prepare, judge_row=stored,
                          input_error=verdict_input_error, to_row=result_row)
        # keep_going: the results are in already, there is no judge left to stop sending to.
        options = RunOptions(resume=self.resumed, keep_going=True, group_by=self.group_by)
        summary = await run_file(RunPlan(self.source, self.destination, grading, options), lock=False)
        stats, rows = summary.stats, summary.results.rows
        stats.wall_s = time.perf_counter() - self.started
        stats.judgements_per_s = rows / stats.wall_s if stats.wall_s > 0 else 0.0
        summary.already_complete = False
        self.say(f"wrote {rows} rows to {self.destination}")
        return summary

    # ---- plumbing --------------------------------------------------------------------------

    async def _call(self, what: str, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """A Batch API call with the judge's retry policy for transient errors; anything else stops the run."""
        try:
            async for attempt in self.judge.retry.retrying():
                with attempt:
                    return await fn(*args, **kwargs)
        except openai.APIStatusError as e:
            raise BatchRunError(f"Batch API {what} failed: HTTP {e.status_code}: {e.message} "
                                f"(does {self.judge.base_url} offer the Batch API? the run resumes from {self.state_path})") from e
        except openai.APIError as e:
            raise BatchRunError(f"Batch API {what} failed: {e} (the run resumes from {self.state_path})") from e
        raise AssertionError("unreachable")  # pragma: no cover

    async def _download(self, file_id: str) -> Path:
        """A result file, streamed to disk beside the output: a 50,000-line file is never held whole."""
        target = self.work / f"{file_id}.jsonl"
        self.work.mkdir(parents=True, exist_ok=True)

        async def fetch() -> None:
            async with self.judge.client.files.with_streaming_response.content(file_id) as response:
                with target.open("wb") as handle:
                    async for block in response.iter_bytes():
                        handle.write(block)

        await self._call(f"download of {file_id}", fetch)
        return target

    async def _cancel_open(self, abandoned: BatchState) -> None:
        """--restart: cancel the batches an abandoned run left open, so they stop costing (best effort)."""
        for record in abandoned.batches:
            if record.batch_id is None or record.collected:
                continue
            try:
                await self.judge.client.batches.cancel(record.batch_id)
                self.say(f"cancelled {record.batch_id}, left open by the abandoned run")
            except openai.APIError as e:
                self.say(f"could not cancel {record.batch_id} ({e}); it may still finish and be billed")

    async def _adopt(self, input_file_id: str) -> str | None:
        """The batch already created from this uploaded file, if a kill came before its id was saved."""
        page = await self._call("list batches", self.judge.client.batches.list, limit=100)
        for batch in page.data:
            if batch.input_file_id == input_file_id:
                self.say(f"found {batch.id}, created from {input_file_id} before the interruption")
                return batch.id
        return None

    def _put(self, number: int, r: int, verdict: Verdict, fallback: str | None = None) -> None:
        self._db().execute("INSERT OR REPLACE INTO verdicts (row, round, verdict, fallback) VALUES (?, ?, ?, ?)",
                           (number, r, verdict.model_dump_json(), fallback))

    def _get(self, number: int, r: int | None = None) -> Verdict | None:
        query = "SELECT verdict FROM verdicts WHERE row = ?" + (" AND round = ?" if r is not None else "") + " ORDER BY round DESC LIMIT 1"
        found = self._db().execute(query, (number,) if r is None else (number, r)).fetchone()
        return Verdict.model_validate_json(found[0]) if found else None

    def _db(self) -> sqlite3.Connection:
        assert self.db is not None
        return self.db

    def _chunk_path(self, record: _BatchRecord) -> Path:
        return self.work / f"round{record.round}-{record.chunk:04d}.jsonl"

    def _load(self) -> BatchState | None:
        try:
            return BatchState.model_validate_json(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _save(self) -> None:
        """Atomically (temp file + rename): a kill leaves the old state or the new, never half of one."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_name(self.state_path.name + ".tmp")
        temporary.write_text(self.state.model_dump_json(indent=1), encoding="utf-8")
        os.replace(temporary, self.state_path)

    def _discard_work(self, keep_state: bool = False) -> None:
        if not keep_state:
            self.state_path.unlink(missing_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.store_path}{suffix}").unlink(missing_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)


def _open_store(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript("""
        CREATE TABLE IF NOT EXISTS sent (row INTEGER, round INTEGER, chunk INTEGER, key TEXT, row_key TEXT, mode TEXT,
                                         PRIMARY KEY (row, round));
        CREATE INDEX IF NOT EXISTS sent_chunk ON sent (round, chunk);
        CREATE TABLE IF NOT EXISTS verdicts (row INTEGER, round INTEGER, verdict TEXT NOT NULL, fallback TEXT,
                                             PRIMARY KEY (row, round));
    """)
    return db


def _unanswered_reason(batch: Batch) -> str:
    errors = getattr(batch.errors, "data", None) or []
    detail = "; ".join(f"{e.code}: {e.message}" for e in errors[:3]) if errors else ""
    return f"batch {batch.id} ended {batch.status} without answering this row" + (f" ({detail})" if detail else "")
