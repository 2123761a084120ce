"""Shared fixtures: a loopback fake provider per test, and judges pointed at it with no real waits."""

from __future__ import annotations

import asyncio
import filecmp
import importlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gradekit.judge import Judge, JudgeCache, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply, auto_reply

ROOT = Path(__file__).resolve().parents[1]


def _installed_copy_is_this_checkout() -> list[str]:
    """Source files whose installed copy differs from the checkout's (none when installed with -e).

    Tests import the installed ``gradekit``, never the folders beside them; a copy installed before
    an edit would test old code and pass. Each folder maps into the package as pyproject.toml says.
    """
    stale = []
    for folder, package in (("src/gradekit", "gradekit"), ("judge", "gradekit.judge"), ("graders", "gradekit.graders"),
                            ("prompts", "gradekit.prompts"), ("eval_sets", "gradekit.eval_sets")):
        copy = Path(importlib.import_module(package).__file__).resolve().parent
        if copy == ROOT / folder:  # an editable install: the checkout itself
            continue
        for source in (ROOT / folder).rglob("*.py"):
            other = copy / source.relative_to(ROOT / folder)
            if "__pycache__" not in source.parts and not (other.is_file() and filecmp.cmp(source, other, shallow=False)):
                stale.append(str(source.relative_to(ROOT)))
    return stale


_STALE = _installed_copy_is_this_checkout()
if _STALE:
    pytest.exit(f"the installed gradekit is not this checkout ({len(_STALE)} files differ, e.g. {_STALE[0]}): "
                "reinstall with `pip install '.[test]'`, or `pip install -e '.[test]'` while developing", returncode=4)


class Waits(list):
    """Records what retries would have slept, so backoff is tested without wall-clock waits."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture(scope="session")
def path_without_bwrap(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH holding every program of the system's bin folders except bubblewrap: how the sandbox
    tests make ``sandbox: auto`` run as on a machine without it (util-linux stays available)."""
    folder = tmp_path_factory.mktemp("no-bwrap")
    for bin_dir in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for program in sorted(Path(bin_dir).glob("*")) if Path(bin_dir).is_dir() else []:
            if program.name != "bwrap" and not (folder / program.name).exists():
                (folder / program.name).symlink_to(program)
    return str(folder)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No test may reach a real provider or the user's cache, whatever the developer's shell holds.
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GRADEKIT_MODEL", "GRADEKIT_CACHE", "GRADEKIT_RPS",
                "GRADEKIT_TPM", "GRADEKIT_CONCURRENCY", "GRADEKIT_TIMEOUT", "GRADEKIT_LIMITER", "GRADEKIT_LIMITER_KEY",
                "GRADEKIT_PRICES", "GRADEKIT_PARQUET_PART_ROWS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(autouse=True)
def _fresh_process_limiter() -> Iterator[None]:
    """Each test starts with no process-wide limiter, as a new process does.

    A reward server's config (build_computer) or configure_limiter sets one for the whole process:
    its concurrency, a Retry-After hold or a rate learnt from one test's fake must not pace the next.
    """
    yield
    from gradekit.judge import _limiters

    _limiters._process_limiter = None


@pytest.fixture
def waits() -> Waits:
    return Waits()


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


@pytest.fixture
async def make_judge(fake: FakeProvider, waits: Waits, tmp_path: Path):
    """Build a Judge against the fake with its own limiter; ``cache=True`` gives it a fresh SQLite cache."""
    made: list[Judge] = []

    def build(*, cache: bool | JudgeCache = False, limiter: Limiter | None = None, retry: RetryPolicy | None = None,
              timeout: float = 5.0, base_url: str | None = None, **kwargs) -> Judge:
        store = cache if isinstance(cache, JudgeCache) else (JudgeCache(tmp_path / "cache.sqlite3") if cache else None)
        judge = Judge("fake-judge", base_url=base_url or fake.base_url, api_key="test-key", timeout=timeout,
                      limiter=limiter or Limiter(concurrency=8, sleep=Waits()), cache=store,
                      retry=retry or RetryPolicy(max_attempts=4), sleep=waits, **kwargs)
        made.append(judge)
        return judge

    yield build
    for judge in made:
        await judge.aclose()


def verdict_json(label: str, rationale: str = "because") -> Reply:
    return Reply(content=json.dumps({"rationale": rationale, "judgement": label}, ensure_ascii=False))


def reference_judge(body: dict) -> Reply:
    """A deterministic stand-in judge: correct iff one reference appears inside the prediction.

    It reads the rendered prompt like a model would, so the whole render -> request -> parse path runs.
    """
    user = body["messages"][-1]["content"]
    if "<prediction>" not in user:  # a rubric it does not read (a checklist in the docs): the fake's own default answer
        return auto_reply(body)
    prediction = re.search(r"<prediction>\n(.*?)\n</prediction>", user, re.S).group(1)
    references = re.findall(r"^- (.*)$", re.search(r"<references>\n(.*?)</references>", user, re.S).group(1), re.M)
    hit = any(r and r in prediction for r in references)
    zh = "判断" in user
    label = ("正确" if hit else "错误") if zh else ("correct" if hit else "incorrect")
    payload = json.dumps({"rationale": "reference found" if hit else "reference absent", "judgement": label}, ensure_ascii=False)
    fmt = (body.get("response_format") or {}).get("type")
    if body.get("tools"):
        return Reply(tool_call={"name": "submit_verdict", "arguments": payload})
    if fmt in ("json_schema", "json_object"):
        return Reply(content=payload)
    return Reply(content=f"<rationale>x</rationale><judgement>{label}</judgement>")


