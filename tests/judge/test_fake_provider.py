"""Tests of the shipped test seam ``gradekit.judge.testing``: always through the real openai SDK over HTTP."""

from __future__ import annotations

import asyncio
import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gradekit.judge.testing import FakeProvider, Reply, auto_reply

from ..conftest import until

MESSAGES = [{"role": "system", "content": "You are a judge."}, {"role": "user", "content": "Grade this answer."}]

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"$ref": "#/$defs/Verdict"},
        "rationale": {"type": "string"},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "confidence": {"type": "number"},
        "passed": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}},
    },
    "required": ["verdict", "rationale", "score", "confidence", "passed", "note", "tags"],
    "additionalProperties": False,
    "$defs": {"Verdict": {"type": "string", "enum": ["correct", "incorrect"]}},
}


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


ClientFactory = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def client_for() -> AsyncIterator[ClientFactory]:
    """A factory of SDK clients pointed at a fake; all are closed after the test."""
    made: list[openai.AsyncOpenAI] = []

    def make(fake: FakeProvider, *, base_url: str | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
        made.append(openai.AsyncOpenAI(base_url=base_url or fake.base_url, api_key="test-key", max_retries=0, **kwargs))
        return made[-1]

    yield make
    for client in made:
        await client.close()


async def ask(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
    return await client.chat.completions.create(model="judge-model", messages=MESSAGES, **kwargs)


# ---- scripting ------------------------------------------------------------------------------


async def test_script_is_fifo_then_falls_back_to_auto_reply(fake: FakeProvider, client_for: ClientFactory) -> None:
    fake.push(Reply(content="first"), Reply(content="second"))
    fake.push(Reply(content="third"))
    client = client_for(fake)
    contents = [(await ask(client)).choices[0].message.content for _ in range(4)]
    assert contents == ["first", "second", "third", "auto reply"]
    chats = fake.chat_requests()
    assert [r.status for r in chats] == [200] * 4
    assert chats[0].body is not None and chats[0].body["messages"] == MESSAGES
    assert chats[0].headers["authorization"] == "Bearer test-key"
    assert chats[0].path == "/v1/chat/completions"


async def test_constructor_script_and_completion_shape(fake: FakeProvider, client_for: ClientFactory) -> None:
    with FakeProvider(script=[Reply(content="hello world!")]) as scripted:
        resp = await ask(client_for(scripted))
    assert resp.object == "chat.completion"
    assert resp.model == "judge-model"  # echoes the request's model
    assert resp.id.startswith("chatcmpl-")
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.tool_calls is None
    prompt_chars = sum(len(m["content"]) for m in MESSAGES)
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == prompt_chars // 4
    assert resp.usage.completion_tokens == len("hello world!") // 4
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


async def test_responder_answers_unscripted_requests(fake: FakeProvider, client_for: ClientFactory) -> None:
    seen: list[dict[str, Any]] = []

    def responder(body: dict[str, Any]) -> Reply | None:
        seen.append(body)
        last = body["messages"][-1]["content"]
        return Reply(content=f"echo: {last}") if last != "skip" else None

    fake.set_responder(responder)
    fake.push(Reply(content="scripted wins"))
    client = client_for(fake)
    assert (await ask(client)).choices[0].message.content == "scripted wins"
    assert (await ask(client)).choices[0].message.content == "echo: Grade this answer."
    skipped = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "skip"}])
    assert skipped.choices[0].message.content == "auto reply"
    assert len(seen) == 2  # the scripted reply did not consult the responder


async def test_reset_and_requests_snapshot(fake: FakeProvider, client_for: ClientFactory) -> None:
    fake.push(Reply(content="never used"))
    client = client_for(fake)
    await client.models.list()
    snapshot = fake.requests
    assert len(snapshot) == 1 and snapshot[0].path == "/v1/models"
    assert fake.chat_requests() == []
    snapshot[0].status = 999
    assert fake.requests[0].status == 200  # mutating a snapshot does not touch the record
    fake.reset()
    assert fake.requests == []
    assert (await ask(client)).choices[0].message.content == "auto reply"


async def test_models_endpoint_and_unversioned_chat_path(fake: FakeProvider, client_for: ClientFactory) -> None:
    models = await client_for(fake).models.list()
    assert [m.id for m in models.data] == ["fake-judge"]
    bare = client_for(fake, base_url=fake.base_url.removesuffix("/v1"))
    assert (await ask(bare)).choices[0].message.content == "auto reply"
    assert fake.chat_requests()[-1].path == "/chat/completions"


# ---- auto_reply -----------------------------------------------------------------------------


