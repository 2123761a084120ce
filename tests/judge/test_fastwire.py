"""The fast wire (judge._fastwire) against the SDK path: the same bytes on the wire, the same rows back (issue 49).

Each case runs one script of replies twice against the same loopback fake, once through the SDK
(``fast_wire=False``) and once over aiohttp, and compares what the fake received (every request's
body, byte for byte, and its headers) and the rows (every Verdict field but the latency). Run with
the newest openai (httpx2) here; ``FASTWIRE_SDK`` in CI-less runs names another venv's result (see
docs/testing.md): the same file passes with openai 1.78 (httpx) in a scratch venv.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from gradekit.judge import Judge, Limiter, RetryPolicy, load_rubric
from gradekit.judge._dialect import forget_dialects
from gradekit.judge._fastwire import encode, open_wire
from gradekit.judge._sdk import sdk_http
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import Waits

EN = load_rubric("semantic_equivalence_en")
ROW = {"question": "Où est la tour Eiffel ? ✓", "references": ["Paris"], "prediction": "à Paris, 1e-5 km près"}
_TRANSPORT = {"connection", "accept-encoding", "content-length", "host"}  # the HTTP library's own, per request


async def _judge_once(fake: FakeProvider, fast: bool, script: list[Reply], **options: Any) -> tuple[dict, list[bytes], list[dict], list[int]]:
    """One row through a new Judge: its Verdict (no latency), and each request's body, headers and status at the fake."""
    forget_dialects()  # the same endpoint for both runs: each starts as a new process would
    fake._last_prompt = ""  # ... and the fake's prompt cache with it (a repeated prompt would read as cached tokens)
    random.seed(49)  # the retry policy's jitter, alike in both runs
    before = len(fake.chat_requests())
    fake.push(*script)
    waits = Waits()
    retry = options.pop("retry", RetryPolicy(max_attempts=2))
    async with Judge("fake-judge", base_url=fake.base_url, api_key="sk-test", cache=None, sleep=waits, retry=retry,
                     limiter=Limiter(concurrency=1, sleep=Waits()), fast_wire=fast, **options) as judge:
        verdict = await judge.judge(EN, ROW)
        wire = judge._fleet.members[0].wires.get(asyncio.get_running_loop())
        assert (wire is not None) is fast, "the path under test is the one asked for"
    requests = fake.chat_requests()[before:]
    headers = [{k: v for k, v in r.headers.items() if k not in _TRANSPORT} for r in requests]
    row = verdict.model_dump(exclude={"latency_s"})
    row["waits"] = list(waits)
    return row, [r.raw for r in requests], headers, [r.status for r in requests]


def _both(fake: FakeProvider, script: list[Reply], **options: Any) -> tuple[tuple, tuple]:
    sdk = asyncio.run(_judge_once(fake, False, script, **dict(options)))
    fast = asyncio.run(_judge_once(fake, True, script, **dict(options)))
    return sdk, fast


