"""Provider dialects of the fake provider (#20), spoken to with the real ``openai`` SDK over HTTP.

One group per dialect, each asserting the documented behaviour its ``DIALECTS`` entry cites.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gradekit.judge.testing import DIALECTS, Dialect, FakeProvider, Reply

NAMES = {"openai", "openai-reasoning", "dashscope-thinking", "ark-thinking", "vllm-reasoning-parser",
         "vllm-no-parser", "deepseek-reasoner", "gemini", "anthropic", "openai-context-window", "vllm-context-window",
         "dashscope-context-window", "anthropic-context-window", "gemini-context-window"}
HI = [{"role": "user", "content": "Is the answer right? Reply <answer>Yes</answer> or <answer>No</answer>."}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {
    "type": "object", "properties": {"judgement": {"type": "string", "enum": ["correct", "incorrect"]}},
    "required": ["judgement"]}}}


@pytest.fixture
def serve() -> Iterator:
    started: list[FakeProvider] = []

    def start(dialect: str | Dialect, **kwargs) -> tuple[FakeProvider, openai.OpenAI]:
        fake = FakeProvider(dialect=dialect, **kwargs).start()
        started.append(fake)
        return fake, openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)

    yield start
    for fake in started:
        fake.stop()


def _error(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


def _stream(client: openai.OpenAI, **kwargs) -> list:
    return list(client.chat.completions.create(model="m", messages=HI, stream=True, **kwargs))


def _field(message, name: str):
    return message.model_dump().get(name)


# ---- the table ---------------------------------------------------------------------------------------


def test_the_dialect_table_names_every_dialect_with_what_differs_and_its_sources() -> None:
    assert set(DIALECTS) == NAMES
    for name, dialect in DIALECTS.items():
        assert dialect.name == name and len(dialect.summary) > 40
        assert dialect.sources and all(s.startswith("https://") for s in dialect.sources)


def test_an_unknown_dialect_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="openai-reasoning"):
        FakeProvider(dialect="openia")


def test_the_default_dialect_is_unchanged_and_never_thinks(serve) -> None:
    fake, client = serve("openai", script=[Reply(content="<answer>Yes</answer>", reasoning="draft <answer>No</answer>")])
    message = client.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=5, logprobs=True).choices[0].message
    assert message.content == "<answer>Yes</answer>"
    assert _field(message, "reasoning_content") is None and _field(message, "reasoning") is None


def test_every_dialect_streams_a_tool_call_the_sdk_assembles(serve) -> None:
    fake, client = serve("openai", script=[Reply(tool_call={"name": "submit", "arguments": '{"judgement": "correct"}'})])
    chunks = _stream(client)
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].function.name == "submit"
    assert "".join(c[0].function.arguments or "" for c in calls) == '{"judgement": "correct"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# ---- openai-reasoning --------------------------------------------------------------------------------


def test_openai_reasoning_refuses_temperature_other_than_1_with_unsupported_value(serve) -> None:
    fake, client = serve("openai-reasoning")
    exc = _error(lambda: client.chat.completions.create(model="gpt-5-mini", messages=HI, temperature=0))
    assert exc.status_code == 400
    assert exc.body == {"message": "Unsupported value: 'temperature' does not support 0 with this model. "
                                   "Only the default (1) value is supported.",
                        "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}
    assert client.chat.completions.create(model="gpt-5-mini", messages=HI, temperature=1).choices


@pytest.mark.parametrize(("param", "value"), [
    pytest.param("max_tokens", 10, id="max_tokens"), pytest.param("logprobs", True, id="logprobs"),
    pytest.param("top_logprobs", 2, id="top_logprobs"), pytest.param("presence_penalty", 0.5, id="presence_penalty"),
    pytest.param("frequency_penalty", 0.5, id="frequency_penalty"),
])
def test_openai_reasoning_refuses_unsupported_parameters(serve, param: str, value) -> None:
    fake, client = serve("openai-reasoning")
    exc = _error(lambda: client.chat.completions.create(model="o3", messages=HI, **{param: value}))
    assert exc.status_code == 400 and exc.body["param"] == param and exc.body["code"] == "unsupported_parameter"
    if param == "max_tokens":
        assert "max_completion_tokens" in exc.body["message"]


def test_openai_reasoning_answers_one_error_per_request_in_a_fixed_order(serve) -> None:
    fake, client = serve("openai-reasoning", script=[Reply(content="ok")])
    body = {"max_tokens": 5, "temperature": 0, "logprobs": True}
    seen = []
    for _ in range(3):
        exc = _error(lambda: client.chat.completions.create(model="o3", messages=HI, **body))
        seen.append(exc.body["param"])
        body.pop(exc.body["param"])
    assert seen == ["max_tokens", "temperature", "logprobs"]
    assert client.chat.completions.create(model="o3", messages=HI).choices[0].message.content == "ok", \
        "a refused request consumes no scripted reply"


def test_openai_reasoning_bills_hidden_reasoning_and_cached_prompt_tokens(serve) -> None:
    fake, client = serve("openai-reasoning")
    first = client.chat.completions.create(model="o3", messages=HI, reasoning_effort="low", max_completion_tokens=2000)
    second = client.chat.completions.create(model="o3", messages=HI, reasoning_effort="high")
    assert _field(first.choices[0].message, "reasoning_content") is None, "the reasoning itself is not returned"
    assert 0 < first.usage.completion_tokens_details.reasoning_tokens < second.usage.completion_tokens_details.reasoning_tokens
    assert first.usage.completion_tokens > first.usage.completion_tokens_details.reasoning_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0, "the same prompt again is served from the cache"


def test_openai_reasoning_that_uses_up_max_completion_tokens_is_cut_off_with_no_answer(serve) -> None:
    fake, client = serve("openai-reasoning", script=[Reply(content="<answer>Yes</answer>")])
    choice = client.chat.completions.create(model="o3", messages=HI, max_completion_tokens=16).choices[0]
    assert choice.finish_reason == "length" and choice.message.content == ""


# ---- dashscope-thinking ------------------------------------------------------------------------------


def test_dashscope_thinking_refuses_a_non_streaming_call_that_does_not_turn_thinking_off(serve) -> None:
    fake, client = serve("dashscope-thinking")
    exc = _error(lambda: client.chat.completions.create(model="qwen3-32b", messages=HI))
    assert exc.status_code == 400
    assert exc.body == {"message": "parameter.enable_thinking must be set to false for non-streaming calls",
                        "type": "invalid_request_error", "param": None, "code": "invalid_parameter_error"}
    raw = httpx.post(f"{fake.base_url}/chat/completions", json={"model": "qwen3-32b", "messages": HI}).json()
    assert raw["request_id"] and raw["error"]["code"] == "invalid_parameter_error"


def test_dashscope_without_thinking_answers_a_normal_call(serve) -> None:
    fake, client = serve("dashscope-thinking", script=[Reply(content="<answer>Yes</answer>")])
    message = client.chat.completions.create(model="qwen3-32b", messages=HI,
                                             extra_body={"enable_thinking": False}).choices[0].message
    assert message.content == "<answer>Yes</answer>" and _field(message, "reasoning_content") is None


def test_dashscope_streams_reasoning_deltas_before_content_deltas_and_a_usage_chunk(serve) -> None:
    fake, client = serve("dashscope-thinking", script=[Reply(content="<answer>Yes</answer> because it matches.",
                                                             reasoning="Hmm, first I thought <answer>No</answer>.")])
    chunks = _stream(client, stream_options={"include_usage": True})
    kinds = []
    for chunk in chunks:
        delta = chunk.choices[0].delta.model_dump() if chunk.choices else {}
        if delta.get("reasoning_content"):
            kinds.append("reasoning")
        if delta.get("content"):
            kinds.append("content")
    assert kinds.index("content") > kinds.index("reasoning")
    assert kinds == sorted(kinds, key=lambda k: k == "content"), "no reasoning after the first content delta"
    reasoning = "".join(c.choices[0].delta.model_dump().get("reasoning_content") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "Hmm, first I thought <answer>No</answer>."
    assert content == "<answer>Yes</answer> because it matches."
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0


def test_dashscope_stream_ends_with_done(serve) -> None:
    fake, client = serve("dashscope-thinking")
    with httpx.stream("POST", f"{fake.base_url}/chat/completions",
                      json={"model": "qwen3-32b", "messages": HI, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["object"] == "chat.completion.chunk" for line in lines[:-1])


def test_dashscope_thinking_refuses_json_mode_and_a_forced_tool_choice(serve) -> None:
    fake, client = serve("dashscope-thinking")
    exc = _error(lambda: _stream(client, response_format=SCHEMA))
    assert exc.status_code == 400 and "Json mode response is not supported when enable_thinking is true" in exc.body["message"]
    tools = [{"type": "function", "function": {"name": "submit", "parameters": {"type": "object"}}}]
    exc = _error(lambda: _stream(client, tools=tools, tool_choice={"type": "function", "function": {"name": "submit"}}))
    assert exc.status_code == 400 and "tool_choice" in exc.body["message"]
    assert _stream(client, tools=tools, tool_choice="auto"), "a tool offered, not forced, is fine"


def test_a_thinking_dialects_default_draft_holds_a_verdict_unlike_the_final_answer(serve) -> None:
    fake, client = serve("dashscope-thinking", script=[Reply(content="<answer>Yes</answer>")])
    chunks = _stream(client)
    reasoning = "".join(c.choices[0].delta.model_dump().get("reasoning_content") or "" for c in chunks if c.choices)
    assert "<answer>No</answer>" in reasoning and "<answer>Yes</answer>" not in reasoning
    assert "[[B>A]]" in reasoning and "Output (b)" in reasoning


def test_a_draft_in_json_takes_an_enum_value_the_answer_does_not(serve) -> None:
    fake, client = serve("ark-thinking", script=[Reply(content='{"judgement": "correct"}')])
    message = client.chat.completions.create(model="doubao-seed-1-6", messages=HI, response_format=SCHEMA).choices[0].message
    assert message.content == '{"judgement": "correct"}'
    assert '"judgement": "incorrect"' in _field(message, "reasoning_content")
    assert '"judgement": "correct"' not in _field(message, "reasoning_content")


def test_a_cut_off_stream_in_a_thinking_dialect_is_only_the_draft(serve) -> None:
    fake, client = serve("dashscope-thinking", script=[Reply(content="<answer>Yes</answer>", finish_reason="length")])
    chunks = _stream(client)
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<answer>No</answer>" in "".join(c.choices[0].delta.model_dump().get("reasoning_content") or ""
                                            for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_scripted_faults_apply_to_a_streamed_request(serve) -> None:
    fake, client = serve("dashscope-thinking", script=[Reply(status=503), Reply(drop=True)])
    assert _error(lambda: _stream(client)).status_code == 503
    with pytest.raises((openai.APIConnectionError, httpx.HTTPError)):
        _stream(client)


# ---- ark-thinking --------------------------------------------------------------------------------------


def test_ark_thinks_unless_disabled_and_counts_reasoning_tokens(serve) -> None:
    fake, client = serve("ark-thinking")
    on = client.chat.completions.create(model="doubao-seed-1-6", messages=HI, extra_body={"thinking": {"type": "enabled"}})
    default = client.chat.completions.create(model="doubao-seed-1-6", messages=HI)
    off = client.chat.completions.create(model="doubao-seed-1-6", messages=HI, extra_body={"thinking": {"type": "disabled"}})
    assert _field(on.choices[0].message, "reasoning_content") and _field(default.choices[0].message, "reasoning_content")
    assert on.usage.completion_tokens_details.reasoning_tokens > 0
    assert _field(off.choices[0].message, "reasoning_content") is None
    assert off.usage.completion_tokens_details.reasoning_tokens == 0


def test_ark_refuses_an_unknown_thinking_type(serve) -> None:
    fake, client = serve("ark-thinking")
    exc = _error(lambda: client.chat.completions.create(model="doubao-seed-1-6", messages=HI,
                                                        extra_body={"thinking": {"type": "sometimes"}}))
    assert exc.status_code == 400
    assert exc.body["code"] == "InvalidParameter" and exc.body["param"] == "thinking.type" and exc.body["type"] == "BadRequest"


# ---- vLLM ------------------------------------------------------------------------------------------------


def test_vllm_with_a_parser_sends_reasoning_apart_from_the_answer(serve) -> None:
    fake, client = serve("vllm-reasoning-parser", script=[Reply(content="<answer>Yes</answer>", reasoning="draft")])
    message = client.chat.completions.create(model="Qwen/Qwen3-8B", messages=HI).choices[0].message
    assert message.content == "<answer>Yes</answer>" and _field(message, "reasoning") == "draft"


def test_vllm_with_a_parser_cut_off_while_thinking_has_no_content(serve) -> None:
    fake, client = serve("vllm-reasoning-parser", script=[Reply(content="<answer>Yes</answer>", finish_reason="length")])
    choice = client.chat.completions.create(model="Qwen/Qwen3-8B", messages=HI).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    assert "<answer>No</answer>" in _field(choice.message, "reasoning")


def test_vllm_thinking_off_by_chat_template_kwargs_and_an_older_field_name(serve) -> None:
    older = dataclasses.replace(DIALECTS["vllm-reasoning-parser"], reasoning_field="reasoning_content")
    fake, client = serve(older)
    message = client.chat.completions.create(model="m", messages=HI).choices[0].message
    assert _field(message, "reasoning_content") and _field(message, "reasoning") is None
    off = client.chat.completions.create(model="m", messages=HI,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
    assert _field(off, "reasoning_content") is None


def test_vllm_without_a_parser_puts_the_thinking_in_think_tags(serve) -> None:
    fake, client = serve("vllm-no-parser", script=[Reply(content="<answer>Yes</answer>")])
    content = client.chat.completions.create(model="m", messages=HI).choices[0].message.content
    assert content.startswith("<think>\n") and content.endswith("\n</think>\n\n<answer>Yes</answer>")
    assert "<answer>No</answer>" in content.split("</think>")[0]


def test_vllm_without_a_parser_and_think_in_the_prompt_sends_only_the_closing_tag(serve) -> None:
    r1 = dataclasses.replace(DIALECTS["vllm-no-parser"], think_open_in_prompt=True)
    fake, client = serve(r1, script=[Reply(content="<answer>Yes</answer>", reasoning="hmm")])
    assert client.chat.completions.create(model="m", messages=HI).choices[0].message.content == \
        "hmm\n</think>\n\n<answer>Yes</answer>"


def test_vllm_without_a_parser_cut_off_is_the_unfinished_draft(serve) -> None:
    fake, client = serve("vllm-no-parser", script=[Reply(content="<answer>Yes</answer>", finish_reason="length")])
    choice = client.chat.completions.create(model="m", messages=HI).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content.startswith("<think>\n") and "</think>" not in choice.message.content
    assert "<answer>No</answer>" in choice.message.content and "<answer>Yes</answer>" not in choice.message.content


# ---- deepseek-reasoner -------------------------------------------------------------------------------


def test_deepseek_reasoner_sends_reasoning_content_and_ignores_sampling_parameters(serve) -> None:
    fake, client = serve("deepseek-reasoner", script=[Reply(content="<answer>Yes</answer>", reasoning="thinking")])
    message = client.chat.completions.create(model="deepseek-reasoner", messages=HI, temperature=0, top_p=0.5).choices[0].message
    assert message.content == "<answer>Yes</answer>" and _field(message, "reasoning_content") == "thinking"


@pytest.mark.parametrize("body", [
    pytest.param({"logprobs": True}, id="logprobs"), pytest.param({"top_logprobs": 2, "logprobs": True}, id="top_logprobs"),
    pytest.param({"response_format": SCHEMA}, id="json_schema"),
    pytest.param({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, id="tools"),
])
def test_deepseek_reasoner_refuses_what_its_docs_say_it_does_not_support(serve, body: dict) -> None:
    fake, client = serve("deepseek-reasoner")
    assert _error(lambda: client.chat.completions.create(model="deepseek-reasoner", messages=HI, **body)).status_code == 400


def test_deepseek_reasoner_takes_json_object(serve) -> None:
    fake, client = serve("deepseek-reasoner")
    content = client.chat.completions.create(model="deepseek-reasoner", messages=HI,
                                             response_format={"type": "json_object"}).choices[0].message.content
    assert json.loads(content)


# ---- gemini ------------------------------------------------------------------------------------------------


def test_gemini_429_is_a_json_array_with_a_retry_delay_and_no_headers(serve) -> None:
    fake, client = serve("gemini", rate_limit_rps=0.5, rate_limit_burst=1)
    ok = client.chat.completions.with_raw_response.create(model="gemini-2.5-flash", messages=HI)
    assert not [h for h in ok.headers if "ratelimit" in h]
    exc = _error(lambda: client.chat.completions.create(model="gemini-2.5-flash", messages=HI))
    assert isinstance(exc, openai.RateLimitError)
    assert "retry-after" not in exc.response.headers and "retry-after-ms" not in exc.response.headers
    body = exc.response.json()
    assert isinstance(body, list) and body[0]["error"]["status"] == "RESOURCE_EXHAUSTED" and body[0]["error"]["code"] == 429
    retry = [d for d in body[0]["error"]["details"] if d["@type"] == "type.googleapis.com/google.rpc.RetryInfo"]
    assert retry[0]["retryDelay"].endswith("s") and 0 < float(retry[0]["retryDelay"][:-1]) <= 2


def test_gemini_errors_are_json_arrays_and_reasoning_effort_is_accepted(serve) -> None:
    fake, client = serve("gemini", script=[Reply(status=500)])
    assert isinstance(_error(lambda: client.chat.completions.create(model="g", messages=HI)).response.json(), list)
    assert client.chat.completions.create(model="g", messages=HI, reasoning_effort="low").choices
    exc = _error(lambda: client.chat.completions.create(model="g", messages=HI, extra_body={"reasoning_effort": "extreme"}))
    assert exc.status_code == 400 and exc.response.json()[0]["error"]["status"] == "INVALID_ARGUMENT"


# ---- anthropic ---------------------------------------------------------------------------------------------


def test_anthropic_ignores_response_format_and_logprobs(serve) -> None:
    fake, client = serve("anthropic", script=[Reply(content='{"judgement": "correct"}', logprobs=[{"token": "x", "logprob": 0}])])
    choice = client.chat.completions.create(model="claude-sonnet-4-5", messages=HI, response_format=SCHEMA,
                                            logprobs=True, seed=1).choices[0]
    assert choice.message.content == '```json\n{"judgement": "correct"}\n```'
    assert choice.logprobs is None


def test_anthropic_needs_n_1_and_does_not_return_extended_thinking(serve) -> None:
    fake, client = serve("anthropic")
    assert _error(lambda: client.chat.completions.create(model="c", messages=HI, n=2)).status_code == 400
    message = client.chat.completions.create(model="c", messages=HI,
                                             extra_body={"thinking": {"type": "enabled", "budget_tokens": 2000}}).choices[0].message
    assert _field(message, "reasoning_content") is None and message.content == "auto reply\n<answer>Yes</answer>"  # the default reply answers the tags it is asked for


def test_anthropic_sends_its_own_rate_limit_headers_and_retry_after(serve) -> None:
    fake, client = serve("anthropic", rate_limit_rps=0.5, rate_limit_burst=1, rate_limit_tpm=60000)
    ok = client.chat.completions.with_raw_response.create(model="c", messages=HI)
    assert ok.headers["anthropic-ratelimit-requests-limit"] == "30"
    assert ok.headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset = datetime.datetime.fromisoformat(ok.headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00"))
    assert reset.tzinfo is not None
    assert "anthropic-ratelimit-tokens-limit" in ok.headers and "x-ratelimit-limit-requests" not in ok.headers
    exc = _error(lambda: client.chat.completions.create(model="c", messages=HI))
    assert exc.status_code == 429 and int(exc.response.headers["retry-after"]) >= 1
    assert "retry-after-ms" not in exc.response.headers


# ---- python -m gradekit.judge.testing --dialect ------------------------------------------------------------------


def test_the_fake_serves_a_dialect_with_a_script_from_the_command_line(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(Reply(content="<answer>Yes</answer>", reasoning="hmm").model_dump_json() + "\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "gradekit.judge.testing", "--dialect", "dashscope-thinking", "--script", str(script)],
                            stdout=subprocess.PIPE, text=True)
    try:
        base_url = proc.stdout.readline().strip()
        client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
        assert _error(lambda: client.chat.completions.create(model="qwen3-32b", messages=HI)).status_code == 400
        chunks = _stream(client)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "<answer>Yes</answer>"
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_the_testing_page_has_a_row_for_every_dialect() -> None:
    page = (Path(__file__).parents[2] / "docs" / "testing.md").read_text(encoding="utf-8")
    for name, dialect in DIALECTS.items():
        assert f"| `{name}` | {dialect.summary.replace('|', '/')} |" in page, f"docs/testing.md is missing {name}"
