"""One writer per output, the input is sacred, and a checkpoint is checked against the output it describes.

Real `gradekit grade` subprocesses where a second process or a kill is the point; in-process otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import Gate, reference_judge


def _write_input(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"id": i, "question": f"question {i}?", "references": [f"answer {i}"],
                                        "prediction": f"answer {i}"}) + "\n" for i in range(n)), encoding="utf-8")


def _args(source: Path, output: Path, *extra: str) -> list[str]:
    return ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(output), "--concurrency", "4", *extra]


def _env(fake: FakeProvider, tmp_path: Path) -> dict[str, str]:
    return {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(tmp_path / "cache.sqlite3")}


def _grade(fake: FakeProvider, tmp_path: Path, source: Path, output: Path, *extra: str):
    return CliRunner().invoke(app, _args(source, output, *extra), env=_env(fake, tmp_path))


def _start(fake: FakeProvider, tmp_path: Path, source: Path, output: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gradekit", *_args(source, output, *extra)], env={**os.environ, **_env(fake, tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, process: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + 60  # a safety net only: the test waits for a state, not for time
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"the run ended before {what}: {process.communicate()}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
                pytest.fail(f"never saw {what}: {process.communicate()}")
            pytest.fail(f"never saw {what}")
        time.sleep(0.02)


def lock_path(output: Path) -> Path:
    return output.with_name(output.name + ".lock")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_second_run_on_the_same_output_exits_2_naming_the_pid_and_a_killed_holder_frees_it(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 20)
    gate = Gate(*range(20))
    with FakeProvider(responder=gate) as fake, FakeProvider(responder=reference_judge) as other:
        first = _start(fake, tmp_path, source, output)
        try:
            _wait_for(lambda: fake.chat_requests(), first, "the first run's requests")  # it holds the lock by now
            assert lock_path(output).read_text().strip() == str(first.pid)
            second = _grade(other, tmp_path, source, output)
            assert second.exit_code == 2, second.output
            assert f"pid {first.pid}" in second.output and "Traceback" not in second.output
            assert len(other.chat_requests()) == 0  # refused before any request
        finally:
            first.kill()  # SIGKILL: what the next run must survive (and the cleanup when an assertion failed)
            first.wait(timeout=30)
        gate.open.set()
        # The kernel dropped the dead run's flock: the lock file it left behind does not block the next run.
        third = _grade(other, tmp_path, source, output)
    assert third.exit_code == 0, third.output
    assert [r["id"] for r in _jsonl(output)] == list(range(20))
    assert not lock_path(output).exists()


def test_two_runs_started_together_on_one_output_leave_one_whole_output(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 40)
    gate = Gate(*range(40))  # the winner cannot finish before the loser has asked for the lock, however slow it starts
    with FakeProvider(responder=gate) as fake:
        runs = [_start(fake, tmp_path, source, output) for _ in range(2)]
        try:
            _wait_for(lambda: any(p.poll() is not None for p in runs), what="one run refused")
        finally:
            gate.open.set()
        results = [(p.wait(timeout=120), p.communicate()) for p in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, (_, err) in results if code == 2)
    assert "being written by another run (pid" in loser
    assert [r["id"] for r in _jsonl(output)] == list(range(40))


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_an_output_that_is_the_input_by_inode_is_refused(tmp_path, link) -> None:
    source = tmp_path / "in.jsonl"
    _write_input(source, 5)
    before = source.read_bytes()
    output = tmp_path / "out.jsonl"
    os.link(source, output) if link == "hard" else output.symlink_to(source)
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(fake, tmp_path, source, output)
        assert len(fake.chat_requests()) == 0
    assert result.exit_code == 2 and "same file as the input" in result.output
    assert source.read_bytes() == before


def test_a_read_only_output_folder_is_exit_2_with_a_message(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    _write_input(source, 3)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    command = [sys.executable, "-m", "gradekit", *_args(source, folder / "out.jsonl")]
    if os.geteuid() == 0:  # root writes anywhere: drop the capability that lets it, as an ordinary user lacks it
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv cannot be made to respect a read-only folder")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    with FakeProvider(responder=reference_judge) as fake:
        result = subprocess.run(command, env={**os.environ, **_env(fake, tmp_path)}, capture_output=True, text=True, timeout=120)
        assert len(fake.chat_requests()) == 0
    assert result.returncode == 2, result.stderr
    assert "cannot write" in result.stderr and "Permission denied" in result.stderr and "Traceback" not in result.stderr


def _checkpoint(output: Path) -> Path:
    return output.with_name(output.name + ".checkpoint.json")


def test_a_finished_output_edited_since_is_graded_again_with_a_warning(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 30)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(fake, tmp_path, source, output).exit_code == 0
        lines = output.read_text(encoding="utf-8").splitlines(keepends=True)
        # Rewritten since (a row lost, the rest re-spaced): longer than the checkpoint says, one row short.
        output.write_text("".join(line.rstrip("\n") + " " * 20 + "\n" for line in lines[:10] + lines[11:]), encoding="utf-8")
        again = _grade(fake, tmp_path, source, output)
        assert len(fake.chat_requests()) == 30  # graded again from the cache
    assert again.exit_code == 0, again.output
    assert "already complete" not in again.output and "does not match" in again.output
    assert [r["id"] for r in _jsonl(output)] == list(range(30))


def test_a_stale_checkpoint_pointing_inside_a_row_starts_over_instead_of_writing_a_torn_line(tmp_path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 30)
    with FakeProvider(responder=reference_judge) as fake:
        assert _grade(fake, tmp_path, source, output).exit_code == 0
        state = json.loads(_checkpoint(output).read_text(encoding="utf-8"))
        cut = len("".join(output.read_text(encoding="utf-8").splitlines(keepends=True)[:10]).encode())
        # An earlier run's checkpoint: 10 rows, but its offset lands 7 bytes into the eleventh row of this output.
        state.update(complete=False, mark={"rows": 10, "offset": cut + 7})
        state["tally"] = {**state["tally"], "verdicts": 10, "ok": 10}
        _checkpoint(output).write_text(json.dumps(state), encoding="utf-8")
        again = _grade(fake, tmp_path, source, output, "--json")
    assert again.exit_code == 0, again.output
    assert "does not match" in again.output
    assert [r["id"] for r in _jsonl(output)] == list(range(30))  # every line whole, each row once


def test_a_resumed_runs_summary_counts_each_output_row_once(tmp_path) -> None:
    """Rows judged but waiting behind a slow earlier row were in the checkpoint's counts, then judged again."""
    from gradekit.graders.runs._file import MARK_EVERY_S

    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    n = 20
    _write_input(source, n)
    gate = Gate(0, 2)  # rows 1 and 3 hold; the others are judged and wait to be written

    with FakeProvider(responder=gate) as fake:
        run = _start(fake, tmp_path, source, output)
        try:
            _wait_for(lambda: len({r.body["messages"][-1]["content"] for r in fake.chat_requests()}) == n, run, "every row asked")
            _wait_for(lambda: sum(1 for r in fake.chat_requests() if r.status == 200) == n - 2, run, "the other rows answered")
            # Nothing is written yet, so no checkpoint either; a checkpoint is due once MARK_EVERY_S has
            # passed, so the rows written when row 1 arrives are checkpointed at once.
            time.sleep(MARK_EVERY_S * 2)
            gate.release(0)  # rows 1-2 are written: a checkpoint of 2 rows, with rows 4-20 judged but not written
            _wait_for(lambda: _checkpoint(output).exists() and json.loads(_checkpoint(output).read_text())["mark"]["rows"] == 2,
                      run, "a checkpoint of 2 rows")
        finally:
            run.kill()  # SIGKILL
            run.wait(timeout=30)
        gate.open.set()
        resumed = _grade(fake, tmp_path, source, output, "--json")
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads(resumed.output)
    assert summary["resumed_from"] == 2
    assert (summary["rows"], summary["ok"], sum(summary["label_counts"].values())) == (n, n, n)
    assert [r["id"] for r in _jsonl(output)] == list(range(n))


