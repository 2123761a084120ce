"""`gradekit serve` as a real process: graceful SIGTERM/SIGINT, and config errors exiting 2."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app

from ..conftest import serve_in
from .test_server import call, wait_for

SLOW = '''
import time
from pathlib import Path

from gradekit.graders import BaseRewardComputer, RewardResponse

HERE = Path(__file__).parent


def log(line):
    with open(HERE / "events.log", "a", encoding="utf-8") as f:
        f.write(line + "\\n")


class Slow(BaseRewardComputer):
    """Blocks every request until the test creates the file 'release'."""

    def compute_reward(self, request):
        log("start " + request.response)
        while not (HERE / "release").exists():
            time.sleep(0.01)
        log("end " + request.response)
        return RewardResponse(score=1.0, extra_info={"id": request.response})

    def close(self):
        log("close")
'''


def events(folder: Path) -> list[str]:
    path = folder / "events.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def refuses_connections(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2):
            return False
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_finishes_in_flight_requests_then_closes_the_computer(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "slow.py").write_text(SLOW, encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  class: slow.py:Slow\nthread_pool:\n  max_workers: 4\n  queue_size: 4\n",
                                          encoding="utf-8")
    proc, url = serve_in(tmp_path)
    try:
        with ThreadPoolExecutor(3) as pool:
            pending = [pool.submit(call, url, "/compute_reward", {"response": f"r{i}"}) for i in range(3)]
            wait_for(lambda: sum(e.startswith("start") for e in events(tmp_path)) == 3, "three requests in flight")
            proc.send_signal(sig)
            wait_for(lambda: refuses_connections(url), "the listening socket to close")
            assert not any(f.done() for f in pending) and proc.poll() is None, "shutdown waits for in-flight requests"
            (tmp_path / "release").touch()
            results = [f.result(timeout=30) for f in pending]
        assert sorted((status, body["status"], body["extra_info"]["id"]) for status, _, body in results) == [
            (200, "success", f"r{i}") for i in range(3)]
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = events(tmp_path)
    assert log[-1] == "close" and log.count("close") == 1, "the computer is closed once, after every request ended"
    assert sum(e.startswith("end") for e in log) == 3
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    assert stderr.count("POST /compute_reward -> 200 success") == 3


def test_bad_config_exits_2_naming_the_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("reward:\n  grader: g.yaml\nthread_pool:\n  max_workers: 0\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--config", str(config)])
    assert result.exit_code == 2
    assert f"error: {config}: thread_pool.max_workers: Input should be greater than 0" in result.output

    config.write_text("server:\n  port: 8000\nreward:\n  grader: g.yaml\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "gradekit", "serve", "--config", str(config)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"error: {config}: reward.grader:" in proc.stderr

    result = CliRunner().invoke(app, ["serve", "--config", str(tmp_path / "absent.yaml")])
    assert result.exit_code == 2 and "absent.yaml: cannot read the server config" in result.output
