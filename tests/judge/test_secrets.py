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


# ---- issue 48: a stored reply, a serve log -------------------------------------------------------


def _echoing(fake: FakeProvider, url: str):
    """A provider that quotes what it was sent back in a 200 reply that holds no verdict: the Authorization header
    (Bearer key, or the Basic credentials httpx makes of ``user:password@``) and the URL it was called at."""

    def reply(body: dict) -> Reply:
        seen = fake.chat_requests()[-1].headers.get("authorization", "")
        return Reply(content=f"I cannot grade this. Your request carried `Authorization: {seen}` and went to {url}.")

    return reply


@pytest.mark.parametrize("credentials", ["bearer", "basic"], ids=["planted_bearer_key", "user_password_as_basic_credentials"])
def test_a_reply_that_quotes_the_key_or_the_urls_credentials_is_stored_without_them(tmp_path, credentials) -> None:
    """Issue 48: a failed row keeps the judge's reply (raw_reply) for out.jsonl, out.csv, report and view: redacted as errors are."""
    with FakeProvider() as fake:
        host = fake.base_url.split("//", 1)[1]
        userinfo = f"alice:{PASSWORD}@" if credentials == "basic" else ""
        url = f"http://{userinfo}{host}/chat/completions?api-key={QUERY_SECRET}"
        fake.set_responder(_echoing(fake, url))
        source = _rows(tmp_path / "in.jsonl", 2)
        for out in ("out.jsonl", "out.csv"):
            done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                                   "-o", str(tmp_path / out), "--base-url", f"http://{userinfo}{host}",
                                   "--api-key", KEY, "--no-cache", "--keep-going", "--json"],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 1, done.stderr
        sent = fake.chat_requests()[0].headers["authorization"]
    assert sent.startswith("Basic " if credentials == "basic" else "Bearer ")  # what the reply quotes is the real secret
    report = subprocess.run([sys.executable, "-m", "gradekit", "report", str(tmp_path / "out.jsonl"), "-o", str(tmp_path / "report.html")],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    channels = _channels(done, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all(r["status"] == "error" and r["error_kind"] == "parse_failure" for r in rows), rows
    assert all("Authorization: Bearer ***" in r["raw_reply"] or "Authorization: Basic ***" in r["raw_reply"] for r in rows), rows
    token = sent.split(" ", 1)[1]
    leaks = _leaks(channels) + [name for name, text in channels.items() if token in text]
    assert not leaks, leaks


def test_a_served_judge_url_with_credentials_is_logged_without_them(tmp_path) -> None:
    """Issue 48: ``gradekit serve`` with logging.enable logs every judge request (httpx's INFO lines): no URL password."""
    from ..conftest import serve_in
    from ..server.test_server import call

    with FakeProvider() as fake:
        host = fake.base_url.split("//", 1)[1]
        (tmp_path / "grader.yaml").write_text(json.dumps({
            "type": "llm", "rubric": "semantic_equivalence_en",
            "map": {"question": "prompt", "references": "references.answer", "prediction": "response"},
            "judge": {"model": "fake-judge", "base_url": f"http://alice:{PASSWORD}@{host}"}}))
        (tmp_path / "config.yaml").write_text("reward:\n  grader: grader.yaml\nlogging:\n  enable: true\n")
        proc, url = serve_in(tmp_path)
        try:
            status, _, body = call(url, "/compute_reward", {"prompt": "q?", "response": "x", "extra_params": {"answer": "x"}})
        finally:
            proc.terminate()
            _, stderr = proc.communicate(timeout=60)
        assert fake.chat_requests(), (body, stderr)
    assert status == 200, body
    assert "chat/completions" in stderr, stderr  # the judge request was logged
    assert PASSWORD not in stderr, stderr