@pytest.mark.parametrize("kind", ["grader", "pairwise", "batch"])
def test_every_kind_of_file_run_takes_the_output_lock(tmp_path, kind) -> None:
    """--grader, pairwise and --batch runs refuse a locked output too (held here by this process, on its own descriptor)."""
    from gradekit.graders.runs._lock import output_lock

    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    if kind == "pairwise":
        source.write_text(json.dumps({"instruction": "q", "output_1": "a", "output_2": "b", "label": 1}) + "\n", encoding="utf-8")
        how = ["-r", "llmbar_pairwise"]
    elif kind == "grader":
        _write_input(source, 2)
        config = tmp_path / "match.yaml"
        config.write_text("type: string_match\nexpression: '{{references.answer}}'\noperation: PARTIAL_MATCH\n", encoding="utf-8")
        how = ["--grader", str(config), "--map", "references.answer=prediction", "--map", "response=prediction"]
    else:
        _write_input(source, 2)
        how = ["-r", "semantic_equivalence_en", "--batch"]
    # Automatic replies fit a JSON schema; the pairwise rubric reads "Output (a)" from text.
    with FakeProvider(responder=(lambda body: Reply(content="Output (a)")) if kind == "pairwise" else None) as fake:
        with output_lock(source, output):
            held = CliRunner().invoke(app, ["grade", str(source), *how, "-o", str(output)], env=_env(fake, tmp_path))
        assert held.exit_code == 2 and f"pid {os.getpid()}" in held.output, held.output
        assert not fake.requests and not output.exists()
        free = CliRunner().invoke(app, ["grade", str(source), *how, "-o", str(output), "--batch-poll", "0.01"] if kind == "batch"
                                  else ["grade", str(source), *how, "-o", str(output)], env=_env(fake, tmp_path))
    assert free.exit_code == 0, free.output
    assert output.exists() and not lock_path(output).exists()


