"""`gradekit grade --batch` over the fake provider's Files and Batch API, through the real SDK over HTTP."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import openai
import pytest

from gradekit.graders import RunSummary
from gradekit.graders.runs import InputError
from gradekit.graders.runs._provider_batch import grade_file_batch, state_path_for
from gradekit.judge import Judge, JudgeCache, Limiter, RetryPolicy, load_rubric
from gradekit.judge.testing import BatchFault, FakeProvider, Reply

from ..conftest import reference_judge, until
from ..cli.test_cli_grade import grade, rows

ROOT = Path(__file__).resolve().parents[2]
ZH_SET = ROOT / "eval_sets" / "semantic_equivalence_zh" / "data.jsonl"
EN_SET = ROOT / "eval_sets" / "semantic_equivalence_en" / "data.jsonl"


def live_requests(fake: FakeProvider) -> list:
    return [r for r in fake.chat_requests() if r.batch_id is None]


def question_of(body: dict) -> str:
    user = body["messages"][-1]["content"]
    return user.split("<question>\n", 1)[1].split("\n", 1)[0]


def en_rows(n: int) -> list[dict]:
    return [json.loads(line) for line in EN_SET.read_text(encoding="utf-8").splitlines()[:n]]


def write_jsonl(path: Path, items: list) -> Path:
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)) + "\n" for item in items),
                    encoding="utf-8")
    return path


@pytest.fixture
def batch_judge(tmp_path: Path):
    """A Judge for library-level runs; ``cache=True`` gives it a cache file in tmp_path. run_batch closes it."""

    def build(fake: FakeProvider, cache: bool = False) -> Judge:
        store = JudgeCache(tmp_path / "cache.sqlite3") if cache else None
        return Judge("fake-judge", base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=4), cache=store,
                     retry=RetryPolicy(max_attempts=1))

    return build


async def run_batch(judge: Judge, source: Path, out: Path, **kwargs) -> RunSummary:
    """grade_file_batch with instant polling; closes the judge and its cache (each run a new process, in spirit)."""
    rubric = load_rubric("semantic_equivalence_en")
    try:
        return await grade_file_batch(judge, rubric, source, out, {v: v for v in rubric.variables},
                                      poll_interval=0.001, max_poll_interval=0.01, **kwargs)
    finally:
        await judge.aclose()
        if judge.cache is not None:
            judge.cache.close()


# ---- the same output file as a live run ---------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_batch_output_equals_live_output(tmp_path: Path, suffix: str) -> None:
    src = ZH_SET
    if suffix == ".csv":  # CSV in and out, list cells as JSON text
        src = tmp_path / "in.csv"
        with src.open("w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["id", "question", "references", "prediction", "label"])
            writer.writeheader()
            for r in rows(ZH_SET)[:12]:
                writer.writerow({**{k: r[k] for k in ("id", "question", "prediction", "label")},
                                 "references": json.dumps(r["references"], ensure_ascii=False)})
    common = [str(src), "-r", "semantic_equivalence_zh", "--api-key", "k", "--no-cache", "--json"]
    # Lines come back shuffled and a batch needs two polls: results must be matched by custom_id.
    with FakeProvider(responder=reference_judge, shuffle_batch_output=True, batch_polls_until_done=2) as fake:
        code, _ = grade(*common, "--base-url", fake.base_url, "-o", str(tmp_path / f"live{suffix}"))
        assert code == 0
        live_sent = len(live_requests(fake))
        code, text = grade(*common, "--base-url", fake.base_url, "-o", str(tmp_path / f"batch{suffix}"), "--batch", "--batch-poll", "0.001")
        assert code == 0, text
        assert len(live_requests(fake)) == live_sent  # batch mode sent nothing live
        assert fake.files_uploaded == fake.batches_created == 1 and fake.batch_polls >= 2
    live, batch = rows(tmp_path / f"live{suffix}"), rows(tmp_path / f"batch{suffix}")
    # Every column, tokens and `cached` included: batch rows carry the usage of their own line.
    assert batch == live and len(batch) == len(rows(src))
    assert Counter(r["label"] for r in batch) == Counter(r["label"] for r in live) and len({r["label"] for r in batch}) == 2
    summary = json.loads(text)
    assert summary["rows"] == len(batch) and summary["requests"] == len(batch) and summary["errors"] == 0
    assert summary["already_complete"] is False


def test_bad_rows_refusals_and_rejected_modes_match_live_row_for_row(tmp_path: Path) -> None:
    good = en_rows(3)
    src = write_jsonl(tmp_path / "in.jsonl", [
        good[0],
        {"question": "q2", "references": ["a"]},  # lacks the prediction: an input error, never sent
        "{not json",
        {**good[1], "question": "refuse me"},
        {**good[2], "question": "reject me"},  # every ask mode is rejected: the whole fallback chain, batch by batch
        ["a list"],
    ])

    def responder(body: dict) -> Reply:
        question = question_of(body)
        if question == "refuse me":
            return Reply(refusal="I will not grade this.")
        if question == "reject me":
            # Each refusal names the output format, as a real server's does: only those walk the chain.
            return Reply(status=400, error_message=f"mode {(body.get('response_format') or {}).get('type') or ('tools' if body.get('tools') else 'other')} rejected")
        return reference_judge(body)

    common = [str(src), "-r", "semantic_equivalence_en", "--api-key", "k", "--no-cache", "--json"]
    with FakeProvider(responder=responder) as fake:
        code, _ = grade(*common, "--base-url", fake.base_url, "-o", str(tmp_path / "live.jsonl"))
        per_row_live = Counter(question_of(r.body) for r in live_requests(fake))
        code_b, text = grade(*common, "--base-url", fake.base_url, "-o", str(tmp_path / "batch.jsonl"), "--batch", "--batch-poll", "0.001")
        per_row_batch = Counter(question_of(r.body) for r in fake.batch_requests())
    assert code == code_b == 1, text
    live, batch = rows(tmp_path / "live.jsonl"), rows(tmp_path / "batch.jsonl")
    assert batch == live
    assert [r["status"] for r in batch] == ["ok", "error", "error", "error", "error", "error"]
    assert [r["error_kind"] for r in batch] == [None, "input", "input", "refusal", "bad_request", "input"]
    assert batch[4]["error"] == "row 5: HTTP 400: Error code: 400 - mode json_schema rejected"  # the first rejection, as live reports it
    # Bad input never enters a batch; the rejected row walks the same four ask modes live does, one batch each.
    assert per_row_batch == per_row_live == Counter({good[0]["question"]: 1, "refuse me": 1, "reject me": 4})
    assert json.loads(text)["errors_by_kind"] == {"input": 3, "refusal": 1, "bad_request": 1}


async def test_line_errors_become_error_rows_without_a_second_request(tmp_path: Path, batch_judge) -> None:
    items = en_rows(4)
    src = write_jsonl(tmp_path / "in.jsonl", items)

    def responder(body: dict) -> Reply:
        question = question_of(body)
        if question == items[1]["question"]:
            return Reply(status=500, error_message="overloaded")
        if question == items[2]["question"]:
            return Reply(drop=True)  # the fake reports a request_timeout line
        return reference_judge(body)

    with FakeProvider(responder=responder) as fake:
        summary = await run_batch(batch_judge(fake), src, tmp_path / "out.jsonl")
        assert len(fake.batch_requests()) == 4 and not live_requests(fake)
    out = rows(tmp_path / "out.jsonl")
    assert [r["status"] for r in out] == ["ok", "error", "error", "ok"]
    assert out[1]["error"] == "row 2: HTTP 500: Error code: 500 - overloaded"  # worded as live words it
    assert out[1]["error_kind"] == "server_error" and out[1]["score"] is None
    assert out[2]["error_kind"] == "timeout" and "request_timeout" in out[2]["error"]
    assert summary.results.errors_by_kind == {"server_error": 1, "timeout": 1}


async def test_failed_and_expired_batches_leave_error_rows_naming_the_batch(tmp_path: Path, batch_judge) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", en_rows(6))
    faults = [BatchFault(status="failed", message="quota exceeded"), BatchFault(status="expired", answered=1)]
    with FakeProvider(responder=reference_judge, batch_faults=faults) as fake:
        summary = await run_batch(batch_judge(fake), src, tmp_path / "out.jsonl", max_requests_per_batch=2)
        assert fake.batches_created == 3 and len(fake.batch_requests()) == 3  # 0 + 1 + 2 lines ran
    out = rows(tmp_path / "out.jsonl")
    assert len(out) == 6 and [r["id"] for r in out] == [r["id"] for r in en_rows(6)]
    assert [r["status"] for r in out] == ["error", "error", "ok", "error", "ok", "ok"]
    assert "ended failed" in out[0]["error"] and "quota exceeded" in out[0]["error"] and "batch_fake" in out[0]["error"]
    assert out[3]["error_kind"] == "timeout" and "batch_expired" in out[3]["error"]
    assert summary.stats.usage.requests == 3 and summary.results.errors == 3


async def test_batches_split_by_size(tmp_path: Path, batch_judge) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", en_rows(3))
    with FakeProvider(responder=reference_judge) as fake:
        await run_batch(batch_judge(fake), src, tmp_path / "out.jsonl", max_batch_bytes=1)  # every line alone
        assert fake.files_uploaded == fake.batches_created == 3
    assert [r["status"] for r in rows(tmp_path / "out.jsonl")] == ["ok"] * 3


# ---- the cache ----------------------------------------------------------------------------------


async def test_cache_hits_never_enter_a_batch_and_batch_answers_fill_the_cache(tmp_path: Path, batch_judge) -> None:
    items = en_rows(6)
    with FakeProvider(responder=reference_judge) as fake:
        rubric = load_rubric("semantic_equivalence_en")
        live = batch_judge(fake, cache=True)
        for item in items[:3]:  # a live run judged the first half
            assert (await live.judge(rubric, item)).ok
        await live.aclose()
        live.cache.close()
        src = write_jsonl(tmp_path / "in.jsonl", items)
        first = await run_batch(batch_judge(fake, cache=True), src, tmp_path / "a.jsonl")
        assert sorted(question_of(r.body) for r in fake.batch_requests()) == sorted(i["question"] for i in items[3:])
        # Everything is cached now: a batch run over it uploads and creates nothing.
        uploads, lines = fake.files_uploaded, len(fake.batch_requests())
        second = await run_batch(batch_judge(fake, cache=True), src, tmp_path / "b.jsonl")
        assert fake.files_uploaded == uploads == 1 and len(fake.batch_requests()) == lines == 3 and fake.batches_created == 1
    assert [r["cached"] for r in rows(tmp_path / "a.jsonl")] == [True] * 3 + [False] * 3
    assert first.stats.cache_hits == 3 and first.stats.usage.requests == 3
    assert [r["cached"] for r in rows(tmp_path / "b.jsonl")] == [True] * 6 and second.stats.usage.requests == 0
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("cached", "prompt_tokens", "completion_tokens")} for r in rs]
    assert strip(rows(tmp_path / "a.jsonl")) == strip(rows(tmp_path / "b.jsonl"))


# ---- resuming and finished runs -----------------------------------------------------------------


def test_sigkill_while_polling_then_rerun_collects_the_same_batch(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    args = [str(ZH_SET), "-r", "semantic_equivalence_zh", "-o", str(out), "--no-cache", "--batch", "--batch-poll", "0.02"]
    with FakeProvider(responder=reference_judge, hold_batches=True) as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k"}
        proc = subprocess.Popen([sys.executable, "-m", "gradekit", "grade", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while fake.batch_polls < 2 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert fake.batch_polls >= 2, "the subprocess never polled its batch"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL
        state = json.loads(state_path_for(out).read_text(encoding="utf-8"))
        assert state["phase"] == "polling" and [b["batch_id"] for b in state["batches"]] == ["batch_fake2"]
        assert not fake.batch_requests()  # held: not one line has run yet
        fake.release_batches()
        code, text = grade(*args, "--base-url", fake.base_url, "--api-key", "k")
        assert code == 0, text
        assert "resuming" in text and "batch_fake2" in text
        assert fake.files_uploaded == fake.batches_created == 1  # no new upload, no new batch
        per_row = Counter(question_of(r.body) for r in fake.batch_requests())
        assert len(per_row) == len(rows(ZH_SET)) and set(per_row.values()) == {1}  # one request per row, ever
        assert not live_requests(fake)
    got = rows(out)
    assert [r["id"] for r in got] == [r["id"] for r in rows(ZH_SET)] and all(r["status"] == "ok" for r in got)


def test_rerun_over_a_finished_output_does_nothing_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=reference_judge) as fake:
        args = [str(ZH_SET), "-r", "semantic_equivalence_zh", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                "--no-cache", "--batch", "--batch-poll", "0.001"]
        assert grade(*args)[0] == 0
        before = (out.read_bytes(), fake.files_uploaded, fake.batches_created, fake.batch_polls, len(fake.requests))
        code, text = grade(*args)
        assert code == 0 and "already complete" in text and "nothing to do" in text
        code, text = grade(*args, "--json")
        assert code == 0 and json.loads(text)["already_complete"] is True and json.loads(text)["rows"] == len(rows(ZH_SET))
        assert (out.read_bytes(), fake.files_uploaded, fake.batches_created, fake.batch_polls, len(fake.requests)) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.jsonl.batch")) == ["out.jsonl.batch.json"]


async def stop_while_polling(run: Coroutine[Any, Any, Any], fake: FakeProvider) -> None:
    """Start a batch run and cancel it once it polls its open batch (as a killed process leaves it)."""
    task = asyncio.create_task(run)
    await until(lambda: fake.batch_polls >= 1 or task.done(), "the batch run's first poll")
    assert not task.done(), task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_kill_between_create_and_save_adopts_the_batch(tmp_path: Path, batch_judge) -> None:
    src, out = write_jsonl(tmp_path / "in.jsonl", en_rows(3)), tmp_path / "out.jsonl"
    with FakeProvider(responder=reference_judge, hold_batches=True) as fake:
        await stop_while_polling(run_batch(batch_judge(fake), src, out), fake)  # the process dies while polling...
        # ...and we rewind its state to the instant after the batch was created but before its id was saved.
        path = state_path_for(out)
        state = json.loads(path.read_text(encoding="utf-8"))
        state["phase"], state["batches"][0]["batch_id"], state["batches"][0]["status"] = "submitting", None, None
        path.write_text(json.dumps(state), encoding="utf-8")
        fake.release_batches()
        await run_batch(batch_judge(fake), src, out)
        assert fake.files_uploaded == fake.batches_created == 1 and len(fake.batch_requests()) == 3
    assert [r["status"] for r in rows(out)] == ["ok"] * 3


async def test_changed_input_with_open_batches_stops_and_restart_starts_over(tmp_path: Path, batch_judge) -> None:
    src, out = write_jsonl(tmp_path / "in.jsonl", en_rows(2)), tmp_path / "out.jsonl"
    with FakeProvider(responder=reference_judge, hold_batches=True) as fake:
        await stop_while_polling(run_batch(batch_judge(fake), src, out), fake)  # stopped with its batch open
        write_jsonl(src, en_rows(3))  # the input changed under the open batch
        fake.release_batches()
        events: list[str] = []
        with pytest.raises(InputError, match=r"batch_fake2.*`resume=False`"):  # the library's argument, passed below
            await run_batch(batch_judge(fake), src, out)
        assert fake.batches_created == 1
        summary = await run_batch(batch_judge(fake), src, out, resume=False, on_event=events.append)
        assert fake.batch("batch_fake2")["status"] == "cancelling"  # --restart cancels what it abandons
        assert any("cancelled batch_fake2" in e for e in events)
        assert fake.batches_created == 2 and summary.results.rows == summary.results.ok == 3
    assert len(rows(out)) == 3


def test_a_server_without_the_batch_api_stops_with_a_clear_message(tmp_path: Path) -> None:
    with FakeProvider(responder=reference_judge) as fake:
        code, text = grade(str(EN_SET), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"), "--api-key", "k",
                           "--base-url", fake.base_url + "/no-batches", "--no-cache", "--batch")
        assert fake.files_uploaded == fake.batches_created == 0
    assert code == 2 and "Batch API upload failed: HTTP 404" in text and "offer the Batch API" in text and "o.jsonl.batch.json" in text


# ---- the fake's Batch API itself, through the SDK -------------------------------------------------


async def test_fake_batch_api_validates_cancels_and_lists() -> None:
    def line(i: int, **over: object) -> dict:
        body = {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]}
        return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body, **over}

    with FakeProvider(script=[Reply(content="scripted")]) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        try:
            good = await client.files.create(file=("in.jsonl", "".join(json.dumps(line(i)) + "\n" for i in range(2)).encode()),
                                             purpose="batch")
            assert (await client.files.retrieve(good.id)).bytes == good.bytes and good.purpose == "batch"
            mixed = json.dumps(line(1)) + "\n" + json.dumps(line(2, url="/v1/embeddings"))
            bad = await client.files.create(file=("bad.jsonl", mixed.encode()), purpose="batch")
            created = await client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
            failed = await client.batches.retrieve(created.id)
            assert failed.status == "failed" and failed.errors.data[0].code == "mismatched_endpoint" and failed.errors.data[0].line == 2
            held = await client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
            assert (await client.batches.cancel(held.id)).status == "cancelling"
            cancelled = await client.batches.retrieve(held.id)
            assert cancelled.status == "cancelled" and cancelled.output_file_id is None
            errors = (await client.files.content(cancelled.error_file_id)).text.splitlines()
            assert [json.loads(e)["error"]["code"] for e in errors] == ["batch_cancelled"] * 2
            done = await client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
            done = await client.batches.retrieve(done.id)
            assert done.status == "completed" and done.request_counts.completed == 2
            answers = [json.loads(t) for t in (await client.files.content(done.output_file_id)).text.splitlines()]
            # Batch lines use the live script, in line order, and are recorded as chat requests flagged by batch id.
            assert [a["response"]["body"]["choices"][0]["message"]["content"] for a in answers] == ["scripted", "auto reply"]
            assert [r.batch_id for r in fake.chat_requests()] == [done.id, done.id]
            assert [b.id for b in (await client.batches.list()).data] == [done.id, held.id, created.id]
            with pytest.raises(openai.BadRequestError):
                await client.batches.cancel(done.id)
            with pytest.raises(openai.NotFoundError):
                await client.batches.retrieve("batch_nope")
        finally:
            await client.close()
    assert (fake.files_uploaded, fake.batches_created, fake.batch_polls, fake.file_downloads) == (2, 3, 3, 2)


def test_a_batch_runs_cost_is_estimated_at_the_batch_price_half_the_live_one(tmp_path: Path) -> None:
    """Issue 48: the Batch API bills half the live price (OpenAI, Anthropic, Gemini, DashScope); the estimate used the live one."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("fake-judge: {input: 2.0, output: 8.0}\n", encoding="utf-8")
    common = [str(ZH_SET), "-r", "semantic_equivalence_zh", "--api-key", "k", "--no-cache", "--model", "fake-judge",
              "--prices", str(prices)]
    with FakeProvider(responder=reference_judge) as fake:
        code, live_text = grade(*common, "--json", "--base-url", fake.base_url, "-o", str(tmp_path / "live.jsonl"))
        code_b, batch_text = grade(*common, "--json", "--base-url", fake.base_url, "-o", str(tmp_path / "batch.jsonl"), "--batch",
                                   "--batch-poll", "0.001")
        _, said = grade(*common, "--base-url", fake.base_url, "-o", str(tmp_path / "batch2.jsonl"), "--batch", "--batch-poll", "0.001")
    live, batch = json.loads(live_text), json.loads(batch_text)
    assert code == code_b == 0 and live["prompt_tokens"] == batch["prompt_tokens"] > 0
    assert live["cost_usd"] == pytest.approx((live["prompt_tokens"] * 2.0 + live["completion_tokens"] * 8.0) / 1e6)
    assert batch["cost_usd"] == pytest.approx(live["cost_usd"] / 2), (batch["cost_usd"], live["cost_usd"])  # was: the live price
    assert "Batch API" in " ".join(said.split()), said
