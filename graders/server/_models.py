"""The wire shapes of the five contracts, and how each request becomes one RewardRequest.

Every route turns its body into :class:`RewardRequest` s and asks the configured computer's
``compute_reward``; so a user's BaseRewardComputer (which only defines that method) serves all
five platforms, and a subclass that post-processes a response changes every route alike.
The reverse direction (RewardResponse -> each platform's reply) lives here too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .._sample import EmptyIfNull, Message
from ..platforms._common import reference_dict

# ---- Bailian seed 001: POST /compute_reward ---------------------------------------------------


class RewardRequest(BaseModel):
    """Bailian's reward request (seed 001): the model's ``response`` and the row's ``extra_params``.

    ``prompt`` (text or messages) and ``messages`` are read when the platform sends them.
    ``response_messages`` and ``metadata`` are gradekit's: the other routes fill them so that
    tool calls and platform ids reach the grader. Unknown fields are kept (``model_extra``).
    """

    model_config = ConfigDict(extra="allow")

    response: str
    extra_params: EmptyIfNull = Field(default_factory=dict)
    prompt: str | list[Message] | None = None
    messages: list[Message] | None = None
    response_messages: list[Message] | None = None
    metadata: dict[str, Any] | None = None


class RewardResponse(BaseModel):
    """Bailian's reward response: ``status`` is the failure channel, ``score`` only counts on success.

    The seed's own example answers a failure with ``score=0.0``; the field is a number in that
    contract, so a failed response carries 0.0 as a placeholder, never as a reward.
    """

    score: float = 0.0
    status: Literal["success", "fail"] = "success"
    detail: str | None = None
    extra_info: dict[str, Any] = Field(default_factory=dict)


def reward_metrics(extra_info: Mapping[str, Any]) -> dict[str, float]:
    """The numbers in ``extra_info`` as flat metrics: top-level numbers and ``metrics`` keep
    their names, ``parts`` (a composite's part scores) become ``part.<name>``."""
    out: dict[str, float] = {}

    def add(key: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)

    for key, value in extra_info.items():
        if key == "metrics" and isinstance(value, Mapping):
            for k, v in value.items():
                add(str(k), v)
        elif key == "parts" and isinstance(value, Mapping):
            for k, v in value.items():
                add(f"part.{k}", v)
        else:
            add(str(key), value)
    return out


# ---- DashScope reward processor (2b): POST /api/v1 ---------------------------------------------


class AgentOutput(BaseModel):
    """One rollout: the full conversation (its last assistant message is the answer) and extras."""

    model_config = ConfigDict(extra="allow")

    messages: list[Message] | None = None
    rollout_extra: dict[str, Any] | None = None
    rollout_metrics: dict[str, float] | None = None
    reward_score: float | None = None


class DashScopeRewardInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    func_type: Literal["reward"] = "reward"
    ground_truth: Any = None
    request_metadata: dict[str, Any] | None = None
    agent_output: AgentOutput


class DashScopeGroupRewardInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    func_type: Literal["group_reward"] = "group_reward"
    ground_truth: Any = None
    request_metadata: dict[str, Any] | None = None
    agent_outputs: list[AgentOutput]


def _merge_gold(references: dict[str, Any], value: Any, key: str) -> None:
    """A dict of gold fields merges into references; anything else goes under ``key`` and ``answer``."""
    references.update(reference_dict(value, key))


def dashscope_request(output: AgentOutput, ground_truth: Any, request_metadata: Mapping[str, Any] | None) -> RewardRequest:
    """The last assistant message is the response, the messages before it the prompt; messages
    after it (none in a finished rollout) are not graded. ``rollout_extra`` and ``ground_truth``
    become references (the ground truth wins a clash); ``reward_score`` and metrics, metadata."""
    messages = list(output.messages or [])
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    prompt, answer = (messages, None) if last is None else (messages[:last], messages[last])
    references: dict[str, Any] = dict(output.rollout_extra or {})
    _merge_gold(references, ground_truth, "ground_truth")
    metadata: dict[str, Any] = {"reward_score": output.reward_score, "rollout_metrics": dict(output.rollout_metrics or {})}
    if request_metadata:
        metadata["request_metadata"] = dict(request_metadata)
    return RewardRequest(messages=prompt, response=answer.text if answer is not None else "",
                         response_messages=[answer] if answer is not None else None, extra_params=references, metadata=metadata)


def dashscope_reward(response: RewardResponse) -> dict[str, Any]:
    """RewardOutput: success -> the score and metrics; fail -> ``failed`` with the error.

    DashScope's ``Reward.reward_score`` is a required number, so a failed output carries 0.0 there;
    the platform reads ``status`` first (a failed output is retried or dropped, never trained on).
    """
    if response.status == "success":
        metrics = reward_metrics(response.extra_info)
        return {"reward": {"reward_score": response.score, "reward_metrics": metrics or None}, "status": "success", "error": None}
    return {"reward": {"reward_score": 0.0, "reward_metrics": None}, "status": "failed", "error": response.detail or "reward failed"}


def dashscope_group_reward(responses: Sequence[RewardResponse]) -> dict[str, Any]:
    """GroupRewardOutput: one reward per agent output, in order, or ``failed`` with no rewards at all
    (a partial list would be misaligned with agent_outputs, and zeros would be made-up rewards)."""
    failed = [(i, r) for i, r in enumerate(responses) if r.status != "success"]
    if failed:
        error = "; ".join(f"agent_outputs[{i}]: {r.detail or 'reward failed'}" for i, r in failed)
        return {"reward": {"rewards": []}, "status": "failed", "error": error}
    rewards = [dashscope_reward(r)["reward"] for r in responses]
    return {"reward": {"rewards": rewards}, "status": "success", "error": None}


# ---- Vertex Cloud Run: POST / ------------------------------------------------------------------


class VertexExample(BaseModel):
    """A ReinforcementTuningExample (camelCase ProtoJSON); only its shape is checked here."""

    model_config = ConfigDict(extra="allow")

    contents: list[dict[str, Any]] = Field(default_factory=list)
    systemInstruction: dict[str, Any] | None = None
    references: dict[str, Any] = Field(default_factory=dict)


class VertexContent(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str | None = None
    parts: list[dict[str, Any]]


class VertexRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    example: VertexExample
    response: VertexContent
    metadata: dict[str, Any] = Field(default_factory=dict)


def vertex_reply(response: RewardResponse) -> dict[str, Any]:
    """``{reward, user_requested_aux_info}``; the reward clipped to [-1, 1] as Vertex does."""
    reply: dict[str, Any] = {"reward": min(1.0, max(-1.0, response.score))}
    if response.extra_info:
        reply["user_requested_aux_info"] = json.dumps(response.extra_info, ensure_ascii=False, default=str)
    return reply


# ---- OpenRLHF remote reward model: POST /get_reward ---------------------------------------------


class OpenRLHFRequest(BaseModel):
    """``query`` is prompt + response with the chat template applied; ``prompts`` and ``labels``
    are absent from older clients."""

    model_config = ConfigDict(extra="allow")

    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


# The end-of-turn, end-of-text and padding tokens of the common chat templates. OpenRLHF decodes
# the query with skip_special_tokens=False, so the response ends in them (ChatML/Qwen, Llama 3,
# Mistral/Llama 2, Gemma, Phi-3, DeepSeek, gpt-oss).
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>", "<eos>",
              "<pad>", "<|end|>", "<|return|>", "<｜end▁of▁sentence｜>", "<|EOT|>")


def split_query(query: str, prompt: str | None, end_tokens: Sequence[str] = END_TOKENS) -> str | None:
    """The response: the query minus its prompt prefix (or what follows the prompt's first
    occurrence, when the decode added a leading token), minus trailing ``end_tokens`` and the
    whitespace between them; None when the prompt is not in it."""
    if prompt:
        if query.startswith(prompt):
            query = query[len(prompt):]
        else:
            at = query.find(prompt)
            if at < 0:
                return None
            query = query[at + len(prompt):]
    return strip_end_tokens(query, end_tokens)


def strip_end_tokens(text: str, end_tokens: Sequence[str] = END_TOKENS) -> str:
    """``text`` without the special tokens it ends in (however many, and the whitespace around
    them); a text that ends in none is returned unchanged."""
    tokens = [t for t in end_tokens if t]
    stripped = False
    while True:
        trimmed = text.rstrip()
        token = next((t for t in tokens if trimmed.endswith(t)), None)
        if token is None:
            return trimmed if stripped else text
        text, stripped = trimmed[: -len(token)], True


# Chat templates whose turns can be read back: ChatML (Qwen, many others) and Llama 3.
_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\s*|(?=<\|im_start\|>)|\Z)", re.DOTALL)
_LLAMA3 = re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|\Z)", re.DOTALL)


