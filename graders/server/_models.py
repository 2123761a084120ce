"""What every contract's route shares: the one RewardRequest each body becomes and the RewardResponse the
computer answers, and the helpers more than one route reads (metrics, labels, chat-template end tokens).

Every route turns its body into :class:`RewardRequest` s and asks the configured computer's
``compute_reward``; so a user's BaseRewardComputer (which only defines that method) serves every
platform, and a subclass that post-processes a response changes every route alike. Each contract's own
shapes, both ways, live with its route (``_dashscope``, ``_vertex``, ``_openrlhf``, ``_foundry``, ``_slime``,
``_nemo_gym``). No web stack here: a reward class and the config load without FastAPI.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .._sample import EmptyIfNull, Message
from ..platforms._common import reference_dict


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


# The end-of-turn, end-of-text and padding tokens of the common chat templates. OpenRLHF decodes
# the query with skip_special_tokens=False, so the response ends in them (ChatML/Qwen, Llama 3,
# Mistral/Llama 2, Gemma, Phi-3, DeepSeek, gpt-oss).
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>", "<eos>",
              "<pad>", "<|end|>", "<|return|>", "<｜end▁of▁sentence｜>", "<|EOT|>")


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
    return reference_dict(label, "label")


class ShapeError(ValueError):
    """A part of a request that is not the shape its contract gives; ``loc`` says where (for a 422)."""

    def __init__(self, loc: list[str | int], message: str) -> None:
        super().__init__(message)
        self.loc = loc
