"""Crash-safe resume: a real `gradekit grade` killed with SIGKILL finishes on the second run, sending no request twice."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.graders.runs._file import MARK_EVERY_S

from gradekit.judge.testing import FakeProvider

from ..conftest import Gate, reference_judge

ROWS = 120


def _write_input(path: Path, n: int = ROWS) -> None:
    rows = [{"id": i, "question": f"question {i}?", "references": [f"answer {i}"],
             "prediction": f"answer {i}" if i % 3 else f"something else {i}"} for i in range(n)]
    if path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows({**r, "references": json.dumps(r["references"])} for r in rows)
    elif path.suffix == ".parquet":
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=50)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _output_ids(path: Path) -> list[int]:
    if path.suffix == ".parquet":
        return [int(i) for i in pq.read_table(path).column("id").to_pylist()]
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return [int(r["id"]) for r in csv.DictReader(f)]
    return [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]


def _output_scores(path: Path) -> list[float]:
    if path.suffix == ".parquet":
        return pq.read_table(path).column("score").to_pylist()
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return [float(r["score"]) for r in csv.DictReader(f)]
    return [json.loads(line)["score"] for line in path.read_text(encoding="utf-8").splitlines()]


def _command(source: Path, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en", "-o", str(output),
            "--concurrency", "4", *extra]


def _env(fake: FakeProvider, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k",
            "GRADEKIT_CACHE": str(tmp_path / "cache.sqlite3"), **extra}


def _questions_sent(fake: FakeProvider) -> Counter[str]:
    asked = Counter()
    for request in fake.chat_requests():
        asked[re.search(r"question \d+\?", request.body["messages"][-1]["content"]).group(0)] += 1
    return asked


def _kill_when_checkpointed(command: list[str], env: dict[str, str], checkpoint: Path, rows: int, gate: Gate) -> None:
    """SIGKILL the run once its checkpoint covers ``rows`` rows, before it can finish.

    The gate holds rows; this loop lets one more through only while the checkpoint is still short (a
    checkpoint is written when a row finishes), so the run advances only as fast as the test watches it,
    however slowly the test is scheduled.
    """
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60  # a safety net only: the kill waits for progress, not for time
    try:
        while time.monotonic() < deadline:
            try:
                state = json.loads(checkpoint.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                state = None
            if state and state["mark"]["rows"] >= rows:
                break
            assert process.poll() is None, process.communicate()
            gate.step(MARK_EVERY_S)  # a finished row writes a checkpoint once MARK_EVERY_S has passed
            time.sleep(0.02)
        else:
            pytest.fail("the run never checkpointed")
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
        gate.open.set()
    assert process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_sigkill_mid_run_then_the_same_command_finishes_without_repeats(tmp_path, suffix) -> None:
    source = tmp_path / f"in{suffix}"
    output = tmp_path / f"out{suffix}"
    _write_input(source)
    gate = Gate(*range(40, ROWS))
    with FakeProvider(responder=gate, latency=0.02) as fake:
        # Each run sends its own API key, so the provider's log tells whose a request was. Counting the
        # killed run's requests right after the kill raced: a request it wrote just before dying sits in
        # the socket buffer and reaches the provider's log later, where it was counted as the resumed
        # run's ("one request more than expected", seen once with .parquet).
        env = _env(fake, tmp_path, GRADEKIT_PARQUET_PART_ROWS="20", OPENAI_API_KEY="killed-run")
        _kill_when_checkpointed(_command(source, output), env, output.with_name(output.name + ".checkpoint.json"), 30, gate)
        with sqlite3.connect(tmp_path / "cache.sqlite3") as db:
            judged = db.execute("SELECT count(*) FROM responses").fetchone()[0]  # replies the killed run received
        env = {**env, "OPENAI_API_KEY": "resumed-run"}
        done = subprocess.run(_command(source, output, "--group-by", "id"), env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "resumed:" in done.stdout and f"{ROWS} groups" in done.stdout  # the spread read the rows written before the kill
        asked = _questions_sent(fake)
        by_run = Counter(r.headers.get("authorization") for r in fake.chat_requests())
        sent_before, sent_after = by_run["Bearer killed-run"], by_run["Bearer resumed-run"]
        assert sent_before + sent_after == len(fake.chat_requests())
        assert sent_before < ROWS  # it really was cut off mid-run
    assert _output_ids(output) == list(range(ROWS))  # exactly one row per input row, in input order
    # Every row the killed run had judged (written or only cached) is not asked again; only the
    # requests in flight at the kill, whose replies never arrived, are sent a second time.
    assert sent_after == ROWS - judged and len(asked) == ROWS
    assert sum(n - 1 for n in asked.values()) == sent_before - judged <= 4
    assert _output_scores(output) == [1.0 if i % 3 else 0.0 for i in range(ROWS)]
    if suffix == ".parquet":
        schema = pq.read_schema(output)
        assert str(schema.field("score").type) == "double" and str(schema.field("id").type) == "int64"
        assert not output.with_name(output.name + ".parts").exists()


def _grade(source: Path, output: Path, fake: FakeProvider, tmp_path: Path, *extra: str):
    """The same command in-process (CliRunner): these cases need no kill, so no subprocess start-up."""
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(tmp_path / "cache.sqlite3")}
    return CliRunner().invoke(app, _command(source, output, *extra)[3:], env=env)


def test_a_finished_output_is_a_no_op_that_says_so(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 20)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(source, output, fake, tmp_path).exit_code == 0
        before = output.read_bytes()
        again = _grade(source, output, fake, tmp_path)
        assert again.exit_code == 0 and "already complete (20 rows); nothing to do" in again.output
        assert len(fake.chat_requests()) == 20 and output.read_bytes() == before
        restarted = _grade(source, output, fake, tmp_path, "--restart")
        assert restarted.exit_code == 0 and "already complete" not in restarted.output
        assert "20 cache hits" in restarted.output and len(fake.chat_requests()) == 20


def test_other_settings_or_a_changed_input_start_over(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 10)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(source, output, fake, tmp_path).exit_code == 0
        other_model = _grade(source, output, fake, tmp_path, "--model", "another-judge", "--restart")
        assert other_model.exit_code == 0 and "already complete" not in other_model.output
        assert len(fake.chat_requests()) == 20
        _write_input(source, 12)
        grown = _grade(source, output, fake, tmp_path, "--model", "another-judge")
        assert "already complete" not in grown.output and _output_ids(output) == list(range(12))


@pytest.mark.parametrize("change", [["--model", "another-judge"], ["-r", "semantic_equivalence_zh"], ["--map", "prediction=question"]],
                         ids=["model", "rubric", "mapping"])
def test_a_finished_output_is_not_replaced_by_a_run_with_other_settings_unless_restart(tmp_path, change) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 10)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(source, output, fake, tmp_path).exit_code == 0
        before, sent = output.read_bytes(), len(fake.chat_requests())
        other = _grade(source, output, fake, tmp_path, *change)  # before: exit 0, the 10 rows silently replaced
        message = " ".join(other.output.split())
        assert other.exit_code == 2, other.output
        assert "finished output graded with other settings" in message and "--restart" in message
        assert {"--model": "model:", "-r": "rubric:", "--map": "mapping:"}[change[0]] in message
        assert output.read_bytes() == before and len(fake.chat_requests()) == sent
        assert _grade(source, output, fake, tmp_path, *change, "--restart").exit_code in (0, 1)
        assert len(fake.chat_requests()) == sent + 10  # graded again, as asked


@pytest.mark.parametrize("text", ["[]", "[1, 2]", '"x"', "{}", '{"identity": [], "mark": 3}', "{not json", "\x00\xff"],
                         ids=["empty-list", "list", "string", "empty-object", "wrong-types", "not-json", "binary"])
def test_a_malformed_checkpoint_warns_and_starts_over(tmp_path, text) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 8)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(source, output, fake, tmp_path).exit_code == 0
        output.with_name(output.name + ".checkpoint.json").write_text(text, encoding="latin-1")
        again = _grade(source, output, fake, tmp_path)  # before: a list was an AttributeError traceback
        assert again.exit_code == 0, again.output
        assert again.exception is None or isinstance(again.exception, SystemExit)
        assert "grading every row again" in " ".join(again.output.split())
    assert _output_ids(output) == list(range(8))


def test_a_row_cut_off_by_the_kill_is_dropped_and_rewritten(tmp_path) -> None:
    """The output may hold half a row written after the last checkpoint: resume truncates it."""
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 30)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(source, output, fake, tmp_path).exit_code == 0
        checkpoint = output.with_name(output.name + ".checkpoint.json")
        state = json.loads(checkpoint.read_text(encoding="utf-8"))
        lines = output.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = "".join(lines[:10])
        output.write_text(kept + lines[10][:17], encoding="utf-8")  # ten rows and a torn eleventh
        state.update(complete=False, mark={"rows": 10, "offset": len(kept.encode())})
        state["tally"] = {**state["tally"], "verdicts": 10, "ok": 10, "score_sum": 0.0, "labels": {}}
        checkpoint.write_text(json.dumps(state), encoding="utf-8")
        again = _grade(source, output, fake, tmp_path)
        assert again.exit_code == 0 and "resumed: 10 rows" in again.output
        assert len(fake.chat_requests()) == 30  # the other 20 came from the cache
    assert _output_ids(output) == list(range(30))


def test_the_reward_spread_of_a_resumed_or_finished_run_covers_the_whole_output(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 30)
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    source.write_text("".join(json.dumps({**r, "group": r["id"] // 3}) + "\n" for r in rows), encoding="utf-8")
    with FakeProvider(responder=reference_judge) as fake:
        whole = json.loads(_grade(source, output, fake, tmp_path, "--group-by", "group", "--json").output)["spread"]
        assert (whole["groups"], whole["rewards"]) == (10, 30)
        finished = json.loads(_grade(source, output, fake, tmp_path, "--group-by", "group", "--json").output)
        assert finished["already_complete"] and finished["spread"] == whole
        checkpoint = output.with_name(output.name + ".checkpoint.json")
        state = json.loads(checkpoint.read_text(encoding="utf-8"))
        kept = "".join(output.read_text(encoding="utf-8").splitlines(keepends=True)[:12])
        output.write_text(kept, encoding="utf-8")
        state.update(complete=False, mark={"rows": 12, "offset": len(kept.encode())})
        checkpoint.write_text(json.dumps(state), encoding="utf-8")
        resumed = json.loads(_grade(source, output, fake, tmp_path, "--group-by", "group", "--json").output)
    assert resumed["resumed_from"] == 12 and resumed["spread"] == whole


def test_a_resumed_run_counts_only_its_own_requests(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 30)
    with FakeProvider(responder=reference_judge) as fake:
        assert json.loads(_grade(source, output, fake, tmp_path, "--json").output)["requests"] == 30
        # As a run killed after 12 rows leaves it: 12 rows written, its checkpoint's counts, the rest in the cache.
        checkpoint = output.with_name(output.name + ".checkpoint.json")
        state = json.loads(checkpoint.read_text(encoding="utf-8"))
        kept = "".join(output.read_text(encoding="utf-8").splitlines(keepends=True)[:12])
        output.write_text(kept, encoding="utf-8")
        state.update(complete=False, mark={"rows": 12, "offset": len(kept.encode())})
        state["tally"].update(verdicts=12, ok=12, requests=12)
        checkpoint.write_text(json.dumps(state), encoding="utf-8")
        sent = len(fake.chat_requests())
        resumed = json.loads(_grade(source, output, fake, tmp_path, "--json").output)
        assert resumed["resumed_from"] == 12 and resumed["cache_hits"] >= 18
        assert resumed["requests"] == len(fake.chat_requests()) - sent == 0


def test_no_cache_wins_over_a_cache_named_in_the_environment(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 3)
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(source, output, fake, tmp_path, "--no-cache")  # GRADEKIT_CACHE is set by _grade
        assert result.exit_code == 0, result.output
        assert not (tmp_path / "cache.sqlite3").exists() and len(fake.chat_requests()) == 3
        assert _grade(source, output, fake, tmp_path, "--restart").exit_code == 0
        assert (tmp_path / "cache.sqlite3").exists()  # without --no-cache the environment's cache is used