@pytest.mark.parametrize("alias", ["symlink", "hardlink"])
def test_the_output_lock_holds_for_another_name_of_the_same_file(tmp_path, alias) -> None:
    source, output, other_name = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "alias.jsonl"
    _write_input(source, 12)
    gate = Gate(*range(12))
    with FakeProvider(responder=gate) as fake, FakeProvider(responder=reference_judge) as other:
        if alias == "symlink":
            other_name.symlink_to(output)  # a name for a file the first run has not created yet
        first = _start(fake, tmp_path, source, output)
        try:
            _wait_for(lambda: fake.chat_requests(), first, "the first run's requests")  # it holds the lock by now
            if alias == "hardlink":
                other_name.hardlink_to(output)  # the file exists once the run writes it
            second = _grade(other, tmp_path, source, other_name)  # before: both ran, exit 0, one file
            assert second.exit_code == 2, second.output
            assert "being written by another run" in second.output and "Traceback" not in second.output
            assert len(other.chat_requests()) == 0  # refused before any request
        finally:
            gate.open.set()
            out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert [r["id"] for r in _jsonl(output)] == list(range(12))


@pytest.fixture(params=["tmpfs", "fsize"])
def small_disk(tmp_path, request):
    """A folder on a 64 KiB tmpfs (as root), or None: the test then caps the run's file size (RLIMIT_FSIZE) instead."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = request.param == "tmpfs" and os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode == 0
    if request.param == "tmpfs" and not mounted:
        pytest.skip("mounting a tmpfs needs root (the fsize case covers a full disk without it)")
    try:
        yield disk if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


def test_a_disk_that_fills_mid_run_is_exit_2_ending_at_a_whole_row_and_resumes_once_there_is_room(tmp_path, small_disk) -> None:
    import resource

    n = 600  # about 250 KiB of output rows: far more than the room
    source = tmp_path / "in.jsonl"
    _write_input(source, n)
    output = (small_disk or tmp_path) / "out.jsonl"
    cap = None if small_disk is not None else 64 * 1024

    def limit() -> None:
        if cap is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

    # Rows 40-49 are let through one at a time until a checkpoint holds the first 40: however fast the wire, the
    # disk fills after a mark, so the cut is at a whole row past the start (not an output cut back to nothing).
    gate = Gate(*range(40, 50))
    checkpoint = output.with_name(output.name + ".checkpoint.json")

    def marked() -> int:
        try:
            return int(json.loads(checkpoint.read_text(encoding="utf-8"))["mark"]["rows"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    with FakeProvider(responder=gate) as fake:
        env = {**os.environ, **_env(fake, tmp_path)}
        if cap is not None:
            env["GRADEKIT_CACHE"] = ""  # the cache file would meet the size limit too
        run = subprocess.Popen([sys.executable, "-m", "gradekit", *_args(source, output), *(["--no-cache"] if cap else [])],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)

        def at_the_gate() -> bool:  # the run asked for row 40, so the rows before it are judged: a slow start steps nothing
            return any("question 40?" in json.dumps(r.body) for r in fake.chat_requests())

        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline and not gate.open.is_set():
            if at_the_gate():
                gate.step(0.3)
            if marked() >= 40:
                gate.open.set()
            time.sleep(0.02)
        gate.open.set()
        stdout, stderr = run.communicate(timeout=120)
        full = subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)
        assert full.returncode == 2, full.stderr  # before: exit 1 and an OSError traceback from RowWriter.close
        message = " ".join(full.stderr.split())
        assert "Traceback" not in full.stderr and "run the same command again to resume" in message
        assert "No space left" in message or "File too large" in message
        text = output.read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.splitlines()]  # every line a whole row
        assert text == "" or text.endswith("\n")
        assert [r["id"] for r in rows] == list(range(len(rows))) and 40 <= len(rows) < n, (len(rows), full.stderr)
        if small_disk is not None:
            subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # room again
        again = subprocess.run([sys.executable, "-m", "gradekit", *_args(source, output), *(["--no-cache"] if cap else [])],
                               env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        if cap is None:
            # The rows judged before came back from the cache (those in flight at the stop may be asked again).
            assert n <= len(fake.chat_requests()) <= n + 4
    assert [r["id"] for r in _jsonl(output)] == list(range(n))
