"""The platforms' own libraries, not hand-written stand-ins: OpenAI's grader types (``openai``),
DashScope's reward request/response models (``dashscope``) and Vertex's tuning types
(``google-genai``). They are in the ``test`` extra; outside CI a missing one skips its tests,
in CI (``CI`` set) it fails them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from gradekit.graders import load_grader
from gradekit.graders.platforms import export_openai_grader, export_vertex_spec
from gradekit.judge import Judge, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import reference_judge
from .test_conformance import post

DATA = Path(__file__).parents[1] / "data" / "graders"


def need(module: str) -> Any:
    if os.environ.get("CI"):
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module)


def no_extras(value: Any, where: str = "grader") -> None:
    """The SDKs' models allow unknown fields (``extra="allow"``): a field the SDK does not know
    would pass validation silently, so every model in the tree must have none."""
    if isinstance(value, BaseModel):
        extra = value.__pydantic_extra__ or {}
        assert not extra, f"{where}: fields the SDK does not know: {sorted(extra)}"
        for name in type(value).model_fields:
            no_extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            no_extras(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            no_extras(item, f"{where}.{key}")


async def _no_wait(_: float) -> None:
    return None


def llm_grader(fake: FakeProvider) -> Any:
    def make() -> Judge:
        return Judge("fake-judge", base_url=fake.base_url, api_key="test-key", timeout=30, limiter=Limiter(concurrency=8, sleep=_no_wait),
                     retry=RetryPolicy(max_attempts=2), sleep=_no_wait)

    return load_grader({"type": "llm", "rubric": "semantic_equivalence_en"}, judge=make)


# ---- OpenAI: openai.types.graders -------------------------------------------------------------------

PY = "def grade(sample, item):\n    return 1.0 if sample['output_text'].strip() == item['answer'] else 0.0\n"
OPENAI_EXPORTS = {
    "string_check": ({"type": "string_check", "name": "exact", "input": "{{response}}", "reference": "{{references.answer}}"}, False),
    "python": ({"type": "python", "name": "py", "source": PY, "range": [0, 1]}, False),
    "string_match_rescaled": (DATA / "string_match.yaml", True),
    "score_model_rescaled": ({"type": "autorater", "name": "judge", "prompt": "Rate {{response}} against {{references.answer}} from -1 to 1."}, True),
    "multi": (DATA / "formula.json", False),
    "weighted_rescaled": (DATA / "weighted.yaml", True),
    "text_similarity": ({"type": "text_similarity", "name": "close", "input": "{{response}}", "reference": "{{references.answer}}",
                         "evaluation_metric": "bleu", "pass_threshold": 0.6}, False),
    "label_model": ({"type": "label_model", "name": "tone", "model": "gpt-4o-mini", "labels": ["polite", "rude"], "passing_labels": ["polite"],
                     "input": [{"role": "system", "content": "Label the tone."}, {"role": "user", "content": "{{ sample.output_text }}"}]}, False),
}


@pytest.mark.parametrize("case", list(OPENAI_EXPORTS))
def test_every_openai_export_is_valid_for_the_openai_sdk(case: str) -> None:
    graders = need("openai.types.graders")
    config, rescale = OPENAI_EXPORTS[case]
    exported = export_openai_grader(config, rescale=rescale)
    leaf = TypeAdapter(graders.StringCheckGrader | graders.TextSimilarityGrader | graders.PythonGrader | graders.ScoreModelGrader
                       | graders.LabelModelGrader)
    if exported["type"] != "multi":
        parsed = leaf.validate_python(exported)
        assert parsed.type == exported["type"]
        no_extras(parsed)
        return
    # The SDK types a multi grader's ``graders`` as one grader, while the API takes a map of named
    # graders (the graders guide; calculate_output names the keys). So: the multi grader's own
    # fields with the SDK type (members replaced by one of them), each member with the SDK's leaf
    # types, and the map's shape here: identifier keys, each used by the formula.
    members = exported["graders"]
    assert isinstance(members, dict) and members
    first = next(iter(members.values()))
    no_extras(graders.MultiGrader.model_validate({**exported, "graders": first}))
    for key, member in members.items():
        assert key.isidentifier() and key in exported["calculate_output"], key
        assert member["type"] != "multi", "a multi grader cannot contain another"
        no_extras(leaf.validate_python(member), f"graders.{key}")


def test_no_extras_catches_a_field_the_sdk_does_not_know() -> None:
    graders = need("openai.types.graders")
    parsed = graders.StringCheckGrader.model_validate({"type": "string_check", "name": "x", "input": "a", "reference": "b",
                                                       "operation": "eq", "pass_threshold": 0.5})
    with pytest.raises(AssertionError, match="pass_threshold"):
        no_extras(parsed)


# ---- DashScope: dashscope.finetune.reinforcement's models ------------------------------------------


def test_dashscope_requests_built_with_its_models_and_replies_parsed_with_them(fake: FakeProvider, serve) -> None:
    need("dashscope")
    from dashscope.finetune.reinforcement.component.data.base_data_model import (
        AgentOutput,
        RequestMetadata,
        TaskStatus,
    )
    from dashscope.finetune.reinforcement.component.data.group_reward_input import (
        GroupRewardInput,
    )
    from dashscope.finetune.reinforcement.component.data.group_reward_output import (
        GroupRewardOutput,
    )
    from dashscope.finetune.reinforcement.component.data.reward_input import RewardInput
    from dashscope.finetune.reinforcement.component.data.reward_output import (
        RewardOutput,
    )

    fake.set_responder(lambda body: Reply(status=500) if "BOOM" in json.dumps(body) else reference_judge(body))
    url = serve(llm_grader(fake))
    meta = RequestMetadata(job_id="job-1", sample_id="s-1", rollout_id="r-1", attempt_id="a-1")

    def rollout(answer: str) -> AgentOutput:
        return AgentOutput(messages=[{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": answer}],
                           rollout_extra={"topic": "geo"})

    single = RewardInput(ground_truth="Paris", request_metadata=meta, agent_output=rollout("It is Paris."))
    status, body = post(url, "/api/v1", single.model_dump(mode="json"))
    out = RewardOutput.model_validate(body)
    assert status == 200 and out.status == TaskStatus.SUCCESS and out.reward.reward_score == 1.0

    group = GroupRewardInput(ground_truth="Paris", request_metadata=meta, agent_outputs=[rollout("Paris"), rollout("Lyon"), rollout("Paris!")])
    status, body = post(url, "/api/v1", group.model_dump(mode="json"))
    out_group = GroupRewardOutput.model_validate(body)
    assert status == 200 and out_group.status == TaskStatus.SUCCESS
    assert [r.reward_score for r in out_group.reward.rewards] == [1.0, 0.0, 1.0]

    failing = RewardInput(ground_truth="Paris", agent_output=rollout("BOOM"))
    status, body = post(url, "/api/v1", failing.model_dump(mode="json"))
    out = RewardOutput.model_validate(body)
    assert status == 200 and out.status == TaskStatus.FAILED and "server_error" in out.error


# ---- Vertex: google-genai's types ---------------------------------------------------------------------


@pytest.mark.parametrize("config", [
    pytest.param(DATA / "string_match.yaml", id="string_match"),
    pytest.param(DATA / "autorater_tone.yaml", id="autorater"),
    pytest.param(DATA / "vertex_composite.json", id="composite_spec"),
    pytest.param(DATA / "weighted.yaml", id="weighted"),
    pytest.param({"type": "python", "name": "py", "source": "def evaluate(example, response):\n    return 1.0\n"}, id="code_execution"),
])
def test_exported_reinforcement_tuning_specs_validate_with_google_genai(config: Any) -> None:
    types = need("google.genai.types")
    spec = export_vertex_spec(config)["reinforcementTuningSpec"]
    parsed = types.ReinforcementTuningSpec.model_validate(spec)  # extra="forbid": an unknown field fails here
    assert (parsed.single_reward_config or parsed.composite_reward_config) is not None
    assert parsed.model_dump(mode="json", by_alias=True, exclude_none=True) == spec, "nothing dropped or renamed"


def test_cloud_run_request_built_with_google_genai_types(fake: FakeProvider, serve) -> None:
    types = need("google.genai.types")
    fake.set_responder(reference_judge)
    url = serve(llm_grader(fake))
    example = types.ReinforcementTuningExample(
        system_instruction=types.Content(parts=[types.Part(text="Answer briefly.")]),
        contents=[types.Content(role="user", parts=[types.Part(text="What is the capital of France?")])],
        references={"answer": "Paris"})
    for text, reward in (("Paris.", 1.0), ("London", 0.0)):
        response = types.Content(role="model", parts=[types.Part(text=text)])
        body = {"example": example.model_dump(mode="json", by_alias=True, exclude_none=True),
                "response": response.model_dump(mode="json", by_alias=True, exclude_none=True),
                "metadata": {"step": 1, "tuning_job_id": 123456789}}
        assert "systemInstruction" in body["example"], "camelCase ProtoJSON, as Vertex sends it"
        status, reply = post(url, "/", body)
        assert status == 200 and reply["reward"] == reward
