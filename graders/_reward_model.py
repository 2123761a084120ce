"""``type: reward_model``: a served scalar reward model's score as the reward.

The judge's endpoint is the reward model's server (vLLM or SGLang; judge._reward_model has the
routes and their shapes). The sample is sent as the conversation, prompt then response, so the
server renders it with the reward model's own chat template (vLLM's ``/classify`` and ``/pooling``
take ``messages``); SGLang's routes take text only, so the node's ``chat_template`` (the Jinja
template of the model's ``tokenizer_config.json``) renders it here. ``use_activation: false`` by
default, as verl's reward loop sends it: the raw logit, which the mapping then puts in [-1, 1]:

==========  ========================================================================================
``sigmoid`` ``2 / (1 + exp(-(raw - center) / scale)) - 1`` (``scale`` 1, ``center`` 0): per sample.
``raw``     the raw score clipped to [-1, 1]: per sample (a head already trained to that range).
``minmax``  within the group: the lowest finished member -1, the highest 1, linear between (all equal: 0).
``zscore``  within the group: ``(raw - mean) / (std * scale)`` clipped to [-1, 1] (``scale`` 2: two
            standard deviations reach the ends; all equal: 0).
==========  ========================================================================================

A group mapping needs the group: the node goes under ``type: group`` (``grader: {type:
reward_model, mapping: minmax}``), which maps its finished members together; alone it is refused.
A request that failed (after the judge's retries, breaker and fleet failover) is an ``error``
grade with the judge's error kind: never a 0, never a made-up score. The raw score is kept as
``metrics.raw_score``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Literal

from gradekit.judge import Judge, clamp

from ._sample import Grade, Sample, route_spent

RewardMapping = Literal["sigmoid", "raw", "minmax", "zscore"]
GROUP_MAPPINGS = frozenset({"minmax", "zscore"})
REWARD_ROUTES = ("/classify", "/pooling", "/v1/classify", "/v1/embeddings")
_TEXT_ROUTES = frozenset({"/v1/classify", "/v1/embeddings"})  # SGLang: text in, no chat template applied


def sigmoid_reward(raw: float, scale: float = 1.0, center: float = 0.0) -> float:
    """``2 sigmoid((raw - center) / scale) - 1``: the logit's sign kept, squashed into (-1, 1)."""
    x = (raw - center) / scale
    s = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return 2.0 * s - 1.0


def group_rewards(raws: Sequence[float], mapping: RewardMapping, scale: float | None = None) -> list[float]:
    """``minmax`` or ``zscore`` over one group's raw scores (population std; a flat group is all 0)."""
    if not raws:
        return []
    if mapping == "minmax":
        low, high = min(raws), max(raws)
        return [0.0 if high == low else clamp(2.0 * (r - low) / (high - low) - 1.0) for r in raws]
    if mapping == "zscore":
        mean, std = statistics.fmean(raws), statistics.pstdev(raws)
        return [0.0 if std == 0 else clamp((r - mean) / (std * (scale or 2.0))) for r in raws]
    raise ValueError(f"{mapping!r} is not a group mapping")


def _conversation(sample: Sample) -> list[dict[str, Any]]:
    messages = [m.model_dump(exclude_none=True) for m in sample.messages]
    if sample.response:
        messages += [m.model_dump(exclude_none=True) for m in sample.response]
    else:
        messages.append({"role": "assistant", "content": sample.response_text})
    for m in messages:
        if m.get("content") is None:
            m["content"] = ""
    return messages


def _chat_template(source: str) -> Any:
    """A Hugging Face chat template compiled as transformers compiles it (``apply_chat_template``): a
    sandboxed Jinja environment with ``trim_blocks``, ``lstrip_blocks``, loop controls and the
    ``raise_exception`` and ``strftime_now`` globals, so a template copied from ``tokenizer_config.json``
    renders here as it does for the server."""
    from datetime import datetime  # noqa: PLC0415

    from jinja2.exceptions import TemplateError  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(source)


