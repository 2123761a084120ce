"""A judge's context window: read from a provider's context-length refusal, or known for a model.

A prompt over the window is refused with a 400 whose wording names the window in most dialects.
:func:`overflow_of` reads it (the window, what the provider counted, whether the completion is
part of the window), so the row is rendered again within it and every later row fits from the
start; the window is kept with the endpoint's dialect in the judge cache (:mod:`gradekit.judge._dialect`),
so a second process sends no refusal. The wordings, as providers write them:

==========  =====================================================================================================
OpenAI      ``code: context_length_exceeded``: "This model's maximum context length is 8192 tokens. However, your
            messages resulted in 8227 tokens. Please reduce the length of the messages." (crewAIInc/crewAI-examples
            #121); "... However, you requested 4130 tokens (3130 in the messages, 1000 in the completion) ..."
vLLM        the same first sentence (vllm-project/vllm #20409); vLLM 0.20: "This model's maximum context length is
            128000 tokens. However, you requested 65535 output tokens and your prompt contains at least 62466 input
            tokens, for a total of at least 128001 tokens." (vllm-project/vllm #42474)
DashScope   "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 983616]"
            (agentscope-ai/QwenPaw #6255, QwenLM/qwen-code #98): the input alone
Anthropic   "prompt is too long: 208656 tokens > 200000 maximum" (sojohnnysaid/project-guide #2,
            anthropics/claude-code #62560); "input length and `max_tokens` exceed context limit: 149674 + 64000 >
            204658, decrease input length or `max_tokens` and try again" (egoist/chatwise-releases #917)
Gemini      "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
            (google-gemini/gemini-cli #6678): the input alone
==========  =====================================================================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NUM = r"(\d[\d,]*)"


@dataclass(frozen=True)
class Overflow:
    """What a context-length refusal said: the window, what the prompt counted (when said), and whether
    the window holds the completion too (OpenAI, vLLM) or the input alone (DashScope, Gemini, Anthropic's first form)."""

    window: int | None
    prompt_tokens: int | None = None
    input_only: bool = False


def _int(text: str) -> int:
    return int(text.replace(",", ""))


# (pattern, window group, prompt group, input only)
_PATTERNS: tuple[tuple[re.Pattern[str], int, int | None, bool], ...] = (
    (re.compile(rf"maximum context length is {_NUM} tokens.*?your prompt contains at least {_NUM} input tokens", re.I | re.S), 1, 2, False),
    (re.compile(rf"maximum context length is {_NUM} tokens.*?\({_NUM} in the messages", re.I | re.S), 1, 2, False),
    (re.compile(rf"maximum context length is {_NUM} tokens.*?(?:messages|prompt) resulted in {_NUM} tokens", re.I | re.S), 1, 2, False),
    (re.compile(rf"maximum context length is {_NUM} tokens", re.I), 1, None, False),
    (re.compile(rf"input tokens exceed the configured limit of {_NUM} tokens.*?resulted in {_NUM} tokens", re.I | re.S), 1, 2, True),
    (re.compile(rf"range of input length should be \[\s*\d+\s*,\s*{_NUM}\s*\]", re.I), 1, None, True),
    (re.compile(rf"prompt is too long:\s*{_NUM} tokens\s*>\s*{_NUM}", re.I), 2, 1, True),
    (re.compile(rf"input length and .?max_tokens.? exceed context limit:\s*{_NUM}\s*\+\s*\d[\d,]*\s*>\s*{_NUM}", re.I), 2, 1, False),
    (re.compile(rf"input token count \({_NUM}\) exceeds the maximum number of tokens allowed \({_NUM}\)", re.I), 2, 1, True),
)
_WORDS = re.compile(r"context[_ ]length[_ ]exceeded|context length|context window|too many tokens|prompt is too long|"
                    r"input length|maximum context", re.I)


def overflow_of(code: str | None, message: str) -> Overflow | None:
    """The context-length refusal in a 400's code and message, or None when the 400 is about something else.

    A refusal that names no window (``context_length_exceeded`` alone) is an Overflow with ``window``
    None: the prompt was too long, by how much unknown.
    """
    for pattern, window, prompt, input_only in _PATTERNS:
        found = pattern.search(message)
        if found is not None:
            return Overflow(_int(found.group(window)), _int(found.group(prompt)) if prompt is not None else None, input_only)
    if code == "context_length_exceeded" or (code is None and _WORDS.search(message) and "max_tokens" not in message.lower()):
        return Overflow(None)
    return None


# Context windows documented by the providers (tokens, the input and the completion together), for a
# model whose window is neither configured (``context_window``) nor learnt yet. A dated snapshot
# matches its base name. Stale entries cost at most one refusal: the refusal's own number wins.
KNOWN_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000, "gpt-4o-mini": 128_000,  # platform.openai.com/docs/models/gpt-4o
    "gpt-4.1": 1_047_576, "gpt-4.1-mini": 1_047_576, "gpt-4.1-nano": 1_047_576,  # .../models/gpt-4.1
    "o3": 200_000, "o4-mini": 200_000,  # .../models/o3, .../models/o4-mini
    "gpt-5": 400_000, "gpt-5-mini": 400_000, "gpt-5-nano": 400_000,  # .../models/gpt-5
}
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def known_window(model: str) -> int | None:
    name = model.rsplit("/", 1)[-1].lower()
    return KNOWN_WINDOWS.get(name) or KNOWN_WINDOWS.get(_SNAPSHOT.sub("", name))


def window_record(window: int | None, input_only: bool, scale: float, accepted: int) -> dict[str, Any]:
    """The window part of a dialect's cache record."""
    return {"context_window": window, "window_input_only": input_only, "token_scale": round(scale, 4), "accepted_tokens": accepted}
