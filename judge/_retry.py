"""Retry is configuration: which failures are transient, and how long to wait before the next try."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Awaitable, Callable
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
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
    """Full-jitter exponential backoff, bounded by attempts and by total time; Retry-After wins."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = 6
    max_elapsed: float = 300.0
    initial_wait: float = 0.5
    max_wait: float = 30.0
    parse_retries: int = 2  # re-asks after a reply with no readable verdict

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        server_says = retry_after_seconds(exc)
        if server_says is not None:
            return min(server_says, self.max_elapsed)
        return wait_random_exponential(multiplier=self.initial_wait, max=self.max_wait)(state)

    def retrying(
        self,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        before_sleep: Callable[[RetryCallState], Any] | None = None,
    ) -> AsyncRetrying:
        kwargs: dict[str, Any] = {}
        if sleep is not None:
            kwargs["sleep"] = sleep
        if before_sleep is not None:
            kwargs["before_sleep"] = before_sleep
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts) | stop_after_delay(self.max_elapsed),
            wait=self.wait,
            retry=retry_if_exception(is_transient),
            reraise=True,
            **kwargs,
        )