def untemplate(prompt: str) -> list[Message] | str:
    """A templated prompt as chat messages when its template is ChatML or Llama 3 (the empty
    assistant turn the template opens for generation dropped), else the text unchanged, so
    ``{{question}}`` is the user's question rather than the template's markup."""
    for pattern in (_CHATML, _LLAMA3):
        turns = [(role, content.strip()) for role, content in pattern.findall(prompt)]
        if turns:
            if turns[-1][0] == "assistant" and not turns[-1][1]:
                turns.pop()
            if turns and all(role in ("system", "user", "assistant", "tool", "developer") for role, _ in turns):
                return [Message(role=role, content=content) for role, content in turns]
    return prompt


def label_references(label: Any) -> dict[str, Any]:
    """A label that is a JSON object (or a dict) merges into references; anything else is
    ``label`` and ``answer`` (OpenRLHF's usual ``--label_key answer``)."""
    if isinstance(label, str) and label.lstrip().startswith("{"):
        try:
            parsed = json.loads(label)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    references: dict[str, Any] = {}
    _merge_gold(references, label, "label")
    return references


def openrlhf_reply(responses: Sequence[RewardResponse]) -> dict[str, Any]:
    """``rewards`` as scored; ``scores`` the rewards clamped to [0, 1] for dynamic filtering (a
    wrong answer is 0 whether the grader says 0 or -1); ``extra_logs`` the metrics every item has."""
    rewards = [r.score for r in responses]
    metrics = [reward_metrics(r.extra_info) for r in responses]
    shared = [k for k in metrics[0] if all(k in m for m in metrics[1:])] if metrics else []
    return {"rewards": rewards, "scores": [min(1.0, max(0.0, r)) for r in rewards],
            "extra_logs": {k: [m[k] for m in metrics] for k in shared}}


