"""Issue 35: `gradekit serve` with a plain-def reward class that hangs keeps serving: a call past
server.request_timeout_s has its worker process killed and replaced."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ..conftest import serve_in
from .test_server import call

HANGS = '''
import os
import time

from gradekit.graders import BaseRewardComputer, RewardResponse


class Hangs(BaseRewardComputer):
    """Hangs for ever on the response 'hang'; counts the calls its worker served (state kept between calls)."""

    def __init__(self):
        self.calls = 0

    def compute_reward(self, request):
        self.calls += 1
        if request.response == "hang":
            while True:
                time.sleep(1)
        if request.response == "boom":
            raise ValueError("boom")
        return RewardResponse(score=1.0, extra_info={"calls": self.calls, "pid": os.getpid()})
'''


@pytest.mark.timeout(120)
def test_hanging_calls_past_the_request_timeout_free_their_workers_and_normal_requests_still_answer(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text(HANGS, encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  class: hangs.py:Hangs\nserver:\n  request_timeout_s: 1\n"
                                          "thread_pool:\n  max_workers: 2\n  queue_size: 8\n", encoding="utf-8")
    proc, url = serve_in(tmp_path)
    try:
        with ThreadPoolExecutor(3) as pool:
            hung = [f.result(timeout=60) for f in [pool.submit(call, url, "/compute_reward", {"response": "hang"}) for _ in range(3)]]
        assert [status for status, _, _ in hung] == [504] * 3, hung
        normal = [call(url, "/compute_reward", {"response": f"r{i}"}) for i in range(4)]
        assert [(status, body["status"]) for status, _, body in normal] == [(200, "success")] * 4, normal
        # One worker served the four in turn: the instance keeps its state between calls, as on a thread.
        assert [body["extra_info"]["calls"] for _, _, body in normal] == [1, 2, 3, 4]
        status, _, body = call(url, "/compute_reward", {"response": "boom"})
        assert status == 500 and body["message"] == "ValueError: boom", body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    assert stderr.count("killed: its call was cancelled") == 3, stderr