class RewardModelGrader:
    """A served reward model's score for each sample (see the module docstring)."""

    def __init__(self, judge: Judge, *, route: str = "/classify", mapping: RewardMapping = "sigmoid", scale: float | None = None,
                 center: float = 0.0, use_activation: bool = False, task: str | None = None, chat_template: str | None = None,
                 name: str = "reward_model") -> None:
        if route not in REWARD_ROUTES:
            raise ValueError(f"route must be one of {', '.join(REWARD_ROUTES)}, got {route!r}")
        if mapping not in ("sigmoid", "raw", "minmax", "zscore"):
            raise ValueError(f"mapping must be sigmoid, raw, minmax or zscore, got {mapping!r}")
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be above 0, got {scale}")
        if not isinstance(judge, Judge):  # a reward model's score is one model's: a jury or cascade has no such request
            raise ValueError("a reward model is asked through one judge (its model on its endpoint or fleet), not a jury")
        if route in _TEXT_ROUTES and not chat_template:
            raise ValueError(f"{route} (SGLang) takes text, not messages: give chat_template, the reward model's Jinja chat "
                             "template (its tokenizer_config.json's), so the conversation reaches it as it was trained on")
        if route not in _TEXT_ROUTES and chat_template:
            raise ValueError(f"{route} (vLLM) takes the conversation as messages and applies the model's own chat template; "
                             "chat_template is for SGLang's /v1/embeddings and /v1/classify")
        self.judge, self.route, self.mapping, self.center = judge, route, mapping, center
        self.scale = scale
        self.use_activation, self.task = use_activation, task
        self._template = _chat_template(chat_template) if chat_template else None
        self.__name__ = name

    @property
    def group_mapping(self) -> bool:
        return self.mapping in GROUP_MAPPINGS

    def request(self, sample: Sample) -> dict[str, Any]:
        """The route's body for ``sample`` (``model`` is the judge's, added when it is sent)."""
        conversation = _conversation(sample)
        if self._template is not None:
            return {"input": self._template.render(messages=conversation, add_generation_prompt=False, bos_token="", eos_token="")}
        body: dict[str, Any] = {"messages": conversation, "use_activation": self.use_activation}
        if self.task:
            body["task"] = self.task
        return body

    async def member(self, sample: Sample) -> Grade:
        """The raw score as a grade (its score the raw clipped, provisional until the group maps it)."""
        try:
            request = self.request(sample)
        except Exception as e:  # a chat template that cannot render this conversation
            return Grade.failed("invalid", f"the chat template could not render the conversation: {type(e).__name__}: {e}",
                                error_kind="input")
        scored = await self.judge.reward_score(self.route, request)
        spent = route_spent(scored)
        if scored.status != "ok" or scored.value is None:
            return Grade.failed("error", scored.error or "the reward model gave no score", error_kind=scored.error_kind or "server_error",
                                **spent)
        raw = scored.value
        score = clamp(raw) if self.mapping in ("raw", *GROUP_MAPPINGS) else sigmoid_reward(raw, self.scale or 1.0, self.center)
        return Grade.scored(score, metrics={"raw_score": raw}, **spent)

    async def __call__(self, sample: Sample) -> Grade:
        if self.group_mapping:
            return Grade.failed("invalid", f"mapping {self.mapping} maps a reward model's scores within a group: grade it under "
                                "type: group (grader: {type: reward_model, mapping: " + self.mapping + "})", error_kind="input")
        return await self.member(sample)

    def map_group(self, grades: list[Grade]) -> list[Grade]:
        """The group's finished members mapped together (``minmax``/``zscore``); failed members unchanged."""
        if not self.group_mapping:
            return grades
        finished = [i for i, g in enumerate(grades) if g.ok and "raw_score" in g.metrics]
        mapped = group_rewards([grades[i].metrics["raw_score"] for i in finished], self.mapping, self.scale)  # type: ignore[arg-type]
        out = list(grades)
        for i, score in zip(finished, mapped):
            out[i] = grades[i].model_copy(update={"score": score})
        return out


def reward_model_grader(judge: Any, **kwargs: Any) -> RewardModelGrader:
    """A ``type: reward_model`` grader on ``judge`` (the reward model's endpoint); see :class:`RewardModelGrader`."""
    return RewardModelGrader(judge, **kwargs)
