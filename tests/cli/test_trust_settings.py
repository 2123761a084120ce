"""Issue 48, no setting replaced in silence: the environment is a default beneath a grader file's judge (its endpoint,
fleet, model and timeout), the run says which endpoint it uses and why; one --base-url given three times is one endpoint.

Real runs: ``gradekit grade`` as a subprocess with the variables exported, against loopback fake providers (one the
file names, one the shell exports), so what is asserted is which provider the rows reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.judge.testing import FakeProvider, Reply


def _rows(path: Path, n: int, grader: bool = False) -> Path:
    row = (lambda i: {"prompt": f"q{i}?", "response": "x", "answer": "x"}) if grader else \
        (lambda i: {"question": f"q{i}?", "references": ["x"], "prediction": "x"})
    path.write_text("".join(json.dumps(row(i)) + "\n" for i in range(n)), encoding="utf-8")
    return path


def _grader(path: Path, judge: dict) -> Path:
    path.write_text(json.dumps({"type": "llm", "rubric": "semantic_equivalence_en",
                                "map": {"question": "prompt", "references": "references.answer", "prediction": "response"},
                                "judge": judge}), encoding="utf-8")
    return path


def _grade(tmp_path: Path, grader: Path, *extra: str, env: dict[str, str] | None = None, rows: int = 3) -> subprocess.CompletedProcess:
    source = _rows(tmp_path / "in.jsonl", rows, grader=True)
    return subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(grader),
                           "-o", str(tmp_path / "out.jsonl"), "--no-cache", "--restart", *extra],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OPENAI_API_KEY": "k", **(env or {})})


@pytest.mark.parametrize("where", ["base_url", "endpoints"])
def test_an_exported_openai_base_url_is_a_default_beneath_the_grader_files_endpoint_and_the_run_says_which_it_uses(tmp_path, where) -> None:
    with FakeProvider() as declared, FakeProvider() as second, FakeProvider() as exported:
        judge = ({"model": "file-judge", "base_url": declared.base_url} if where == "base_url" else
                 {"model": "file-judge", "endpoints": [{"base_url": declared.base_url}, {"base_url": second.base_url}]})
        done = _grade(tmp_path, _grader(tmp_path / "grader.json", judge), env={"OPENAI_BASE_URL": exported.base_url})
        reached_file = len(declared.chat_requests()) + len(second.chat_requests())
        reached_env = len(exported.chat_requests())
    assert done.returncode == 0, done.stderr
    assert (reached_file, reached_env) == (3, 0), done.stderr  # was (0, 3): the shell's endpoint took the file's rows and key
    said = " ".join(done.stderr.split())
    assert f"the grader file's judge.{where}" in said and "OPENAI_BASE_URL" in said and "default" in said, said
    assert declared.base_url in said


def test_the_command_line_still_wins_over_the_file_and_says_so(tmp_path) -> None:
    with FakeProvider() as declared, FakeProvider() as given:
        done = _grade(tmp_path, _grader(tmp_path / "grader.json", {"model": "file-judge", "base_url": declared.base_url}),
                      "--base-url", given.base_url)
        counts = len(declared.chat_requests()), len(given.chat_requests())
    assert done.returncode == 0, done.stderr
    assert counts == (0, 3)
    said = " ".join(done.stderr.split())
    assert "--base-url" in said and f"judge.base_url {declared.base_url}" in said, said


def test_an_exported_model_and_the_default_timeout_do_not_replace_the_files(tmp_path) -> None:
    with FakeProvider() as declared:
        declared.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}), delay=3.0))
        done = _grade(tmp_path, _grader(tmp_path / "grader.json", {"model": "file-judge", "base_url": declared.base_url, "timeout": 30}),
                      env={"GRADEKIT_MODEL": "shell-model", "GRADEKIT_TIMEOUT": "1"}, rows=1)
        models = {r.body["model"] for r in declared.chat_requests()}
    assert done.returncode == 0, done.stderr + done.stdout  # GRADEKIT_TIMEOUT=1 replaced the file's 30 s: every row timed out
    assert models == {"file-judge"}, models


def test_one_base_url_given_three_times_is_one_endpoint_with_a_warning(tmp_path) -> None:
    source = _rows(tmp_path / "in.jsonl", 60)
    seen: list[int] = []

    def straggling(body: dict) -> Reply:
        seen.append(1)  # every 8th answer is slow: a fleet of three hedges it to "another" endpoint, the same server
        return Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}), delay=1.0 if len(seen) % 8 == 0 else 0.0)

    with FakeProvider() as fake:
        fake.set_responder(straggling)
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en",
                               "-o", str(tmp_path / "out.jsonl"), "--no-cache", "--api-key", "k",
                               *["--base-url", fake.base_url] * 3], capture_output=True, text=True, timeout=180)
        sent = len(fake.chat_requests())
    assert done.returncode == 0, done.stderr
    assert sent == 60, sent  # was 63: three endpoints of one server, hedged against each other
    said = " ".join(done.stderr.split())
    assert "given 3 times" in said and "one endpoint" in said, said
