"""Issue 35: a fleet whose every endpoint answers 429 for ever stops, instead of waiting out each row's 429 budget."""

from __future__ import annotations

import json

import pytest

from gradekit.judge.testing import FakeProvider, Reply

from .test_fleet import cli, write_rows


@pytest.mark.timeout(200)
def test_a_fleet_whose_every_endpoint_answers_429_for_ever_stops_as_rate_limited_naming_each(tmp_path) -> None:
    source, out = write_rows(tmp_path / "refused.jsonl", 60), tmp_path / "out.jsonl"
    with FakeProvider() as first, FakeProvider() as second:
        for fake in (first, second):
            fake.set_responder(lambda body: Reply(status=429, headers={"Retry-After": "1"}, error_message="You exceeded your current quota"))
        result = cli("grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--model", "fake-judge", "--api-key", "k",
                     "--base-url", first.base_url, "--base-url", second.base_url, "--no-cache", "--json")
        sent = len(first.chat_requests()) + len(second.chat_requests())
    assert result.returncode == 3, result.stderr
    said = " ".join(result.stderr.split())
    assert "refused (429)" in said and first.base_url in said and second.base_url in said, said
    stopped = json.loads(result.stdout)
    assert stopped["stopped"] == "breaker" and stopped.get("ok", 0) == 0, stopped
    assert sent < 400, sent  # it stopped once the refusals outlasted their hints, not after every row's 600 s budget