RATE_HEADERS = {"retry-after-ms": "7", "x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "100ms"}


@pytest.mark.parametrize(("script", "options", "kind"), [
    pytest.param([Reply()], {}, None, id="ok"),
    pytest.param([Reply(status=401, error_message="Incorrect API key provided: sk-te***st.")], {}, "bad_request", id="401"),
    pytest.param([Reply(status=404, error_message="The model `fake-judge` does not exist")], {}, "bad_request", id="404"),
    pytest.param([Reply(status=429, headers=RATE_HEADERS, error_message="Rate limit reached"), Reply()], {}, None,
                 id="429_with_hints_then_ok"),
    pytest.param([Reply(status=500), Reply(status=500)], {}, "server_error", id="500"),
    pytest.param([Reply(status=503, headers={"retry-after": "0"}), Reply()], {}, None, id="503_then_ok"),
    pytest.param([Reply(delay=3.0), Reply(delay=3.0)], {"timeout": 0.4}, "timeout", id="timeout"),
    pytest.param([Reply(drop=True), Reply(drop=True)], {}, "server_error", id="cut_connection"),
    pytest.param([Reply(raw_body='{"choices": ['), Reply(raw_body="not json")], {}, "server_error", id="malformed_body"),
    pytest.param([Reply(status=400, error_message="Invalid value for 'seed'.")], {"params": {"seed": 7}}, "bad_request",
                 id="400_about_the_request"),
])
def test_the_fast_wire_sends_the_sdks_bytes_and_reads_every_reply_as_the_sdk_path(script: list[Reply], options: dict,
                                                                                   kind: str | None) -> None:
    with FakeProvider() as fake:
        (sdk_row, sdk_bodies, sdk_headers, sdk_status), (fast_row, fast_bodies, fast_headers, fast_status) = _both(fake, script, **options)
    assert fast_bodies == sdk_bodies and len(sdk_bodies) >= 1  # byte for byte, retries included
    assert fast_headers == sdk_headers  # auth, the SDK's own headers; only the HTTP library's transport headers differ
    assert fast_status == sdk_status
    assert fast_row == sdk_row, (fast_row, sdk_row)
    assert sdk_row["error_kind"] == kind, sdk_row  # the case met what it is named for


def test_a_refused_parameter_is_learnt_the_same_way_on_both_paths() -> None:
    """OpenAI's reasoning models: 400 unsupported_parameter / unsupported_value, one per request; the dialect learns
    each fix from the 400 the fast wire raises as the SDK would, and a parameter the user set fails the row."""
    with FakeProvider(dialect="openai-reasoning") as fake:
        learnt = _both(fake, [])
        refused = _both(fake, [], params={"temperature": 0.3})
    for sdk, fast in (learnt, refused):
        assert fast[1] == sdk[1] and fast[3] == sdk[3] and fast[0] == sdk[0], (fast[0], sdk[0])
    assert 400 in learnt[0][3] and learnt[0][0]["status"] == "ok"  # refused, fixed, answered
    assert refused[0][0]["error_kind"] == "bad_request" and "temperature" in refused[0][0]["error"]


def test_the_sdk_error_a_fast_wire_raises_carries_what_retry_and_pacing_read() -> None:
    """The same 429 through the SDK and through the wire: the same class, message, body and headers (the hints)."""
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def both(fake: FakeProvider) -> list[openai.RateLimitError]:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        wire = await open_wire(client)
        assert wire is not None
        caught = []
        try:
            for send in (lambda: client.post("/chat/completions", body=request, cast_to=sdk_http().Response),
                         lambda: wire.send(request)):
                with pytest.raises(openai.RateLimitError) as raised:
                    await send()
                caught.append(raised.value)
        finally:
            await wire.aclose()
            await client.close()
        return caught

    script = [Reply(status=429, headers=RATE_HEADERS, error_message="slow down")] * 2
    with FakeProvider(script=script) as fake:
        sdk, fast = asyncio.run(both(fake))
    assert type(fast) is type(sdk) and str(fast) == str(sdk) and fast.body == sdk.body and fast.status_code == 429
    for name in ("retry-after-ms", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"):
        assert fast.response.headers[name] == sdk.response.headers[name]
    assert type(fast.response) is type(sdk.response)  # the SDK's own HTTP library's response, whichever it is


@pytest.mark.parametrize("value", [
    pytest.param(0.0, id="zero"), pytest.param(0.7, id="plain"), pytest.param(1e-5, id="small"), pytest.param(2.5e-9, id="tiny"),
    pytest.param(1e16, id="large"), pytest.param(123456789.125, id="digits"), pytest.param(-0.0, id="negative_zero"),
    pytest.param("1e5 and 0.00001 in a string", id="float_like_text"), pytest.param({"k": [1, 2.0, None]}, id="nested_null"),
    pytest.param({1: "int key"}, id="int_key"), pytest.param(2**70, id="big_int"), pytest.param("\u2028\x00é😀", id="odd_text"),
])
def test_the_fast_wire_encodes_as_the_sdk_does(value: Any) -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "x"}], "extra": value}
    assert encode(request) == json.dumps(request, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def test_a_nan_is_refused_as_the_sdk_refuses_it() -> None:
    with pytest.raises(ValueError):
        encode({"model": "m", "temperature": float("nan")})


def test_random_floats_encode_as_the_stdlib_writes_them() -> None:
    rng = random.Random(49)
    values = [rng.uniform(-1, 1) * 10 ** rng.uniform(-30, 30) for _ in range(20_000)]
    request = {"values": values}
    assert encode(request) == json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode()


def test_each_new_event_loop_gets_its_own_wire_and_leaves_no_unclosed_session(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio.run per call (Ark's harness, scripts): an aiohttp session belongs to its loop; one left by a loop that
    closed is closed without a word (aiohttp logs "Unclosed client session" for one that is not)."""
    with FakeProvider() as fake, caplog.at_level(logging.ERROR, logger="asyncio"):
        judge = Judge("fake-judge", base_url=fake.base_url, api_key="k", cache=None, limiter=Limiter(concurrency=4))
        verdicts = [asyncio.run(judge.judge(EN, ROW)) for _ in range(3)]
        asyncio.run(judge.aclose())
        import gc

        gc.collect()
    assert all(v.ok for v in verdicts)
    assert len(fake.chat_requests()) == 3
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()], caplog.text


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeProvider() as fake:
        async def path(**options: Any) -> bool:
            async with Judge("fake-judge", base_url=fake.base_url, api_key="k", cache=None, **options) as judge:
                assert (await judge.judge(EN, ROW)).ok
                return judge._fleet.members[0].wires.get(asyncio.get_running_loop()) is not None

        assert asyncio.run(path()) is True  # on by default
        assert asyncio.run(path(fast_wire=False)) is False
        monkeypatch.setenv("GRADEKIT_FAST_WIRE", "0")
        assert asyncio.run(path()) is False
        assert asyncio.run(path(fast_wire=True)) is True  # the argument wins over the environment


@pytest.mark.parametrize(("env", "why"), [
    pytest.param({"ALL_PROXY": "http://127.0.0.1:9"}, "ALL_PROXY", id="all_proxy"),
    pytest.param({"HTTPS_PROXY": "socks5://127.0.0.1:9"}, "SOCKS", id="socks_proxy"),
])
def test_a_proxy_aiohttp_reads_otherwise_leaves_the_request_to_the_sdk(monkeypatch: pytest.MonkeyPatch, env: dict, why: str) -> None:
    async def opened() -> Any:
        client = openai.AsyncOpenAI(base_url="https://judge.example/v1", api_key="k", max_retries=0)
        for name, value in env.items():  # set once the SDK's client is built (without socksio it refuses a SOCKS proxy)
            monkeypatch.setenv(name, value)
        try:
            return await open_wire(client)
        finally:
            await client.close()

    assert asyncio.run(opened()) is None


def test_a_grade_run_writes_the_same_rows_on_both_paths(tmp_path: Path) -> None:
    """`gradekit grade` end to end, GRADEKIT_FAST_WIRE=0 and 1: a mix of answers, 429s and 5xx (--keep-going)."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "question": f"q{i} é", "references": ["x"], "prediction": "x" if i % 2 else "y"}) + "\n"
                              for i in range(12)), encoding="utf-8")
    script = [Reply(status=429, headers={"retry-after-ms": "5"}), Reply(status=500), Reply(status=401), Reply(drop=True)]
    outputs = {}
    with FakeProvider() as fake:
        for setting in ("0", "1"):
            forget_dialects()
            fake.push(*script)
            out = tmp_path / f"out{setting}.jsonl"
            done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out),
                                   "--base-url", fake.base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache", "--keep-going",
                                   "--concurrency", "1"], env={**os.environ, "GRADEKIT_FAST_WIRE": setting},
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode in (0, 1), done.stderr
            rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
            outputs[setting] = sorted(({k: v for k, v in r.items() if "latency" not in k} for r in rows), key=lambda r: r["id"])
    assert outputs["0"] == outputs["1"]
    assert {r.get("error_kind") for r in outputs["1"]} >= {None, "bad_request"}


