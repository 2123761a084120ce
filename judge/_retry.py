"""Retry is configuration: which failures are transient, and how long to wait before the next try."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_random_exponential,
)


class NotRecorded(RuntimeError):
    """--replay met a request its cassette does not hold."""


def is_not_recorded(exc: BaseException) -> bool:
    # vcrpy raises CannotOverwriteExistingCassetteException inside the transport and the openai SDK
    # wraps it in APIConnectionError; judge/ must not import vcrpy, so look at the cause chain by name.
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NotRecorded) or type(seen).__name__ == "CannotOverwriteExistingCassetteException":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_transient(exc: BaseException) -> bool:
    """429, 5xx, timeouts, dropped connections and malformed bodies are worth another try."""
    if is_not_recorded(exc):
        return False
    if isinstance(exc, (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409)
    # A 200 whose body is not the JSON it claims (truncated mid-body) is a server fault too.
    return isinstance(exc, (openai.APIResponseValidationError, ValueError))


def retry_after_seconds(exc: BaseException | None, now: float | None = None) -> float | None:
    """The server's own wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - (now if now is not None else time.time()))


class RetryPolicy(BaseModel):
    """Full-jitter exponential backoff, bounded by attempts and by total time; Retry-After wins.

    A 429 is not a failure but the provider asking us to slow down: it does not count against
    ``max_attempts``/``max_elapsed``. Its wait is at least the server's hint and at least a floor
    that doubles with each consecutive 429 of the request (``rate_limit_floor``, up to
    ``max_wait``), plus full jitter over that floor so refused requests do not come back together.
    429 waits have their own budget: ``rate_limit_budget`` seconds per request (10 minutes).
    """

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = 6
    max_elapsed: float = 300.0
    initial_wait: float = 0.5
    max_wait: float = 30.0
    parse_retries: int = 2  # re-asks after a reply with no readable verdict
    rate_limit_budget: float = 600.0  # seconds of 429 waits one request may spend
    rate_limit_floor: float = 0.1  # first 429's minimum wait, doubled per consecutive 429

    def wait(self, state: RetryCallState) -> float:
        """The wait after a failure that is not a 429 (which :meth:`rate_limited_wait` decides)."""
        exc = state.outcome.exception() if state.outcome else None
        server_says = retry_after_seconds(exc)
        if server_says is not None:
            return min(server_says, self.max_elapsed)
        return wait_random_exponential(multiplier=self.initial_wait, max=self.max_wait)(state)

    def rate_limited_wait(self, exc: BaseException | None, consecutive: int) -> float:
        """The wait after the ``consecutive``-th 429 in a row: >= the server's hint, >= the growing floor."""
        floor = min(self.max_wait, self.rate_limit_floor * 2 ** (consecutive - 1))
        server_says = retry_after_seconds(exc) or 0.0
        return max(min(server_says, self.rate_limit_budget), floor + random.uniform(0, floor))

    def retrying(
        self,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        before_sleep: Callable[[RetryCallState], Any] | None = None,
    ) -> AsyncRetrying:
        """A tenacity loop for one request; its 429 and failure budgets are counted apart."""
        kwargs: dict[str, Any] = {}
        if sleep is not None:
            kwargs["sleep"] = sleep
        if before_sleep is not None:
            kwargs["before_sleep"] = before_sleep
        spent = _Spent()

        def count(state: RetryCallState) -> BaseException | None:
            """Book this attempt's outcome once (tenacity asks wait and stop in an order that varies by version)."""
            exc = state.outcome.exception() if state.outcome else None
            if spent.counted < state.attempt_number:
                spent.counted = state.attempt_number
                if isinstance(exc, openai.RateLimitError):
                    spent.consecutive_429 += 1
                else:
                    spent.consecutive_429 = 0
                    spent.failures += 1
            return exc

        def stop(state: RetryCallState) -> bool:
            if isinstance(count(state), openai.RateLimitError):
                pending = spent.last_wait if spent.waited_for == state.attempt_number else 0.0  # decided, not yet slept
                return spent.waited_429 - pending >= self.rate_limit_budget
            # Time spent waiting out 429s is the provider's pacing, not the failure's.
            return spent.failures >= self.max_attempts or state.seconds_since_start - spent.waited_429 >= self.max_elapsed

        def wait(state: RetryCallState) -> float:
            exc = count(state)
            if not isinstance(exc, openai.RateLimitError):
                return self.wait(state)
            if spent.waited_for == state.attempt_number:
                return spent.last_wait  # asked twice for one attempt: the same answer
            seconds = max(0.0, min(self.rate_limited_wait(exc, spent.consecutive_429), self.rate_limit_budget - spent.waited_429))
            spent.waited_429 += seconds
            spent.waited_for, spent.last_wait = state.attempt_number, seconds
            return seconds

        return AsyncRetrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception(is_transient),
            reraise=True,
            **kwargs,
        )


class _Spent:
    """One request's retry accounts: failures, and the 429 streak and time apart from them."""

    def __init__(self) -> None:
        self.failures = 0
        self.consecutive_429 = 0
        self.waited_429 = 0.0
        self.counted = 0  # the last attempt number booked
        self.waited_for, self.last_wait = 0, 0.0