async def test_auto_reply_fills_json_schema(fake: FakeProvider, client_for: ClientFactory) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True}}
    resp = await ask(client_for(fake), response_format=rf)
    assert json.loads(resp.choices[0].message.content) == {
        "verdict": "correct", "rationale": "auto reply", "score": 1, "confidence": 0,
        "passed": True, "note": "auto reply", "tags": ["x"],
    }


async def test_auto_reply_forced_tool_call(fake: FakeProvider, client_for: ClientFactory) -> None:
    tools = [
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "submit_grade", "parameters": VERDICT_SCHEMA}},
    ]
    choice = {"type": "function", "function": {"name": "submit_grade"}}
    resp = await ask(client_for(fake), tools=tools, tool_choice=choice)
    assert resp.choices[0].finish_reason == "tool_calls"
    (call,) = resp.choices[0].message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "submit_grade"
    assert json.loads(call.function.arguments)["verdict"] == "correct"


async def test_auto_reply_plain_and_json_object(fake: FakeProvider, client_for: ClientFactory) -> None:
    client = client_for(fake)
    assert (await ask(client)).choices[0].message.content == "auto reply"
    resp = await ask(client, response_format={"type": "json_object"})
    assert json.loads(resp.choices[0].message.content) == {"rationale": "auto reply"}


def test_auto_reply_respects_numeric_bounds_and_is_deterministic() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "b": {"type": "integer", "minimum": -5, "maximum": -2},
        "c": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
    }}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    first = auto_reply(body)
    assert json.loads(first.content or "") == {"a": 0.5, "b": -2, "c": [0, 0]}
    assert auto_reply(body) == first


# ---- errors and faults ----------------------------------------------------------------------


async def test_scripted_429_carries_retry_headers(fake: FakeProvider, client_for: ClientFactory) -> None:
    fake.push(Reply(status=429, error_message="slow down", headers={"Retry-After": "1", "retry-after-ms": "150"}))
    with pytest.raises(openai.RateLimitError) as info:
        await ask(client_for(fake))
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.response.headers["retry-after-ms"] == "150"
    assert "slow down" in info.value.message
    assert fake.chat_requests()[0].status == 429


@pytest.mark.parametrize("status", [500, 503])
async def test_5xx_is_internal_server_error(fake: FakeProvider, status: int, client_for: ClientFactory) -> None:
    fake.push(Reply(status=status, error_message="overloaded"))
    with pytest.raises(openai.InternalServerError) as info:
        await ask(client_for(fake))
    assert info.value.status_code == status
    assert isinstance(info.value.body, dict) and info.value.body["type"] == "server_error"
    assert fake.chat_requests()[0].status == status


async def test_reject_json_schema_is_bad_request_and_keeps_script(client_for: ClientFactory) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "v", "schema": VERDICT_SCHEMA}}
    with FakeProvider(reject_json_schema=True, script=[Reply(content="kept")]) as fake:
        client = client_for(fake)
        with pytest.raises(openai.BadRequestError) as info:
            await ask(client, response_format=rf)
        assert "json_schema" in info.value.message and "response_format" in info.value.message
        assert (await ask(client)).choices[0].message.content == "kept"
        assert [r.status for r in fake.chat_requests()] == [400, 200]


async def test_reject_tools_and_json_object(client_for: ClientFactory) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with FakeProvider(reject_tools=True, reject_json_object=True) as fake:
        client = client_for(fake)
        with pytest.raises(openai.BadRequestError, match="tools"):
            await ask(client, tools=tools)
        with pytest.raises(openai.BadRequestError, match="json_object"):
            await ask(client, response_format={"type": "json_object"})
        assert (await ask(client)).choices[0].message.content == "auto reply"


async def test_truncated_raw_body_surfaces_as_json_decode_error(fake: FakeProvider, client_for: ClientFactory) -> None:
    # The SDK does not wrap an unparsable 200 body: callers see a bare json.JSONDecodeError.
    fake.push(Reply(raw_body='{"id": "chatcmpl-1", "choices": [{"mess'))
    with pytest.raises(json.JSONDecodeError):
        await ask(client_for(fake))
    assert fake.chat_requests()[0].status == 200


async def test_raw_body_with_error_status(fake: FakeProvider, client_for: ClientFactory) -> None:
    fake.push(Reply(raw_body="<html>bad gateway</html>", status=502))
    with pytest.raises(openai.InternalServerError) as info:
        await ask(client_for(fake))
    assert info.value.status_code == 502