class _Proxy:
    """A forward proxy on loopback that answers every request itself: it records each request line (absolute-form,
    as a client sends through a proxy) and answers as the fake judge would."""

    def __init__(self) -> None:
        import socket
        import threading

        self.lines: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        from gradekit.judge.testing._fake_provider import auto_reply, completion_payload

        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                self.lines.append(head.split(b"\r\n")[0].decode())
                request = json.loads(body)
                reply = json.dumps(completion_payload(auto_reply(request), request, number=1, model="fake-judge")).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             + f"content-length: {len(reply)}\r\n\r\n".encode() + reply)

    def close(self) -> None:
        self._server.close()


def test_an_http_proxy_from_the_environment_carries_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY as the SDK's HTTP library reads it: a judge at a host that does not resolve is reached through it."""
    proxy = _Proxy()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def once(fast: bool) -> dict:
        async with Judge("fake-judge", base_url="http://judge.invalid/v1", api_key="k", cache=None, limiter=Limiter(),
                         fast_wire=fast) as judge:
            return (await judge.judge(EN, ROW)).model_dump(exclude={"latency_s"})

    try:
        rows = [asyncio.run(once(fast)) for fast in (False, True)]
    finally:
        proxy.close()
    assert rows[0] == rows[1] and rows[0]["status"] == "ok", rows
    assert proxy.lines == ["POST http://judge.invalid/v1/chat/completions HTTP/1.1"] * 2
