"""Microsoft Foundry and AWS Bedrock, the platforms OpenAI's grader format moved to.

Foundry: `gradekit export --to foundry` checked against the grader shapes Foundry documents (written
out here, independently of the exporter, plus the openai SDK's own types), and the endpoint grader
called as Foundry calls it: POST {sample, item, trace_id} to `gradekit serve`'s /grade, {"score"} back.
Bedrock: the exported lambda_function.py imported in a fresh interpreter and called as Lambda calls it,
with the batch AWS's docs show, against gradekit's own grades of the same samples.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradekit.graders import ExportError, RewardServer, Sample, SyncGrader, create_app, export_bedrock_lambda, export_foundry_grader, load_grader
from gradekit.graders.cli import app
from gradekit.judge import Judge, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from ..graders.test_evals_api import EVAL

runner = CliRunner()

# ---- Foundry's documented shapes ---------------------------------------------------------------

# The endpoint grader as github.com/microsoft-foundry/fine-tuning Demos/Agentic_RFT_ToolCall_EndpointGrader/README.md gives it.
ENDPOINT_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["type", "url"],
                   "properties": {"type": {"const": "endpoint"}, "name": {"type": "string"}, "url": {"type": "string", "pattern": "^https?://"},
                                  "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                                  "rate_limit": {"type": "integer", "minimum": 1}, "pass_threshold": {"type": "number"}}}


def check(value: Any, schema: dict) -> None:
    """A small JSON-schema check (type, const, enum, required, properties, additionalProperties, pattern)."""
    import re

    kinds = {"object": dict, "string": str, "integer": int, "number": (int, float), "array": list}
    if "const" in schema:
        assert value == schema["const"], (value, schema)
    if "type" in schema:
        assert isinstance(value, kinds[schema["type"]]) and not isinstance(value, bool), (value, schema["type"])
    if "pattern" in schema:
        assert re.search(schema["pattern"], value), value
    if "minimum" in schema:
        assert value >= schema["minimum"]
    if isinstance(value, dict):
        assert set(schema.get("required", ())) <= set(value), (sorted(value), schema.get("required"))
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                check(item, properties[key])
            elif schema.get("additionalProperties") is False:
                raise AssertionError(f"{key!r} is not in the documented shape")
            elif isinstance(schema.get("additionalProperties"), dict):
                check(item, schema["additionalProperties"])


def sdk_check(grader: dict) -> None:
    """Foundry's native graders are OpenAI's: the SDK's own param types take them."""
    from openai.types import graders as g
    from pydantic import TypeAdapter

    kinds = {"string_check": g.StringCheckGraderParam, "text_similarity": g.TextSimilarityGraderParam, "python": g.PythonGraderParam,
             "score_model": g.ScoreModelGraderParam, "label_model": g.LabelModelGraderParam}
    if grader["type"] == "multi":  # the SDK types `graders` as one grader; the API takes a map of them (tests/platforms/test_platform_sdks.py)
        assert set(grader) == {"type", "name", "graders", "calculate_output"}
        for member in grader["graders"].values():
            sdk_check(member)
        return
    TypeAdapter(kinds[grader["type"]]).validate_python(grader)


SCORE_MODEL = {"type": "score_model", "name": "rating", "model": "gpt-4.1", "range": [1, 7], "pass_threshold": 5,
               "sampling_params": {"temperature": 0, "seed": 3},
               "input": [{"role": "system", "content": "Rate 1 to 7."},
                         {"role": "user", "content": [{"type": "input_text", "text": "Answer: {{response}} (gold {{references.answer}})"},
                                                      {"type": "input_image", "image_url": "{{ item.image }}"}]}]}
RUBRIC = {"type": "llm", "rubric": "semantic_equivalence_en", "name": "same"}