async def test_drop_is_connection_error_and_server_survives(fake: FakeProvider, client_for: ClientFactory) -> None:
    fake.push(Reply(drop=True), Reply(content="after the drop"))
    client = client_for(fake, timeout=5.0)
    with pytest.raises(openai.APIConnectionError) as info:
        await ask(client)
    assert not isinstance(info.value, openai.APITimeoutError)
    assert (await ask(client)).choices[0].message.content == "after the drop"
    assert [r.status for r in fake.chat_requests()] == [0, 200]


async def test_delay_past_client_timeout_does_not_block_others(fake: FakeProvider, client_for: ClientFactory) -> None:
    # The slow answer cannot come for a minute, far past the fast client's patience: if its sleep held up
    # the server, the fast request would time out. No bound here depends on how loaded the machine is.
    fake.push(Reply(content="slow", delay=60), Reply(content="fast"), Reply(content="too slow", delay=60))
    slow = asyncio.create_task(ask(client_for(fake, timeout=120.0)))
    await until(lambda: len(fake.chat_requests()) >= 1, "the slow request at the fake")  # it took the first scripted reply
    fast = await ask(client_for(fake, timeout=30.0))
    assert fast.choices[0].message.content == "fast"
    assert not slow.done()  # still sleeping at the fake while the fast one was answered
    with pytest.raises(openai.APITimeoutError):  # a delay past the client's timeout is a timeout, not an answer
        await ask(client_for(fake, timeout=0.3))
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)


async def test_latency_is_added_to_every_answer(client_for: ClientFactory) -> None:
    with FakeProvider(latency=0.2) as fake:
        start = time.monotonic()
        await ask(client_for(fake))
        assert time.monotonic() - start >= 0.2


async def test_stop_wakes_pending_delays(client_for: ClientFactory) -> None:
    # Woken, the pending delay ends and its answer goes out during the graceful shutdown. Not woken, it
    # would still be sleeping when uvicorn's graceful period ends and cancels it: the client gets no answer.
    fake = FakeProvider(script=[Reply(content="late", delay=300)]).start()
    pending = asyncio.create_task(ask(client_for(fake, timeout=120.0)))
    await until(lambda: bool(fake.chat_requests()), "the delayed request at the fake")
    await asyncio.to_thread(fake.stop)
    assert (await pending).choices[0].message.content == "late"


async def test_length_refusal_logprobs_and_usage_are_visible(fake: FakeProvider, client_for: ClientFactory) -> None:
    logprobs = [{"token": "yes", "logprob": -0.1, "bytes": [121, 101, 115], "top_logprobs": []}]
    fake.push(
        Reply(content="partial ans", finish_reason="length", logprobs=logprobs,
              usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}),
        Reply(refusal="I can't grade that."),
        Reply(tool_call={"name": "grade", "arguments": '{"score": 3}'}, finish_reason="stop"),
    )
    client = client_for(fake)
    truncated = await ask(client)
    assert truncated.choices[0].finish_reason == "length"
    assert truncated.choices[0].message.content == "partial ans"
    assert truncated.choices[0].logprobs is not None
    assert truncated.choices[0].logprobs.content[0].token == "yes"
    assert truncated.usage is not None and truncated.usage.total_tokens == 10
    refused = await ask(client)
    assert refused.choices[0].message.refusal == "I can't grade that."
    assert refused.choices[0].message.content is None
    tool = await ask(client)
    assert tool.choices[0].finish_reason == "stop"  # explicitly set: not overridden to tool_calls
    assert tool.choices[0].message.tool_calls[0].function.arguments == '{"score": 3}'


# ---- server-side rate limit -----------------------------------------------------------------


async def test_token_bucket_rate_limit(client_for: ClientFactory) -> None:
    # A slow refill (2/s) so that a loaded machine, spreading the 40 arrivals over seconds, still meets the limit.
    with FakeProvider(rate_limit_rps=2, rate_limit_burst=10) as fake:
        client = client_for(fake, timeout=30.0)
        results = await asyncio.gather(*(ask(client) for _ in range(40)), return_exceptions=True)
        ok = [r for r in results if not isinstance(r, BaseException)]
        limited = [r for r in results if isinstance(r, openai.RateLimitError)]
        assert len(ok) + len(limited) == 40
        # The burst of 10, plus what refilled (2/s) between the first and last arrival on the fake's clock.
        arrivals = [r.time for r in fake.chat_requests()]
        assert 10 <= len(ok) <= 10 + 2 * (max(arrivals) - min(arrivals)) + 1
        err = limited[0]
        assert int(err.response.headers["retry-after"]) >= 1
        assert 1 <= int(err.response.headers["retry-after-ms"]) <= 500  # one token at 2/s
        assert isinstance(err.body, dict) and err.body["code"] == "rate_limit_exceeded"
        statuses = [r.status for r in fake.chat_requests()]
        assert statuses.count(200) == len(ok) and statuses.count(429) == len(limited)
        await asyncio.sleep(0.6)  # refills at least 1.2 tokens: a whole one, whatever was left
        assert (await ask(client)).choices[0].message.content == "auto reply"