# ---- Microsoft Foundry endpoint grader: POST /grade ----------------------------------------------


class FoundryGradeRequest(BaseModel):
    """Foundry's endpoint grader request: ``sample`` (the model's output: ``output_text``,
    ``output_json``, ``choices``), ``item`` (the whole dataset example, its ``messages`` too) and
    ``trace_id`` (``trace_`` + a UUID, the same for one rollout)."""

    model_config = ConfigDict(extra="allow")

    sample: dict[str, Any]
    item: EmptyIfNull = Field(default_factory=dict)
    trace_id: str | None = None


class ShapeError(ValueError):
    """A part of a request that is not the shape its contract gives; ``loc`` says where (for a 422)."""

    def __init__(self, loc: list[str | int], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _messages_at(value: Any, loc: list[str | int]) -> list[Message]:
    try:
        return TypeAdapter(list[Message]).validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        raise ShapeError([*loc, *err["loc"]], err["msg"]) from None


def foundry_request(body: FoundryGradeRequest) -> RewardRequest:
    """The sample's text is the response (``output_text``, else the last choice's message, else
    ``output_json`` as JSON); the item's ``messages`` are the prompt and its other keys the
    references (``{{item.x}}``); the whole ``sample`` stays in metadata for ``{{sample.output_json.x}}``."""
    sample = body.sample
    text = sample.get("output_text")
    response_messages = None
    if not isinstance(text, str):
        choices = sample.get("choices")
        message = choices[-1].get("message") if isinstance(choices, list) and choices and isinstance(choices[-1], Mapping) else None
        if isinstance(message, Mapping):
            response_messages = _messages_at([{"role": "assistant", **message}], ["sample", "choices", len(choices) - 1, "message"])
            text = response_messages[0].text
        elif sample.get("output_json") is not None:
            text = json.dumps(sample["output_json"], ensure_ascii=False)
        else:
            text = ""
    item = dict(body.item)
    messages = item.pop("messages", None)
    return RewardRequest(response=text, response_messages=response_messages, extra_params=item,
                         messages=_messages_at(messages, ["item", "messages"]) if isinstance(messages, list) else None,
                         metadata={"sample": sample, **({"trace_id": body.trace_id} if body.trace_id else {})})


def foundry_reply(response: RewardResponse) -> dict[str, Any]:
    """``{"score"}``; a checklist grader's criteria also as ``metrics`` (``part.criteria.<id>``, and how many were
    read: ``criteria_read`` of ``criteria_total``), which the exported Bedrock Lambda reports in its ``metrics_list``."""
    reply: dict[str, Any] = {"score": response.score}
    criteria = {k: v for k, v in reward_metrics(response.extra_info).items()
                if k.startswith("part.criteria.") or k in ("criteria_read", "criteria_total")}
    if criteria:
        reply["metrics"] = criteria
    return reply