def test_foundry_native_graders_match_the_documented_schema() -> None:
    native = export_foundry_grader(SCORE_MODEL)
    sdk_check(native)
    assert native["input"][1]["content"] == [{"type": "input_text", "text": "Answer: {{ sample.output_text }} (gold {{ item.answer }})"},
                                             {"type": "input_image", "image_url": "{{ item.image }}"}]
    assert native["range"] == [1.0, 7.0] and native["sampling_params"] == {"temperature": 0, "seed": 3}
    multi = export_foundry_grader({"type": "formula", "formula": "0.5 * a + 0.5 * b", "graders": {
        "a": {"type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}", "operation": "ilike"},
        "b": {"type": "text_similarity", "input": "{{response}}", "reference": "{{references.answer}}", "evaluation_metric": "rouge_l"}}})
    sdk_check(multi)
    assert multi["type"] == "multi" and {g["type"] for g in multi["graders"].values()} == {"string_check", "text_similarity"}
    close = export_foundry_grader({"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}", "reference": "{{ item.a }}",
                                   "evaluation_metric": "fuzzy_match", "pass_threshold": 0.8})
    assert close["pass_threshold"] == 0.8  # Foundry's graders page lists it for text_similarity


def test_foundry_endpoint_grader_where_there_is_no_native_form(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="`endpoint`"):  # the argument; `gradekit export` says --endpoint-url
        export_foundry_grader(RUBRIC)
    grader = export_foundry_grader(RUBRIC, endpoint="https://rewards.example.com", headers={"Authorization": "Bearer ${KEY}"},
                                   rate_limit=50, pass_threshold=0.5)
    check(grader, ENDPOINT_SCHEMA)
    assert grader == {"type": "endpoint", "name": "same", "url": "https://rewards.example.com/grade",
                      "headers": {"Authorization": "Bearer ${KEY}"}, "rate_limit": 50, "pass_threshold": 0.5}
    # The CLI: refused with the reason and the fix (exit 2), then written with --endpoint-url.
    config = tmp_path / "grader.json"
    config.write_text(json.dumps(RUBRIC))
    refused = runner.invoke(app, ["export", str(config), "--to", "foundry"])
    assert refused.exit_code == 2 and "error:" in refused.output and "--endpoint-url" in refused.output
    done = runner.invoke(app, ["export", str(config), "--to", "foundry", "--endpoint-url", "https://h.example/rft/grade",
                               "--endpoint-header", "X-Key: ${KEY}", "--rate-limit", "20"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"type": "endpoint", "name": "same", "url": "https://h.example/rft/grade",
                                       "headers": {"X-Key": "${KEY}"}, "rate_limit": 20}
    forced = runner.invoke(app, ["export", str(config), "--to", "foundry", "--endpoint"])
    assert forced.exit_code == 2 and "--endpoint needs --endpoint-url" in forced.output


def test_foundry_export_of_an_eval_definition_keeps_its_criteria(tmp_path: Path) -> None:
    criteria = [*EVAL["testing_criteria"], {**SCORE_MODEL, "input": [{"role": "user", "content": "Rate {{ sample.output_text }}"}]}]
    out = export_foundry_grader({**EVAL, "testing_criteria": criteria})
    assert out["testing_criteria"] == criteria and out["data_source_config"] == EVAL["data_source_config"]
    broken = {**EVAL, "testing_criteria": [{**EVAL["testing_criteria"][0], "operation": "contains"}]}
    with pytest.raises(ExportError, match="operation"):
        export_foundry_grader(broken)


def post(url: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def rating_reply(body: dict) -> Reply:
    text = body["messages"][-1]["content"]
    text = text if isinstance(text, str) else "".join(p.get("text", "") for p in text)
    return Reply(content=json.dumps({"steps": [], "result": 6 if "Paris" in text.split("(gold")[0] else 2}))


def test_the_endpoint_grader_calls_gradekit_serve_as_foundry_does() -> None:
    """A score_model grader behind POST /grade: Foundry's request in, {"score"} out; a judge error is a 502, never a score."""
    with FakeProvider(responder=rating_reply) as fake:
        def make() -> Judge:
            return Judge("fake", base_url=fake.base_url, api_key="k", cache=None, retry=RetryPolicy(max_attempts=1))

        grader = load_grader({**SCORE_MODEL, "input": [SCORE_MODEL["input"][0], {"role": "user", "content": [
            {"type": "input_text", "text": "Answer: {{ sample.output_text }} (gold {{ item.answer }}) {{ item.n }}"},
            {"type": "input_image", "image_url": "{{ item.image }}"}]}]}, judge=make)
        server = RewardServer(create_app(grader), port=0, log_level="warning").start()
        try:
            image = "data:image/png;base64,iVBORw0KGgo="
            item = {"messages": [{"role": "user", "content": "Capital of France?"}], "answer": "Paris", "n": 1, "image": image}
            status, body = post(server.url + "/grade", {"sample": {"output_text": "Paris"}, "item": item, "trace_id": "trace_1a2b3c"})
            assert (status, body) == (200, {"score": (6 - 1) / 6})
            sent = fake.chat_requests()[-1].body["messages"][-1]["content"]
            assert sent[1] == {"type": "image_url", "image_url": {"url": image}}  # the item's image reaches the judge as a part
            # The answer in choices (a chat completions style output), as the README says `sample` may be.
            status, body = post(server.url + "/grade", {"sample": {"choices": [{"message": {"role": "assistant", "content": "Lyon"}}]},
                                                        "item": item, "trace_id": "trace_2"})
            assert (status, body) == (200, {"score": (2 - 1) / 6})
            status, body = post(server.url + "/grade", {"item": item})
            assert status == 422 and body["detail"][0]["loc"] == ["body", "sample"]
            status, body = post(server.url + "/grade", {"sample": {"output_text": "Paris"}, "item": {**item, "messages": [{"content": "q"}]}})
            assert status == 422 and body["detail"][0]["loc"] == ["body", "item", "messages", 0, "role"]
            status, body = post(server.url + "/grade", {"sample": {"output_text": "Paris"}, "item": {"answer": "Paris", "image": image}})
            assert status == 422 and "item.n" in body["detail"][0]["msg"] and body["detail"][0]["loc"] == ["body", "sample"]
            fake.stop()  # the judge is gone: Foundry gets a non-2xx (it retries up to 3 times), never a score
            status, body = post(server.url + "/grade", {"sample": {"output_text": "Paris"}, "item": item})
            assert status == 502 and "score" not in body
        finally:
            server.stop()


# ---- Bedrock / SageMaker reward Lambda -----------------------------------------------------------

PYTHON = "def grade(sample, item):\n    return 1.0 if len(sample['output_text']) <= int(item['max_len']) else 0.0\n"
COMPOSITE = {"type": "weighted", "name": "capital", "parts": {
    "exact": {"weight": 3, "type": "normalized_match", "expression": "{{references.answer}}", "correct": 1, "wrong": 0},
    "short": {"weight": 1, "type": "python", "source": PYTHON, "range": [0, 1]}}}


def batch() -> list[dict]:
    """Both documented layouts: dataset fields under metadata (the open-weight page) and at the top level (Nova's)."""
    answers = ["Paris", "paris.", "The capital is Paris, of course, as everyone knows", "Lyon", "  PARIS  "]
    records = []
    for n, answer in enumerate(answers):
        messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Capital of France?"},
                    {"role": "assistant", "content": answer}]
        fields = {"reference_answer": {"answer": "Paris"}, "max_len": 12}
        records.append({"id": f"s-{n}", "messages": messages, **({"metadata": fields} if n % 2 == 0 else fields)})
    return records


def lambda_call(tmp_path: Path, source: str, event: Any) -> subprocess.CompletedProcess[str]:
    """Import lambda_function.py in a fresh interpreter (no site-packages, no gradekit) and call it as Lambda does."""
    (tmp_path / "lambda_function.py").write_text(source, encoding="utf-8")
    (tmp_path / "event.json").write_text(json.dumps(event), encoding="utf-8")
    driver = ("import json, sys\nsys.path.insert(0, sys.argv[1])\nimport lambda_function\n"
              "event = json.load(open(sys.argv[2]))\nprint(json.dumps(lambda_function.lambda_handler(event, None)))\n")
    return subprocess.run([sys.executable, "-I", "-S", "-c", driver, str(tmp_path), str(tmp_path / "event.json")],
                          capture_output=True, text=True, timeout=120)


def test_bedrock_lambda_returns_the_documented_records_equal_to_gradekit(tmp_path: Path) -> None:
    config = tmp_path / "grader.json"
    config.write_text(json.dumps(COMPOSITE))
    done = runner.invoke(app, ["export", str(config), "--to", "bedrock-lambda", "-o", str(tmp_path / "lambda_function.py")])
    assert done.exit_code == 0, done.output
    source = (tmp_path / "lambda_function.py").read_text(encoding="utf-8")
    ran = lambda_call(tmp_path, source, batch())
    assert ran.returncode == 0, ran.stderr
    records = json.loads(ran.stdout)
    grader = SyncGrader(load_grader(COMPOSITE))
    expected = []
    for record in batch():
        fields = record.get("metadata") or {k: v for k, v in record.items() if k not in ("id", "messages")}
        sample = Sample(messages=record["messages"][:-1], response=record["messages"][-1]["content"],
                        references={**fields, **fields["reference_answer"]})
        expected.append(grader(sample).score)
    assert [r["id"] for r in records] == [f"s-{n}" for n in range(5)]
    assert [r["aggregate_reward_score"] for r in records] == pytest.approx(expected, abs=1e-12)
    assert 0 < sum(expected) < len(expected)
    assert all(r["metrics_list"] == [{"name": "capital", "value": r["aggregate_reward_score"], "type": "Reward"}] for r in records)


def test_bedrock_lambda_names_an_ungradable_sample_and_refuses_a_judge(tmp_path: Path) -> None:
    source = export_bedrock_lambda({"type": "string_match", "expression": "{{references.answer}}"})
    no_answer = [{"id": "a", "messages": [{"role": "user", "content": "q"}], "metadata": {"reference_answer": {"answer": "x"}}}]
    ran = lambda_call(tmp_path, source, no_answer)
    assert ran.returncode != 0 and "sample 0 (id 'a')" in ran.stderr and "assistant" in ran.stderr
    scored = lambda_call(tmp_path, export_bedrock_lambda({"type": "string_match", "expression": "{{references.answer}}"}, on_invalid=0.0,
                                                         rescale=True), no_answer + [{**no_answer[0], "id": "b", "messages": [
                                                             {"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]}])
    assert scored.returncode == 0, scored.stderr
    assert [r["aggregate_reward_score"] for r in json.loads(scored.stdout)] == [0.5, 1.0]  # (0 + 1) / 2 and (1 + 1) / 2
    with pytest.raises(ExportError, match="gradekit serve"):
        export_bedrock_lambda(RUBRIC)


# ---- Vertex and Bailian samples with images --------------------------------------------------------


def test_vertex_and_bailian_prompt_images_reach_the_judge_as_content_parts() -> None:
    """Vertex's Content carries images as inlineData/fileData parts, Bailian/DashScope messages as content
    parts ({"image": url} or image_url): an LLM grader on those routes sends each to the judge as an image_url part."""
    png = "iVBORw0KGgoAAAANSUhEUg=="
    with FakeProvider(responder=lambda body: Reply(content=json.dumps({"rationale": "ok", "judgement": "correct"}))) as fake:
        def make() -> Judge:
            return Judge("fake", base_url=fake.base_url, api_key="k", cache=None, retry=RetryPolicy(max_attempts=1))

        server = RewardServer(create_app(load_grader(RUBRIC, judge=make)), port=0, log_level="warning").start()
        try:
            vertex = {"example": {"contents": [{"role": "user", "parts": [
                {"text": "Which city is this?"}, {"inlineData": {"mimeType": "image/png", "data": png}},
                {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/paris.jpg"}}]}], "references": {"answer": "Paris"}},
                "response": {"role": "model", "parts": [{"text": "Paris"}]}, "metadata": {"step": 1}}
            status, body = post(server.url + "/", vertex)
            assert (status, body) == (200, {"reward": 1.0, "user_requested_aux_info": body["user_requested_aux_info"]})
            sent = fake.chat_requests()[-1].body["messages"][-1]["content"]
            assert "Which city is this?" in sent[0]["text"]
            assert sent[1:] == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                                {"type": "image_url", "image_url": {"url": "https://example.com/paris.jpg"}}]
            bailian = {"messages": [{"role": "user", "content": [{"text": "Which city?"}, {"image": "https://example.com/a.png"}]}],
                       "response": "Paris", "extra_params": {"answer": "Paris"}}
            status, body = post(server.url + "/compute_reward", bailian)
            assert status == 200 and body["status"] == "success", body
            assert fake.chat_requests()[-1].body["messages"][-1]["content"][1:] == [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
            dashscope = {"func_type": "reward", "ground_truth": {"answer": "Paris"}, "agent_output": {"messages": [
                {"role": "user", "content": [{"type": "text", "text": "Which city?"},
                                             {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}}]},
                {"role": "assistant", "content": "Paris"}]}}
            status, body = post(server.url + "/api/v1", dashscope)
            assert status == 200 and body["status"] == "success", body
            assert fake.chat_requests()[-1].body["messages"][-1]["content"][1:] == [
                {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}}]
            # A gs:// file a chat judge cannot fetch is the sample's named input error, never an image silently dropped.
            vertex["example"]["contents"][0]["parts"][2]["fileData"]["fileUri"] = "gs://bucket/paris.jpg"
            before = len(fake.chat_requests())
            status, body = post(server.url + "/", vertex)
            assert status == 422 and "gs://bucket/paris.jpg" in body["detail"][0]["msg"] and len(fake.chat_requests()) == before
        finally:
            server.stop()


def test_bedrock_lambda_forwards_an_llm_grader_to_gradekit_serve(tmp_path: Path) -> None:
    """--endpoint-url: the Lambda sends each sample to POST /grade, where the judge grades it; a judge error fails the invocation."""
    def reply(body: dict) -> Reply:
        user = body["messages"][-1]["content"]
        prediction = user.split("<prediction>")[1].split("</prediction>")[0]
        return Reply(content=json.dumps({"rationale": "r", "judgement": "correct" if "Paris" in prediction else "incorrect"}))

    with FakeProvider(responder=reply) as fake:
        def make() -> Judge:
            return Judge("fake", base_url=fake.base_url, api_key="k", cache=None, retry=RetryPolicy(max_attempts=1))

        server = RewardServer(create_app(load_grader(RUBRIC, judge=make)), port=0, log_level="warning").start()
        try:
            config = tmp_path / "grader.json"
            config.write_text(json.dumps(RUBRIC))
            refused = runner.invoke(app, ["export", str(config), "--to", "bedrock-lambda"])
            assert refused.exit_code == 2 and "--endpoint-url" in refused.output
            done = runner.invoke(app, ["export", str(config), "--to", "bedrock-lambda", "--endpoint-url", server.url,
                                       "--endpoint-header", "X-Trace: lambda"])
            assert done.exit_code == 0, done.output
            ran = lambda_call(tmp_path, done.stdout, batch())
            assert ran.returncode == 0, ran.stderr
            records = json.loads(ran.stdout)
            answers = [r["messages"][-1]["content"] for r in batch()]
            assert [r["id"] for r in records] == [f"s-{n}" for n in range(5)]
            assert [r["aggregate_reward_score"] for r in records] == [1.0 if "Paris" in a else 0.0 for a in answers]
            prompts = [r.body["messages"][-1]["content"] for r in fake.chat_requests()]
            assert len(prompts) == 5 and all("Capital of France?" in p and "- Paris" in p for p in prompts)
            fake.stop()
            failed = lambda_call(tmp_path, done.stdout, batch()[:2])
            assert failed.returncode != 0 and "HTTP 502" in failed.stderr and "sample 0 (id 's-0')" in failed.stderr
        finally:
            server.stop()


def test_a_lone_surrogate_in_a_body_is_a_400_not_a_500() -> None:
    """"\\ud800" is valid JSON but no text: every route refuses it as a bad body (a 500 is retried by Foundry, then the
    rollout discarded); a surrogate pair, one character, is graded."""
    grader = load_grader({"type": "string_check", "name": "same", "input": "{{ sample.output_text }}",
                          "reference": "{{ item.answer }}", "operation": "eq"})
    server = RewardServer(create_app(grader), port=0, log_level="warning").start()
    try:
        def raw(body: bytes) -> tuple[int, Any]:
            request = urllib.request.Request(server.url + "/grade", data=body, method="POST", headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, body = raw(b'{"sample": {"output_text": "\\ud800 Paris"}, "item": {"answer": "Paris"}}')
        assert status == 400 and "lone surrogate" in body["detail"]
        assert raw(b'{"sample": {"output_text": "\\ud83d\\ude00"}, "item": {"answer": "\\ud83d\\ude00"}}') == (200, {"score": 1.0})
    finally:
        server.stop()
