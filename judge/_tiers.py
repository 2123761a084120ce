"""Service tiers: ``service_tier: flex`` for latency-tolerant work, and its fallback to the standard tier.

Flex processing bills at about half the standard price in exchange for slower answers and, when the
provider has no flex capacity, a 429 (OpenAI: "Resource Unavailable", not charged; Groq: 498
``capacity_exceeded``). That 429 says nothing about the caller's rate limit, so it is told apart
here and never reaches the pacer, the per-endpoint hold or the run's breaker: the row backs off on
its own (doubling from ``FLEX_FIRST_WAIT_S``) and, once ``flex_deadline_s`` has passed since the row
started, is sent at the standard tier instead, its cost counted there (:class:`~judge.Usage`'s
``flex_*`` counts hold what flex billed).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type

from ._dialect import error_fields

FLEX_FIRST_WAIT_S = 1.0
FLEX_MAX_WAIT_S = 30.0
DEFAULT_FLEX_DEADLINE_S = 600.0  # OpenAI's flex guide raises the client timeout to 15 minutes; a row waits 10 at most
_RATE_WORDS = re.compile(r"rate.?limit|requests per|tokens per|quota", re.IGNORECASE)
_CAPACITY_WORDS = re.compile(r"resource.?unavailable|capacity|unavailable|overloaded", re.IGNORECASE)

# When the judgement of the current row started (time.monotonic): its flex deadline counts from there.
ROW_STARTED: ContextVar[float | None] = ContextVar("gradekit_row_started", default=None)


class FlexFull(Exception):
    """A flex request the provider had no capacity for: the row waits or falls back, it is not failed."""


def flex_capacity(exc: Any, request: Mapping[str, Any]) -> bool:
    """Whether ``exc`` (an SDK status error) is a flex request's "no capacity now", not a rate limit."""
    if request.get("service_tier") != "flex":
        return False
    status = getattr(exc, "status_code", None)
    if status == 498:  # Groq's flex tier: capacity_exceeded
        return True
    if status != 429:
        return False
    code, _, said = error_fields(getattr(exc, "body", None), str(exc))
    text = f"{code or ''} {said}"
    return bool(_CAPACITY_WORDS.search(text)) and not _RATE_WORDS.search(text)


def standard(request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` at the standard tier (no service_tier: each provider's default)."""
    return {k: v for k, v in request.items() if k != "service_tier"}


def flex_wait(attempt: int, deadline: float) -> float:
    """Seconds to wait before flex attempt ``attempt + 1``: doubling, never past the row's deadline."""
    return max(0.0, min(FLEX_FIRST_WAIT_S * 2 ** attempt, FLEX_MAX_WAIT_S, deadline - time.monotonic()))


def flex_retrying(deadline: float, sleep: Callable[[float], Awaitable[Any]] | None = None) -> AsyncRetrying:
    """A tenacity loop over a flex request: again after each FlexFull, waiting :func:`flex_wait`, until ``deadline``
    (time.monotonic) has passed; then the last FlexFull is raised and the caller sends at the standard tier."""
    return AsyncRetrying(retry=retry_if_exception_type(FlexFull), stop=lambda state: time.monotonic() >= deadline,
                         wait=lambda state: flex_wait(state.attempt_number - 1, deadline), sleep=sleep or asyncio.sleep,
                         reraise=True)
