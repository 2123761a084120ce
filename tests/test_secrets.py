"""Issue 35, secrets: no key, URL password or token reaches stdout, stderr, the output file, --json, a log line
or the checkpoint, whatever the endpoint echoes back (a 401 body holding the key) or the URL holds (user:pass@, ?api-key=)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.judge.testing import FakeProvider, Reply

KEY = "PLANTEDKEY-7f3a9c21e8d4"  # not sk-shaped: found because it is the key this run was given, not by its look
PASSWORD = "hunter2-PLANTED-pw"
QUERY_SECRET = "qs-PLANTED-0c9e71"


def _rows(path: Path, n: int = 4) -> Path:
    path.write_text("".join(json.dumps({"id": i, "question": f"q{i}?", "references": ["x"], "prediction": "x"}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _channels(done: subprocess.CompletedProcess, folder: Path) -> dict[str, str]:
    found = {"stdout": done.stdout, "stderr": done.stderr}
    for file in sorted(folder.iterdir()):
        if file.is_file() and file.name != "in.jsonl":
            found[file.name] = file.read_text(encoding="utf-8", errors="replace")
    return found


def _leaks(channels: dict[str, str]) -> list[str]:
    return [f"{name}: {secret}" for name, text in channels.items() for secret in (KEY, PASSWORD, QUERY_SECRET) if secret in text]


@pytest.mark.parametrize("keep_going", [False, True], ids=["breaker_stops_the_run", "keep_going_writes_error_rows"])
def test_a_401_that_echoes_the_key_and_credentials_in_the_base_url_reach_no_channel(tmp_path, keep_going) -> None:
    with FakeProvider() as fake:
        fake.set_responder(lambda body: Reply(status=401, error_message=f"Incorrect API key provided: {KEY}. "
                                                                         f"Bearer {KEY} was refused; password {PASSWORD}"))
        host = fake.base_url.split("//", 1)[1]
        source = _rows(tmp_path / "in.jsonl")
        args = [sys.executable, "-m", "gradekit", "-v", "grade", str(source), "-r", "semantic_equivalence_en",
                "-o", str(tmp_path / "out.jsonl"), "--base-url", f"http://alice:{PASSWORD}@{host}", "--api-key", KEY,
                "--no-cache", "--json", *(["--keep-going"] if keep_going else [])]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert fake.chat_requests(), "the requests reached the endpoint"
    channels = _channels(done, tmp_path)
    assert done.returncode == (1 if keep_going else 3), done.stderr
    assert "out.jsonl" in channels and (keep_going or "out.jsonl.checkpoint.json" in channels)
    assert not _leaks(channels), _leaks(channels)
    assert "Incorrect API key provided: ***" in done.stdout  # the message still says what went wrong
    report = json.loads(done.stdout)
    if keep_going:
        rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and all(r["status"] == "error" and "***" in r["error"] for r in rows)
    else:
        assert report["base_url"] == f"http://***@{host}" and report["stopped"] == "breaker"
        checkpoint = json.loads((tmp_path / "out.jsonl.checkpoint.json").read_text())
        assert f"http://***@{host}" in json.dumps(checkpoint)


def test_a_jurys_checkpoint_holds_no_credentials_of_its_jurors_urls(tmp_path) -> None:
    """A Jury's checkpoint settings list each juror's endpoint: redacted like the run's own base_url."""
    with FakeProvider() as fake:
        host = fake.base_url.split("//", 1)[1]
        source = _rows(tmp_path / "in.jsonl", 2)
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                               "-o", str(tmp_path / "out.jsonl"), "--model", "juror-a", "--model", "juror-b",
                               "--base-url", f"http://alice:{PASSWORD}@{host}", "--api-key", KEY, "--no-cache", "--json"],
                              capture_output=True, text=True, timeout=120)
        assert len(fake.chat_requests()) == 4, done.stderr
    channels = _channels(done, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "out.jsonl.checkpoint.json" in channels and not _leaks(channels), _leaks(channels)
    assert f"http://***@{host}" in channels["out.jsonl.checkpoint.json"]


def test_a_secret_query_parameter_in_the_base_url_reaches_no_channel(tmp_path) -> None:
    with FakeProvider() as fake:
        source = _rows(tmp_path / "in.jsonl", 2)
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                               "-o", str(tmp_path / "out.jsonl"), "--base-url", f"{fake.base_url}?api-key={QUERY_SECRET}",
                               "--api-key", KEY, "--no-cache", "--json", "--keep-going"], capture_output=True, text=True,
                              timeout=120)
    channels = _channels(done, tmp_path)
    assert done.stdout and not _leaks(channels), _leaks(channels)
    assert "api-key=***" in done.stdout


def test_redact_masks_known_keys_url_credentials_and_token_shapes() -> None:
    from gradekit.judge._redact import check_base_url, redact, redact_url, remember

    remember("a-key-the-run-was-given")
    assert redact("echo: a-key-the-run-was-given!") == "echo: ***!"
    assert redact_url("https://bob:s3cr3t@host.example/v1?api-version=2024&api-key=abc123") == \
        "https://***@host.example/v1?api-version=2024&api-key=***"
    assert redact("Authorization: Bearer abcdefgh12345678 and sk-proj-abcdefghijklmnop1234") == "Authorization: Bearer *** and ***"
    assert redact("no secret here: http://127.0.0.1:8000/v1") == "no secret here: http://127.0.0.1:8000/v1"
    with pytest.raises(ValueError, match="did you mean 'http://127.0.0.1:8000/v1'"):
        check_base_url("127.0.0.1:8000/v1")