class Gate:
    """A responder that holds the rows it is told to until the test lets them through.

    A row is named by the number ``pattern`` finds in its prompt. ``release(n)`` lets one row through,
    ``open.set()`` all of them. A run held here cannot finish, or get past a row, before the test has
    seen what it waits for, however slowly the test itself is scheduled.
    """

    def __init__(self, *held: int, pattern: str = r"question (\d+)\?", answer: Callable[[dict], Reply | None] = reference_judge) -> None:
        self.held = set(held)
        self.open = threading.Event()
        self._pattern, self._answer = re.compile(pattern), answer
        self._stepped = time.monotonic()

    def release(self, number: int) -> None:
        self.held.discard(number)

    def step(self, every: float) -> None:
        """Let the lowest held row through, at most once per ``every`` seconds of the caller's polling.

        Called from a loop that watches a run, it advances the run only as fast as the loop runs.
        """
        if self.held and time.monotonic() - self._stepped >= every:
            self.release(min(self.held))
            self._stepped = time.monotonic()

    async def __call__(self, body: dict) -> Reply | None:
        number = int(self._pattern.search(body["messages"][-1]["content"]).group(1))
        while number in self.held and not self.open.is_set():
            await asyncio.sleep(0.01)
        return self._answer(body)


class InFlight:
    """A responder that counts the requests in flight; the first ``meet`` wait for each other.

    Concurrency is proved by a state (``meet`` requests at the fake at once), not by hoping that a
    short sleep makes requests overlap: on a loaded machine a client may send slower than any sleep.
    If fewer than ``meet`` can ever be in flight, the waiters go on after a minute and ``peak`` shows it.
    ``hold`` keeps every request a little longer, so a client that sends more than its cap shows too.
    """

    def __init__(self, answer: Callable[[dict], Reply | None], meet: int, hold: float = 0.05) -> None:
        self.now = self.peak = 0
        self._answer, self._meet, self._hold = answer, meet, hold
        self._met: asyncio.Event | None = None  # made on the fake's event loop, at the first request

    async def __call__(self, body: dict) -> Reply | None:
        if self._met is None:
            self._met = asyncio.Event()
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            if self.now >= self._meet:
                self._met.set()
            try:
                await asyncio.wait_for(self._met.wait(), 60)  # a safety net only
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(self._hold)
        finally:
            self.now -= 1
        return self._answer(body)


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(computer_or_grader, config=None) -> base URL`` of a reward server on a thread; all stopped at teardown."""
    from gradekit.graders import RewardServer, create_app

    servers: list[RewardServer] = []

    def start(computer: Any, config: Any = None) -> str:
        server = RewardServer(create_app(computer, config), port=0, log_level="warning").start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def invoke(*args: str) -> tuple[int, str]:
    """``gradekit ARGS`` through Click's runner in this process: the exit status and what it printed."""
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def serve_in(folder: Path, **env: str) -> tuple[subprocess.Popen[str], str]:
    """``gradekit serve --config config.yaml --port 0`` started in ``folder``, ``env`` added to this process's: the
    process and the URL it printed (a server that printed none is killed and its stderr is the failure)."""
    proc = subprocess.Popen([sys.executable, "-m", "gradekit", "serve", "--config", "config.yaml", "--port", "0"],
                            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    url = proc.stdout.readline().strip()  # type: ignore[union-attr]
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        proc.wait()
        raise AssertionError(proc.stderr.read() or url)  # type: ignore[union-attr]
    return proc, url


async def until(ready: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    """Wait (async) for ``ready()``; fail naming ``what`` after ``deadline`` seconds instead of hanging the suite.

    The deadline is a safety net, never a measurement: a loaded machine only makes the wait longer.
    """
    end = time.monotonic() + deadline
    while not ready():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not reached within {deadline:.0f} s")
        await asyncio.sleep(0.005)


def until_sync(ready: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    """``until`` for threads and sync tests."""
    end = time.monotonic() + deadline
    while not ready():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not reached within {deadline:.0f} s")
        time.sleep(0.01)


def need(module: str, install: str) -> Any:
    """Import ``module`` for a test that needs an extra: skipped where it is missing, failed under CI.

    CI installs ``.[test]``, so a missing extra there is a broken install, not a reason to skip;
    as Redis, bubblewrap, chromium and Ray do, it fails, naming what to install.
    """
    import importlib
    import os

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is missing ({exc}); CI must install it: {install}", pytrace=False)
        pytest.skip(f"{module} is missing: {install}")
