"""Provider dialects: how each OpenAI-compatible judge endpoint differs from OpenAI's chat model.

A :class:`Dialect` is data the fake provider consults at four points: which request bodies it
refuses (and with what error body), where the model's thinking goes on the wire (a message
field, ``<think>`` tags in the content, or nowhere), which rate-limit headers it sends, and what
its 429 looks like. ``DIALECTS`` is the public table (name -> Dialect) that docs and test
matrices iterate; each entry names its sources. Where a source documents a behaviour but not the
exact wording of an error, the wording is the one quoted in the linked issue; the fake's own
simplifications are said in ``summary``.

To vary a dialect (an older vLLM's ``reasoning_content`` field, a chat template that puts
``<think>`` in the prompt), pass ``dataclasses.replace(DIALECTS[name], ...)`` as ``dialect=``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

Thinking = Literal["none", "field", "tags", "hidden"]
RateHeaders = Literal["openai", "anthropic", "none"]
ErrorShape = Literal["openai", "dashscope", "ark", "gemini"]


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A 400 (or other) a dialect answers a request body with, before any model runs."""

    message: str
    param: str | None = None
    code: str | None = None
    status: int = 400


def _never(body: Mapping[str, Any]) -> Refusal | None:
    return None


def _always(body: Mapping[str, Any]) -> bool:
    return True


