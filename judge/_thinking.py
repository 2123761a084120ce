"""Thinking apart from the answer: a reasoning model's draft is never read for a verdict.

Thinking reaches a client three ways: a message field (``reasoning_content`` from DeepSeek,
DashScope, Ark and vLLM before 0.11; ``reasoning`` from vLLM 0.11+ and OpenRouter), inline
``<think>...</think>`` tags (an R1-style model served without a reasoning parser), or stream
deltas of those fields (assembled into the message before this module sees it). The chat
templates of DeepSeek-R1 and QwQ put the opening ``<think>`` in the prompt, so a reply may hold
only the closing tag; a reply cut off while thinking holds an opening tag and no close.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REASONING_FIELDS = ("reasoning_content", "reasoning")
_OPEN = re.compile(r"^\s*<think>", re.IGNORECASE)
_CLOSE = re.compile(r"</think>", re.IGNORECASE)


class Reply:
    """A message split into its final answer and its thinking.

    ``answer`` is the text after the last ``</think>`` (or the whole content when there is no
    thinking tag); None when the content is only thinking: an unclosed ``<think>``.
    ``thinking`` joins the reasoning field and any inline block. ``thought`` says whether the
    reply showed thinking at all (a field or a tag), which makes an empty answer a cut-off
    draft rather than an empty reply.
    """

    __slots__ = ("answer", "thinking", "thought")

    def __init__(self, answer: str | None, thinking: str | None, thought: bool) -> None:
        self.answer, self.thinking, self.thought = answer, thinking, thought


def split_thinking(content: str | None) -> tuple[str | None, str | None]:
    """(answer, inline thinking) of one content string."""
    if not content:
        return content, None
    closes = list(_CLOSE.finditer(content))
    if closes:
        end = closes[-1]
        thinking = _OPEN.sub("", content[: end.start()], count=1).strip()
        return content[end.end():].lstrip(), thinking
    opened = _OPEN.match(content)
    if opened:
        return None, content[opened.end():].strip()  # cut off (or never closed): a draft, no answer
    return content, None


def read_message(message: Mapping[str, Any]) -> Reply:
    """Split an assistant message (a completion's ``choices[0].message``) into answer and thinking."""
    content = message.get("content")
    if not isinstance(content, str):
        content = None
    answer, inline = split_thinking(content)
    field = next((message[name] for name in REASONING_FIELDS if isinstance(message.get(name), str) and message[name]), None)
    parts = [part for part in (field, inline) if part]
    thought = field is not None or inline is not None or (content is not None and answer is None)
    return Reply(answer, "\n\n".join(parts) if parts else None, thought)
