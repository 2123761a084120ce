"""A folder as INPUT: its files read as one stream, in sorted path order, as if they were one file.

`gradekit grade FOLDER` in-process against the fake provider with real files, and once as a
real subprocess killed mid-run and resumed. No Ray here: tests/runs/test_ray.py compares `--ray`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.graders.runs._file import MARK_EVERY_S
from gradekit.graders.runs._io import input_files, read_rows
from gradekit.judge.testing import FakeProvider

from ..conftest import Gate

RUBRIC = "semantic_equivalence_en"


def _row(i: int) -> dict:
    return {"id": i, "question": f"q-{i:03d}", "references": ["x"], "prediction": "y"}


def _write_jsonl(path: Path, ids: range, broken: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(_row(i)) for i in ids]
    if broken:
        lines.insert(1, "{not json")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _folder(root: Path) -> Path:
    """Files out of name order on disk, a subfolder, and what a folder reader must pass over."""
    folder = root / "in"
    _write_jsonl(folder / "b.jsonl", range(3, 6))
    _write_jsonl(folder / "a.jsonl", range(0, 3))
    _write_jsonl(folder / "sub" / "c.jsonl", range(6, 9), broken=True)
    _write_jsonl(folder / ".hidden.jsonl", range(100, 102))  # hidden
    _write_jsonl(folder / "_tmp" / "d.jsonl", range(200, 202))  # an underscore folder (Spark's _temporary)
    (folder / "_SUCCESS").write_text("")
    (folder / "README.md").write_text("not data\n")
    return folder


def _grade(fake: FakeProvider, tmp_path: Path, source: Path, output: Path, *extra: str):
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(tmp_path / "cache.sqlite3")}
    return CliRunner().invoke(app, ["grade", str(source), "-r", RUBRIC, "-o", str(output), "--concurrency", "4", "--json", *extra],
                              env=env)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_files_of_a_folder_are_one_input_in_sorted_path_order(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert [f.relative_to(folder).as_posix() for f in input_files(folder)] == ["a.jsonl", "b.jsonl", "sub/c.jsonl"]
    with FakeProvider() as fake:
        result = _grade(fake, tmp_path, folder, tmp_path / "out.jsonl")
    assert result.exit_code == 1, result.output  # the broken line is an error row
    rows = _jsonl(tmp_path / "out.jsonl")
    assert [row.get("id") for row in rows] == [0, 1, 2, 3, 4, 5, 6, None, 7, 8]
    bad = rows[7]
    assert bad["status"] == "error" and bad["error_kind"] == "input"
    assert f"{folder / 'sub' / 'c.jsonl'} row 2: not valid JSON" in bad["error"]  # the file and its own row number
    summary = json.loads(result.output)
    assert summary["rows"] == 10 and summary["ok"] == 9 and summary["errors"] == 1
    # A skip that ends inside the third file reads on from there, as a resumed run does.
    assert [r.get("id") if isinstance(r, dict) else "error" for r in read_rows(folder, skip=6)] == [6, "error", 7, 8]


def test_an_output_inside_the_folder_is_not_read_back(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    output = folder / "graded.jsonl"
    with FakeProvider() as fake:
        first = _grade(fake, tmp_path, folder, output)
        again = _grade(fake, tmp_path, folder, output)
        other = _grade(fake, tmp_path, folder, tmp_path / "other.jsonl")
    assert first.exit_code == 1, first.output
    assert len(_jsonl(output)) == 10
    assert json.loads(again.output)["already_complete"] is True  # same input: the output did not change the fingerprint
    assert json.loads(other.stdout)["rows"] == 10  # a later run over the folder skips the earlier output too
    # ... and says so, naming it (before: nothing printed); the run that writes it there does not warn of itself.
    assert "skipped 1 file(s) that are earlier gradekit outputs" in other.stderr and "graded.jsonl" in other.stderr
    assert "earlier gradekit outputs" not in again.stderr
    # An existing data file of the folder as OUTPUT would destroy that input: refused before any request.
    with FakeProvider() as fake:
        refused = _grade(fake, tmp_path, folder, folder / "a.jsonl")
        assert fake.chat_requests() == []
    assert refused.exit_code == 2 and "one of the input folder's files" in refused.output
    (tmp_path / "link.jsonl").hardlink_to(folder / "b.jsonl")  # the same file by another name, outside the folder
    with FakeProvider() as fake:
        linked = _grade(fake, tmp_path, folder, tmp_path / "link.jsonl")
    assert linked.exit_code == 2 and "is the same file as the input" in linked.output, linked.output
    assert len(_jsonl(folder / "a.jsonl")) == len(_jsonl(folder / "b.jsonl")) == 3


def test_folders_that_cannot_be_an_input_stop_before_any_request(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / ".git").mkdir(parents=True)
    (empty / "notes.txt").write_text("x")
    mixed = tmp_path / "mixed"
    _write_jsonl(mixed / "a.jsonl", range(2))
    (mixed / "b.csv").write_text("id,question,references,prediction\n1,q,x,y\n")
    schema = tmp_path / "schema"
    schema.mkdir()
    (schema / "a.csv").write_text("id,question,references,prediction\n1,q,x,y\n")
    (schema / "b.csv").write_text("id,question,answer\n2,q,y\n")
    broken = tmp_path / "broken"
    broken.mkdir()
    pq.write_table(pa.table({"id": [1], "question": ["q"], "references": ["x"], "prediction": ["y"]}), broken / "a.parquet")
    (broken / "b.parquet").write_bytes(b"PAR1 this is no parquet")
    types = tmp_path / "types"
    types.mkdir()
    pq.write_table(pa.table({"id": [1], "question": ["q"], "references": ["x"], "prediction": ["y"]}), types / "a.parquet")
    pq.write_table(pa.table({"id": ["one"], "question": ["q"], "references": ["x"], "prediction": ["y"]}), types / "b.parquet")
    cases = {empty: "holds no .csv, .jsonl or .parquet file (ignored: notes.txt)", mixed: "a folder input is one format",
             schema: "b.csv: its columns differ from", broken: "b.parquet: not a readable Parquet file",
             types: "column 'id' is string where"}
    with FakeProvider() as fake:
        for folder, message in cases.items():
            result = _grade(fake, tmp_path, folder, tmp_path / f"{folder.name}.jsonl")
            assert result.exit_code == 2, (folder, result.output)
            assert message in result.output, (folder, result.output)
            assert "Traceback" not in result.output
        assert fake.chat_requests() == []


def test_csv_and_parquet_folders_give_a_single_files_rows(tmp_path: Path) -> None:
    """The same rows split over files or in one file: the same output (and Parquet keeps its types)."""
    table = pa.table({"id": list(range(7)), "question": [f"q{i}" for i in range(7)], "references": ["007"] * 7,
                      "prediction": ["7"] * 7})
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(table.slice(0, 4), folder / "part-0.parquet")
    pq.write_table(table.slice(4), folder / "part-1.parquet")
    pq.write_table(table, tmp_path / "whole.parquet")
    csv_folder = tmp_path / "csv"
    csv_folder.mkdir()
    (csv_folder / "1.csv").write_text("id,question,references,prediction\n0,q0,007,7\n1,q1,007,7\n")
    (csv_folder / "2.csv").write_text("")  # an empty shard: no header, no rows
    (csv_folder / "3.csv").write_text("question,id,references,prediction\nq2,2,007,7\n")  # columns in another order
    with FakeProvider() as fake:
        for source, output in ((folder, "folder.parquet"), (tmp_path / "whole.parquet", "whole.parquet.out.parquet"),
                               (csv_folder, "csv.jsonl")):
            result = _grade(fake, tmp_path, source, tmp_path / output)
            assert result.exit_code == 0, result.output
    volatile = ["cached", "prompt_tokens", "completion_tokens"]  # the second run's replies come from the cache
    split, whole = (pq.read_table(tmp_path / name) for name in ("folder.parquet", "whole.parquet.out.parquet"))
    assert split.schema == whole.schema
    assert split.drop_columns(volatile).equals(whole.drop_columns(volatile))
    assert pq.read_table(tmp_path / "folder.parquet").column("id").to_pylist() == list(range(7))
    rows = _jsonl(tmp_path / "csv.jsonl")
    assert [(row["id"], row["references"]) for row in rows] == [("0", "007"), ("1", "007"), ("2", "007")]


def _command(source: Path, output: Path, base_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gradekit", "grade", str(source), "-r", RUBRIC, "-o", str(output), "--base-url", base_url,
            "--api-key", "k", "--model", "fake-judge", "--json", *extra]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GRADEKIT_", "OPENAI_"))}


def kill_after_mark(command: list[str], checkpoint: Path, rows: int, gate: Gate) -> None:
    """Run ``command`` and SIGKILL it once its checkpoint vouches for more than ``rows`` rows.

    The gate holds the rows; one more goes through per step, and only while the checkpoint is short,
    so the run cannot finish before the kill however slowly this loop is scheduled.
    """
    run = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # a safety net only: the kill waits for progress, not for time
    try:
        while time.monotonic() < deadline:
            try:
                marked = json.loads(checkpoint.read_text() or "{}").get("mark", {}).get("rows", 0)
            except (OSError, ValueError):
                marked = 0
            if marked > rows or run.poll() is not None:
                break
            gate.step(MARK_EVERY_S)  # a finished row writes a checkpoint once MARK_EVERY_S has passed
            time.sleep(0.02)
        assert run.poll() is None and marked > rows, f"the run ended or stalled before its mark passed {rows} rows"
    finally:
        run.kill()
        run.communicate()


def test_a_killed_folder_run_resumes_past_its_first_file_and_a_changed_folder_starts_over(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    for n in range(3):
        _write_jsonl(folder / f"{n}.jsonl", range(30 * n, 30 * n + 30))
    with FakeProvider() as fake:
        reference = tmp_path / "reference.jsonl"
        done = subprocess.run(_command(folder, reference, fake.base_url, "--no-cache"), env=_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    output, cache = tmp_path / "out.jsonl", str(tmp_path / "cache.sqlite3")
    gate = Gate(*range(25, 90), pattern=r"\bq-(\d{3})\b", answer=lambda body: None)
    with FakeProvider(responder=gate) as fake:
        try:
            kill_after_mark(_command(folder, output, fake.base_url, "--concurrency", "2", "--cache", cache),
                            output.with_name(output.name + ".checkpoint.json"), rows=30, gate=gate)
        finally:
            gate.open.set()
        done = subprocess.run(_command(folder, output, fake.base_url, "--cache", cache), env=_env(), capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert 30 < summary["resumed_from"] < 90 and summary["rows"] == summary["ok"] == 90
    volatile = ("cached", "prompt_tokens", "completion_tokens")
    ours, theirs = ([{k: v for k, v in row.items() if k not in volatile} for row in _jsonl(p)] for p in (output, reference))
    assert ours == theirs
    # A file added since: the checkpoint's fingerprint no longer matches, so the run grades every row again.
    _write_jsonl(folder / "3.jsonl", range(90, 92))
    with FakeProvider() as fake:
        again = _grade(fake, tmp_path, folder, output)
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["resumed_from"] == 0 and len(_jsonl(output)) == 92


def test_a_data_file_with_a_checkpoint_beside_it_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _write_jsonl(folder / "a.jsonl", range(0, 40))
    _write_jsonl(folder / "b.jsonl", range(40, 50))
    (folder / "b.jsonl.checkpoint.json").write_text("{}", encoding="utf-8")  # left by some earlier run
    with FakeProvider() as fake:
        result = _grade(fake, tmp_path, folder, tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    assert len(_jsonl(tmp_path / "out.jsonl")) == 40
    warning = " ".join(result.stderr.split())  # before: 10 of 50 rows missing and nothing said
    assert "skipped 1 file(s) that are earlier gradekit outputs" in warning and "b.jsonl" in warning