def test_only_loopback_hosts_are_allowed() -> None:
    with pytest.raises(ValueError):
        FakeProvider(host="0.0.0.0")


# ---- subprocess mode ------------------------------------------------------------------------


def test_subprocess_serves_script_and_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    lines = [Reply(content="from file").model_dump_json(), "", Reply(status=503).model_dump_json()]
    script.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradekit.judge.testing", "--port", "0", "--script", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # a safety net against a hang, not a start-up deadline
        assert ready, "no base_url printed within 60 s"
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=5.0)
        resp = client.chat.completions.create(model="m", messages=MESSAGES)
        assert resp.choices[0].message.content == "from file"
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "auto reply"
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()



def test_the_fake_run_outside_its_environment_says_so_in_one_line(tmp_path) -> None:
    """Issue 48: ``python -m judge.testing`` (the folder's old name, from the repository) with a Python that has no gradekit,
    and ``python -m gradekit.judge.testing`` without the server it runs on, were tracebacks."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # -S: no site-packages, as a Python outside the venv has none of gradekit's; the repository folder is on the path (-m).
    outside = subprocess.run([sys.executable, "-S", "-m", "judge.testing"], cwd=root, capture_output=True, text=True, timeout=60)
    assert outside.returncode == 2 and "Traceback" not in outside.stderr, outside.stderr
    said = outside.stderr.strip()
    assert len(said.splitlines()) == 1 and "gradekit" in said and "python -m gradekit.judge.testing" in said, said

    shadow = tmp_path / "shadow" / "uvicorn"  # a uvicorn that cannot be imported stands for an environment without it
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'uvicorn'\", name='uvicorn')\n")
    no_server = subprocess.run([sys.executable, "-m", "gradekit.judge.testing"], capture_output=True, text=True, timeout=60,
                               env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "shadow")})
    assert no_server.returncode == 2 and "Traceback" not in no_server.stderr, no_server.stderr
    said = no_server.stderr.strip()
    assert len(said.splitlines()) == 1 and "uvicorn" in said and "pip install" in said, said


def _chain_bodies():
    """Every shipped rubric in every ask mode of its chain, rendered for one plain row, as the request the client builds."""
    from gradekit.judge import list_rubrics
    from gradekit.judge._checklist import bind_row
    from gradekit.judge import build_request

    for rubric in list_rubrics():
        shapes = {"list": ["a", "b", "c"], "criteria": ["It is short."],
                  "trajectory": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
        row = {var: shapes.get(spec.type, "a") for var, spec in rubric.variables.items()}
        bound = bind_row(rubric, row)
        for mode in bound.ask_modes:
            yield pytest.param(bound, mode, build_request(bound, bound.render(row, mode), mode, "m", {}), id=f"{rubric.name}-{mode}")


@pytest.mark.parametrize("rubric, mode, body", list(_chain_bodies()))
def test_the_default_reply_and_a_population_judge_hold_a_verdict_in_every_shipped_rubrics_modes(rubric, mode, body) -> None:
    """Issue 48 (docs/testing.md): the default reply "holds a verdict in every ask mode" was not so for the regex rubrics
    (answer_verification_yes_no's "Final Decision: Yes", llmbar's "Output (a)", arena's [[A=B]], group_rank's ranking),
    and a JudgePopulation's reply in tags or text mode was a bare label."""
    from gradekit.judge._parse import Reading, read_completion
    from gradekit.judge.testing import labelled_reply

    def read(reply: Reply):
        message = {"role": "assistant", "content": reply.content}
        if reply.tool_call:
            message["tool_calls"] = [{"id": "c", "type": "function", "function": reply.tool_call}]
        return read_completion(rubric, {"choices": [{"message": message, "finish_reason": "stop"}]}, mode)

    if not (rubric.is_checklist and mode == "json_object"):  # only the schema names a checklist's criterion ids
        reading = read(auto_reply(body))
        assert isinstance(reading, Reading), (reading.error, auto_reply(body).content)
    if rubric.is_checklist or rubric.name == "group_rank":
        return  # no one label to name: a checklist's verdicts are per criterion, a ranking is an order
    for label in rubric.labels:
        reading = read(labelled_reply(body, label))
        assert isinstance(reading, Reading) and reading.label == label, (label, getattr(reading, "error", None),
                                                                         labelled_reply(body, label).content)