def _not_thinking(body: Mapping[str, Any]) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What one provider/model accepts and returns, as the fake provider plays it.

    Attributes:
        name: the ``--dialect`` name.
        summary: what it differs in from OpenAI's chat models (one line, for docs tables).
        sources: the provider's docs or linked issues the behaviour is taken from.
        thinking: where a thinking model's reasoning goes: ``field`` (``message.<reasoning_field>``
            and ``delta.<reasoning_field>`` when streamed), ``tags`` (``<think>...</think>`` at the
            start of the content), ``hidden`` (not returned, only counted in usage), ``none``.
        reasoning_field: the message/delta field for ``thinking="field"``.
        think_open_in_prompt: for ``tags``: the chat template already ends the prompt with
            ``<think>``, so the reply holds only the closing ``</think>`` (DeepSeek-R1, QwQ).
        thinks: whether this request body gets a thinking model (e.g. DashScope's
            ``enable_thinking``, Ark's ``thinking.type``).
        refuse: the error for a body the provider refuses, checked in a fixed order (one per request).
        ignores: body keys the provider accepts and silently ignores (the reply is as if absent).
        fence_json: a ``response_format`` is ignored, and the model, following the prompt, answers
            its JSON in a markdown code fence, as chat models do when nothing constrains them.
        reasoning_usage: usage carries ``completion_tokens_details.reasoning_tokens`` and
            ``prompt_tokens_details.cached_tokens``.
        rate_headers: which rate-limit headers replies carry when the fake is rate limited.
        error_shape: the error body: OpenAI's object, DashScope's (with ``request_id``), Ark's
            (``type: BadRequest``), or Gemini's JSON array.
        context_window: the model's window in tokens: a longer prompt is refused with ``overflow``'s wording
            (OpenAI's by default), the completion's cap counted where the wording says so.
        chars_per_token: how the fake counts a prompt's tokens (its text's characters per token), for the
            window and for usage; below 4 it counts more than gradekit's estimate does.
    """

    name: str
    summary: str
    sources: tuple[str, ...]
    thinking: Thinking = "none"
    reasoning_field: str = "reasoning_content"
    think_open_in_prompt: bool = False
    thinks: Callable[[Mapping[str, Any]], bool] = _not_thinking
    refuse: Callable[[Mapping[str, Any]], Refusal | None] = _never
    ignores: frozenset[str] = frozenset()
    fence_json: bool = False
    reasoning_usage: bool = False
    rate_headers: RateHeaders = "openai"
    error_shape: ErrorShape = "openai"
    context_window: int | None = None
    overflow: Callable[[int, int, int], Refusal] | None = None
    chars_per_token: float = 4.0

    def overflowed(self, body: Mapping[str, Any], prompt_tokens: int, window: int | None = None) -> Refusal | None:
        """The context-length refusal for a prompt of ``prompt_tokens`` (None when it fits ``window``, the dialect's by default).

        The completion's cap counts toward the window where the provider's wording says it does (OpenAI, vLLM).
        """
        window = window if window is not None else self.context_window
        if window is None:
            return None
        completion = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        completion = int(completion) if isinstance(completion, (int, float)) and not isinstance(completion, bool) else 0
        wording = self.overflow or _openai_overflow
        counts_output = getattr(wording, "counts_output", True)
        if prompt_tokens + (completion if counts_output else 0) <= window:
            return None
        return wording(window, prompt_tokens, completion)

    def thinking_for(self, body: Mapping[str, Any]) -> bool:
        """Whether this request is answered by a thinking model."""
        return self.thinking != "none" and self.thinks(body)


# ---- OpenAI reasoning models (o-series, gpt-5) ---------------------------------------------------

_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _openai_reasoning_refuse(body: Mapping[str, Any]) -> Refusal | None:
    """One 400 per request, in a fixed order, as OpenAI answers the first parameter it rejects."""
    model = str(body.get("model") or "")
    if model.startswith(("o1-mini", "o1-preview")):  # the first o-series models take no system message
        for i, message in enumerate(body.get("messages") or []):
            if isinstance(message, Mapping) and message.get("role") == "system":
                return Refusal(f"Unsupported value: 'messages[{i}].role' does not support 'system' with this model.",
                               param=f"messages[{i}].role", code="unsupported_value")
    if body.get("max_tokens") is not None:
        return Refusal("Unsupported parameter: 'max_tokens' is not supported with this model. "
                       "Use 'max_completion_tokens' instead.", param="max_tokens", code="unsupported_parameter")
    for name, default in (("temperature", 1), ("top_p", 1)):
        value = body.get(name)
        if value is not None and value != default:
            return Refusal(f"Unsupported value: '{name}' does not support {value} with this model. "
                           f"Only the default ({default}) value is supported.", param=name, code="unsupported_value")
    for name in ("presence_penalty", "frequency_penalty", "logprobs", "top_logprobs"):
        value = body.get(name)
        if value is not None and value is not False and not (name.endswith("penalty") and value == 0):
            return Refusal(f"Unsupported parameter: '{name}' is not supported with this model.",
                           param=name, code="unsupported_parameter")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in _EFFORTS:
        return Refusal(f"Unsupported value: 'reasoning_effort' does not support {effort!r} with this model. "
                       f"Supported values are: {', '.join(repr(e) for e in _EFFORTS)}.",
                       param="reasoning_effort", code="unsupported_value")
    return None


# ---- DashScope compatible mode, qwen3 open-source / QwQ thinking ----------------------------------


def _dashscope_thinks(body: Mapping[str, Any]) -> bool:
    return body.get("enable_thinking") is not False  # the open-source qwen3 models think by default


def _dashscope_refuse(body: Mapping[str, Any]) -> Refusal | None:
    if not _dashscope_thinks(body):
        return None
    if not body.get("stream"):
        return Refusal("parameter.enable_thinking must be set to false for non-streaming calls",
                       code="invalid_parameter_error")
    if (body.get("response_format") or {}).get("type") in ("json_object", "json_schema"):
        return Refusal("<400> InternalError.Algo.InvalidParameter: Json mode response is not supported "
                       "when enable_thinking is true", code="invalid_parameter_error")
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return Refusal("<400> InternalError.Algo.InvalidParameter: The tool_choice parameter does not support "
                       "being set to required or object in thinking mode", code="invalid_parameter_error")
    return None


# ---- Volcengine Ark, doubao-seed thinking ---------------------------------------------------------


def _ark_thinks(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return not (isinstance(thinking, dict) and thinking.get("type") == "disabled")


def _ark_refuse(body: Mapping[str, Any]) -> Refusal | None:
    thinking = body.get("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled", "auto"):
        return Refusal(f"The parameter `thinking.type` specified in the request are not valid: {kind!r}. "
                       "Expected one of enabled, disabled, auto.", param="thinking.type", code="InvalidParameter")
    return None


# ---- vLLM ------------------------------------------------------------------------------------------


def _template_thinks(body: Mapping[str, Any]) -> bool:
    """Qwen3's chat template thinks unless ``chat_template_kwargs.enable_thinking`` is false."""
    kwargs = body.get("chat_template_kwargs")
    return not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)


# ---- DeepSeek reasoner -----------------------------------------------------------------------------


def _deepseek_refuse(body: Mapping[str, Any]) -> Refusal | None:
    for name in ("logprobs", "top_logprobs"):
        if body.get(name) not in (None, False):
            return Refusal(f"{name} is not supported with deepseek-reasoner.", code="invalid_request_error")
    if (body.get("response_format") or {}).get("type") not in (None, "text", "json_object"):
        return Refusal("This response_format type is unavailable now", code="invalid_request_error")
    if body.get("tools"):
        return Refusal("deepseek-reasoner does not support Function Calling.", code="invalid_request_error")
    return None


# ---- Gemini, OpenAI-compatible endpoint ----------------------------------------------------------


def _gemini_refuse(body: Mapping[str, Any]) -> Refusal | None:
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in ("none", "minimal", "low", "medium", "high"):
        return Refusal(f"Invalid reasoning_effort: {effort}", code="INVALID_ARGUMENT")
    return None


def _reasoning_effort_thinks(body: Mapping[str, Any]) -> bool:
    return body.get("reasoning_effort") not in ("none",)


# ---- Anthropic, OpenAI SDK compatibility ---------------------------------------------------------


def _anthropic_refuse(body: Mapping[str, Any]) -> Refusal | None:
    if body.get("n") not in (None, 1):
        return Refusal("n: must be exactly 1", param="n", code="invalid_request_error")
    return None


def _anthropic_thinks(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "enabled"


# ---- context-length refusals (each provider's own wording; the sources are in gradekit.judge._window) ----


def _counts_output(flag: bool) -> Callable[[Callable[..., Refusal]], Callable[..., Refusal]]:
    def mark(fn: Callable[..., Refusal]) -> Callable[..., Refusal]:
        fn.counts_output = flag  # type: ignore[attr-defined]
        return fn
    return mark


@_counts_output(True)
def _openai_overflow(window: int, prompt: int, completion: int) -> Refusal:
    if completion:
        said = (f"This model's maximum context length is {window} tokens. However, you requested {prompt + completion} tokens "
                f"({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.")
    else:
        said = (f"This model's maximum context length is {window} tokens. However, your messages resulted in {prompt} tokens. "
                "Please reduce the length of the messages.")
    return Refusal(said, param="messages", code="context_length_exceeded")


@_counts_output(True)
def _vllm_overflow(window: int, prompt: int, completion: int) -> Refusal:
    return Refusal(f"This model's maximum context length is {window} tokens. However, you requested {completion} output tokens "
                   f"and your prompt contains at least {prompt} input tokens, for a total of at least {prompt + completion} tokens.")


@_counts_output(False)
def _dashscope_overflow(window: int, prompt: int, completion: int) -> Refusal:
    return Refusal(f"<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, {window}]",
                   code="invalid_parameter_error")


@_counts_output(False)
def _anthropic_overflow(window: int, prompt: int, completion: int) -> Refusal:
    return Refusal(f"prompt is too long: {prompt} tokens > {window} maximum")


@_counts_output(False)
def _gemini_overflow(window: int, prompt: int, completion: int) -> Refusal:
    return Refusal(f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({window}).")


_OPENAI_REASONING_DOCS = "https://platform.openai.com/docs/guides/reasoning"
_DASHSCOPE_DOCS = "https://www.alibabacloud.com/help/en/model-studio/deep-thinking"
_VLLM_DOCS = "https://docs.vllm.ai/en/latest/features/reasoning_outputs/"
_ANTHROPIC_DOCS = "https://docs.anthropic.com/en/api/openai-sdk"

DIALECTS: dict[str, Dialect] = {d.name: d for d in (
    Dialect(
        name="openai",
        summary="OpenAI chat models (gpt-4o style): every sampling parameter, json_schema, tools, logprobs; "
                "x-ratelimit-* headers. The fake's behaviour before dialects.",
        sources=("https://platform.openai.com/docs/api-reference/chat/create",
                 "https://platform.openai.com/docs/guides/rate-limits"),
    ),
    Dialect(
        name="openai-reasoning",
        summary="o-series / gpt-5: 400 unsupported_parameter for max_tokens (use max_completion_tokens), "
                "logprobs, top_logprobs and penalties; 400 unsupported_value for temperature/top_p other than 1; "
                "one error per request in that order. Takes reasoning_effort and max_completion_tokens; the "
                "reasoning is hidden but billed (usage.completion_tokens_details.reasoning_tokens), cached prompt "
                "tokens in prompt_tokens_details; a max_completion_tokens the reasoning uses up gives content \"\" "
                "and finish_reason length. Models named o1-mini* and o1-preview* refuse a system message "
                "(400 unsupported_value, param messages[0].role).",
        sources=(_OPENAI_REASONING_DOCS,
                 "https://github.com/microsoft/agent-framework/issues/1077",
                 "https://github.com/CherryHQ/cherry-studio/issues/4973",
                 "https://github.com/griptape-ai/ComfyUI-Griptape/issues/312",
                 "https://github.com/OpenHands/OpenHands/issues/4131",
                 "https://community.openai.com/t/openai-o1-streaming-now-available-api-access-for-tiers-1-5/1025430/4"),
        thinking="hidden", thinks=_always, refuse=_openai_reasoning_refuse, reasoning_usage=True,
    ),
    Dialect(
        name="dashscope-thinking",
        summary="qwen3 open-source / QwQ on DashScope compatible mode: a non-streaming call without "
                "enable_thinking: false is a 400 (parameter.enable_thinking must be set to false for "
                "non-streaming calls); streamed, reasoning_content deltas come before content deltas, "
                "stream_options.include_usage adds a usage chunk; in thinking mode json_object/json_schema and a "
                "forced tool_choice are 400s (their messages name 'Json mode' and 'tool_choice', param is null).",
        sources=(_DASHSCOPE_DOCS,
                 "https://github.com/modelscope/evalscope/issues/998",
                 "https://github.com/infiniflow/ragflow/issues/8972",
                 "https://github.com/presenton/presenton/issues/184",
                 "https://github.com/agentscope-ai/agentscope/issues/1334"),
        thinking="field", thinks=_dashscope_thinks, refuse=_dashscope_refuse, reasoning_usage=True,
        error_shape="dashscope",
    ),
    Dialect(
        name="ark-thinking",
        summary="Volcengine Ark doubao-seed thinking models: thinking: {type: enabled|disabled|auto} in the body "
                "(enabled when absent; any other type is a 400 InvalidParameter), message.reasoning_content, "
                "reasoning_tokens in usage (0 when disabled).",
        sources=("https://www.volcengine.com/docs/82379/1330310",
                 "https://github.com/can1357/oh-my-pi/pull/9610",
                 "https://github.com/agentscope-ai/agentscope/pull/2532"),
        thinking="field", thinks=_ark_thinks, refuse=_ark_refuse, reasoning_usage=True, error_shape="ark",
    ),
    Dialect(
        name="vllm-reasoning-parser",
        summary="vLLM with --reasoning-parser (deepseek_r1, qwen3): the thinking is message.reasoning "
                "(vLLM >= 0.11; reasoning_content before, set reasoning_field), content is the answer only; a reply "
                "cut off inside the thinking has content null. chat_template_kwargs.enable_thinking: false turns "
                "qwen3's thinking off.",
        sources=(_VLLM_DOCS, "https://docs.vllm.ai/en/v0.11.2/features/reasoning_outputs/"),
        thinking="field", reasoning_field="reasoning", thinks=_template_thinks,
    ),
    Dialect(
        name="vllm-no-parser",
        summary="An R1-style model served raw: content is '<think>\\n...\\n</think>\\n\\nANSWER' (qwen3's template); "
                "with think_open_in_prompt (DeepSeek-R1 and QwQ templates end the prompt with '<think>\\n') only "
                "the closing tag appears; a reply cut off by the token limit is the unfinished draft with no "
                "close tag and no answer.",
        sources=(_VLLM_DOCS,
                 "https://huggingface.co/deepseek-ai/DeepSeek-R1/discussions",
                 "https://qwen.readthedocs.io/en/latest/deployment/vllm.html#thinking-non-thinking-modes"),
        thinking="tags", thinks=_template_thinks,
    ),
    Dialect(
        name="deepseek-reasoner",
        summary="DeepSeek's reasoner: message.reasoning_content; temperature, top_p and penalties accepted and "
                "ignored; logprobs/top_logprobs are 400s; response_format only text or json_object (json_schema "
                "is a 400); no function calling (tools are a 400).",
        sources=("https://api-docs.deepseek.com/guides/reasoning_model",
                 "https://api-docs.deepseek.com/zh-cn/guides/reasoning_model",
                 "https://api-docs.deepseek.com/guides/json_mode"),
        thinking="field", thinks=_always, refuse=_deepseek_refuse, reasoning_usage=True,
        ignores=frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"}),
    ),
    Dialect(
        name="gemini",
        summary="Gemini's OpenAI-compatible endpoint: a 429 whose body is a JSON array "
                "[{\"error\": {code, message, status: RESOURCE_EXHAUSTED, details: [RetryInfo retryDelay]}}] and "
                "no Retry-After or rate-limit headers; errors are JSON arrays too; reasoning_effort accepted, "
                "thoughts not returned.",
        sources=("https://ai.google.dev/gemini-api/docs/openai",
                 "https://ai.google.dev/gemini-api/docs/rate-limits",
                 "https://github.com/n4ze3m/page-assist/issues/406",
                 "https://github.com/dcdpr/jp/pull/1061"),
        thinking="hidden", thinks=_reasoning_effort_thinks, refuse=_gemini_refuse, rate_headers="none",
        error_shape="gemini",
    ),
    Dialect(
        name="anthropic",
        summary="Anthropic's OpenAI SDK compatibility: response_format, logprobs, top_logprobs, seed, penalties, "
                "reasoning_effort (and metadata, store, user, ...) ignored, so a JSON answer comes in a code "
                "fence; n must be 1; extended thinking via thinking: {type: enabled, budget_tokens} is not "
                "returned; anthropic-ratelimit-requests/tokens-limit/-remaining/-reset (RFC 3339) headers, "
                "retry-after on 429.",
        sources=(_ANTHROPIC_DOCS, "https://docs.anthropic.com/en/api/rate-limits"),
        thinking="hidden", thinks=_anthropic_thinks, refuse=_anthropic_refuse, fence_json=True,
        ignores=frozenset({"response_format", "logprobs", "top_logprobs", "seed", "presence_penalty",
                           "frequency_penalty", "metadata", "prediction", "service_tier", "logit_bias", "store",
                           "user", "modalities", "audio", "reasoning_effort"}),
        rate_headers="anthropic",
    ),
    Dialect(
        name="openai-context-window",
        summary="OpenAI's chat models with an 8,192-token window (set context_window to vary it): a longer prompt is a 400 "
                "code context_length_exceeded, param messages: \"This model's maximum context length is N tokens. However, "
                "your messages resulted in M tokens.\" (with a completion cap: \"you requested T tokens (M in the messages, "
                "C in the completion)\").",
        sources=("https://github.com/crewAIInc/crewAI-examples/issues/121", "https://github.com/Chanzhaoyu/chatgpt-web/issues/354"),
        context_window=8192, overflow=_openai_overflow,
    ),
    Dialect(
        name="vllm-context-window",
        summary="vLLM 0.20 with --max-model-len 8192: a 400 \"This model's maximum context length is N tokens. However, you "
                "requested C output tokens and your prompt contains at least M input tokens, for a total of at least T "
                "tokens.\" (type BadRequestError, code null); the window holds the completion's cap too.",
        sources=("https://github.com/vllm-project/vllm/issues/42474", "https://github.com/vllm-project/vllm/issues/20409"),
        context_window=8192, overflow=_vllm_overflow,
    ),
    Dialect(
        name="dashscope-context-window",
        summary="DashScope compatible mode: a 400 code invalid_parameter_error \"<400> InternalError.Algo.InvalidParameter: "
                "Range of input length should be [1, N]\": the input alone, and it says nothing of what the prompt counted.",
        sources=("https://github.com/agentscope-ai/QwenPaw/issues/6255", "https://github.com/QwenLM/qwen-code/issues/98"),
        context_window=8192, overflow=_dashscope_overflow, error_shape="dashscope",
    ),
    Dialect(
        name="anthropic-context-window",
        summary="Anthropic (and its OpenAI compatibility): a 400 invalid_request_error \"prompt is too long: M tokens > N maximum\".",
        sources=("https://github.com/sojohnnysaid/project-guide/issues/2", "https://github.com/anthropics/claude-code/issues/62560"),
        context_window=8192, overflow=_anthropic_overflow,
    ),
    Dialect(
        name="gemini-context-window",
        summary="Gemini: a 400 INVALID_ARGUMENT \"The input token count (M) exceeds the maximum number of tokens allowed (N).\" "
                "in Gemini's JSON-array error body.",
        sources=("https://github.com/google-gemini/gemini-cli/issues/6678",),
        context_window=8192, overflow=_gemini_overflow, error_shape="gemini",
    ),
)}


def resolve(dialect: str | Dialect) -> Dialect:
    """The Dialect for a name (or the Dialect itself); a ValueError naming the known ones otherwise."""
    if isinstance(dialect, Dialect):
        return dialect
    try:
        return DIALECTS[dialect]
    except KeyError:
        raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}") from None


# ---- the draft a thinking model writes before its answer ----------------------------------------

_FLIPS = (("<answer>No</answer>", "<answer>Yes</answer>"), ("[[B>A]]", "[[A>B]]"),
          ("Output (b)", "Output (a)"), ("INCORRECT", "CORRECT"), ("错误", "正确"),
          ("\nFinal Decision: No", "\nFinal Decision: Yes"))


def draft_reasoning(body: Mapping[str, Any], final: str | None) -> str:
    """A default thinking draft holding a verdict in every rubric format, each unlike the final answer.

    A client that parses the thinking instead of the answer gets a verdict the final answer does not
    give, so tests catch it: tags (``<answer>No</answer>``), the pairwise ``[[B>A]]`` and ``Output (b)``,
    bare labels, and a JSON object whose enum fields take a value other than the final answer's.
    """
    final = final or ""
    picks = [b if a in final else a for a, b in _FLIPS]
    draft = {key: value for key, value in _schema_draft(body, final).items()}
    verdicts = ", ".join(picks)
    return (f"Let me think this through before answering. A first reading suggests {verdicts}; as JSON that "
            f"would be {json.dumps(draft, ensure_ascii=False)}. Checking again against the reference before "
            "I commit to a final answer.")


def _schema_draft(body: Mapping[str, Any], final: str) -> dict[str, Any]:
    """Each enum property of the requested schema, set to a value the final answer does not hold."""
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if schema is None:
        for tool in body.get("tools") or []:
            schema = (tool.get("function") or {}).get("parameters")
            break
    draft: dict[str, Any] = {}
    for key, prop in ((schema or {}).get("properties") or {}).items():
        options = prop.get("enum") if isinstance(prop, dict) else None
        if options:
            others = [o for o in options if json.dumps(o, ensure_ascii=False) not in final]
            draft[key] = (others or options)[-1]
    return draft or {"label": "No"}
