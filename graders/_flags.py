"""The one flag table: the judge spec field (judge._spec, judge.Budget) each command-line flag sets.

The judge core names fields in its messages (`base_url`, `params.max_completion_tokens`), never
flags, so a Python user reads the names they set. What the command line shows (stderr, the run
summary, an output file's ``error`` cells) says each field as the flag that sets it. It lives
below both graders/cli and graders/runs, which write those outputs.
"""

from __future__ import annotations

import re

FLAGS: dict[str, str] = {
    "model": "--model", "base_url": "--base-url", "api_key": "--api-key", "params": "--judge-param", "timeout": "--timeout",
    "row_deadline": "--row-deadline",
    "params.temperature": "--temperature", "params.reasoning_effort": "--reasoning-effort",
    "params.max_completion_tokens": "--max-completion-tokens",
    "limits.rps": "--rps", "limits.tpm": "--tpm", "limits.concurrency": "--concurrency", "limits.adapt": "--no-adapt",
    "limits.url": "--limiter", "limits.key": "--limiter-key", "max_cost_usd": "--max-cost", "max_tokens": "--max-tokens",
    "prices": "--prices", "context_window": "--context-window", "api": "--api", "service_tier": "--service-tier",
    "flex_deadline_s": "--flex-deadline", "hedge": "--hedge",
}
_FIELD = re.compile(r"`([a-z_.]+)`")


def in_flags(message: str) -> str:
    """A judge core message with each `field` it names said as the flag that sets it (other backticks stay)."""
    return _FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(0)), message)


def said_as_flags(message: str | None) -> str | None:
    """:func:`in_flags` for an optional message (a row's ``error`` cell)."""
    return message if message is None else in_flags(message)
