"""Retry is configuration: which failures are transient, and how long to wait before the next try."""

from __future__ import annotations

import datetime
import email.utils
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import openai
from pydantic import BaseModel, ConfigDict
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_random_exponential,
)


class NotRecorded(RuntimeError):
    """A replayed run met a request its cassette does not hold."""


def is_not_recorded(exc: BaseException) -> bool:
    # vcrpy raises CannotOverwriteExistingCassetteException inside the transport and the openai SDK
    # wraps it in APIConnectionError; judge/ must not import vcrpy, so look at the cause chain by name.
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NotRecorded) or type(seen).__name__ == "CannotOverwriteExistingCassetteException":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_local(exc: BaseException) -> bool:
    """Whether ``exc`` failed in this process rather than at the judge: not the SDK's (HTTP, connection, timeout),
    not a malformed body (a ValueError the wire raises for a reply), not a missing cassette entry. An ImportError of a
    broken install, a text that cannot be encoded (UnicodeError), a bug in gradekit or in a rubric's template."""
    if isinstance(exc, openai.APIError) or is_not_recorded(exc):
        return False
    if isinstance(exc, UnicodeError):
        return True  # a ValueError, but no reply's: the row's text cannot be sent
    return not isinstance(exc, ValueError)


def is_transient(exc: BaseException) -> bool:
    """429, 5xx, timeouts, dropped connections and malformed bodies are worth another try."""
    if is_not_recorded(exc) or is_local(exc):
        return False
    if isinstance(exc, (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409)
    # A 200 whose body is not the JSON it claims (truncated mid-body) is a server fault too.
    return isinstance(exc, (openai.APIResponseValidationError, ValueError))


T = TypeVar("T")
RATE_LIMIT_BUDGET_S = 600.0  # seconds of 429 waits one request may spend; no hint holds longer
# No provider documents a Retry-After over a minute (their limits are per minute: OpenAI's and Anthropic's
# windows, Azure's 60 s): a longer hint is a broken one. It is read as this ceiling, so the process probes the
# endpoint again after it instead of stalling (one 429 with Retry-After: 100000 held a 60-row run for 600 s).
HINT_CEILING_S = 60.0
_said_broken: set[str] = set()  # broken hints already reported: each is said once per process

_log = logging.getLogger("gradekit.judge")


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _http_date(text: str, now: float) -> float | None:
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None  # not a date: an unreadable hint is no hint
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)  # RFC 9110 dates are GMT
    return max(0.0, parsed.timestamp() - now)


def _google_retry_delay(body: Any) -> str | None:
    """``retryDelay`` of a ``google.rpc.RetryInfo`` in a Gemini error body (a JSON array or the error object)."""
    if isinstance(body, list) and body and isinstance(body[0], dict):
        body = body[0].get("error", body[0])
    if not isinstance(body, dict):
        return None
    details = body.get("details") if isinstance(body.get("details"), list) else (body.get("error") or {}).get("details")
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            delay = detail.get("retryDelay")
            return delay if isinstance(delay, str) else None
    return None


def retry_after_seconds(exc: BaseException | None, now: float | None = None, *,
                        cap: float = RATE_LIMIT_BUDGET_S) -> float | None:
    """The server's own wait, at most ``cap`` seconds; None when it gave none we can read.

    Read from ``retry-after-ms``, ``Retry-After`` (seconds or an HTTP date), or, for Gemini, which
    sends no header, the ``google.rpc.RetryInfo`` ``retryDelay`` ("20s") in the error body. A hint
    that does not parse (``Retry-After: garbage``, ``nan``) is no hint; a hint beyond ``HINT_CEILING_S``
    (``Retry-After: 100000``, ``retry-after-ms: 1e12``, a date in 2099) is a broken one, read as that
    ceiling and said once; any hint beyond ``cap`` (the caller's budget) is capped and logged.
    """
    now = now if now is not None else time.time()
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    seconds: float | None = None
    said = ""
    if headers is not None:
        ms = headers.get("retry-after-ms")
        if ms is not None and (value := _finite(ms)) is not None:
            seconds, said = value / 1000, f"retry-after-ms: {ms}"
        value_text = headers.get("retry-after")
        if seconds is None and value_text:
            seconds = _finite(value_text)
            if seconds is None:
                seconds = _http_date(value_text, now)
            said = f"Retry-After: {value_text}"
    if seconds is None:
        delay = _google_retry_delay(getattr(exc, "body", None))
        if delay is not None and delay.endswith("s"):
            seconds, said = _finite(delay[:-1]), f"retryDelay: {delay}"
    if seconds is None:
        return None
    if seconds > HINT_CEILING_S:
        if said not in _said_broken and len(_said_broken) < 1000:
            _said_broken.add(said)
            _log.warning("the provider asked to wait %.0f s (%s): no provider documents a wait over %.0f s, so the hint is "
                         "taken as broken; waiting %.0f s, then asking again", seconds, said, HINT_CEILING_S, min(cap, HINT_CEILING_S))
        seconds = HINT_CEILING_S
    if seconds > cap:
        # Marked on the 429 itself (one is read twice: for the wait and for the hold); an id() would be
        # reused by a later exception once this one is collected, and that one would go unwarned.
        if exc is not None and not getattr(exc, "_gradekit_cap_warned", False):
            try:
                exc._gradekit_cap_warned = True  # type: ignore[union-attr]
            except AttributeError:
                pass
            _log.warning("the provider asked to wait %.0f s (%s): capped at %.0f s, the most one request may wait "
                         "(RetryPolicy.rate_limit_budget for a 429)", seconds, said, cap)
        return cap
    return seconds


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
    rate_limit_budget: float = RATE_LIMIT_BUDGET_S  # seconds of 429 waits one request may spend
    rate_limit_floor: float = 0.1  # first 429's minimum wait, doubled per consecutive 429

    def wait(self, state: RetryCallState) -> float:
        """The wait after a failure that is not a 429 (which :meth:`rate_limited_wait` decides)."""
        exc = state.outcome.exception() if state.outcome else None
        server_says = retry_after_seconds(exc, cap=self.max_elapsed)
        if server_says is not None:
            return server_says
        return wait_random_exponential(multiplier=self.initial_wait, max=self.max_wait)(state)

    def rate_limited_wait(self, exc: BaseException | None, consecutive: int) -> float:
        """The wait after the ``consecutive``-th 429 in a row: >= the server's hint, >= the growing floor."""
        floor = min(self.max_wait, self.rate_limit_floor * 2 ** (consecutive - 1))
        server_says = retry_after_seconds(exc, cap=self.rate_limit_budget) or 0.0
        return max(server_says, floor + random.uniform(0, floor))

    async def call(self, once: Callable[[], Awaitable[T]], *, sleep: Callable[[float], Awaitable[Any]] | None = None,
                   before_sleep: Callable[[RetryCallState], Any] | None = None) -> T:
        """``once()`` under this policy. The first attempt runs before any tenacity loop is built:
        most requests succeed at once, and a loop per request is most of the client's own CPU. A
        failure is handed to :meth:`retrying` as its first attempt, so tenacity decides every retry
        as before, its elapsed budget counted from the first attempt."""
        started = time.monotonic()
        try:
            return await once()
        except Exception as exc:
            if not is_transient(exc):
                raise
            pending = [exc]
        result: T
        async for attempt in self.retrying(sleep=sleep, before_sleep=before_sleep, started=started):
            with attempt:
                if pending:
                    raise pending.pop()
                result = await once()
        return result

    def retrying(
        self,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        before_sleep: Callable[[RetryCallState], Any] | None = None,
        started: float | None = None,
    ) -> AsyncRetrying:
        """A tenacity loop for one request; its 429 and failure budgets are counted apart.

        ``started``: when the request's first attempt began (time.monotonic), if before the loop.
        """
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
            elapsed = state.seconds_since_start if started is None else (state.outcome_timestamp or time.monotonic()) - started
            return spent.failures >= self.max_attempts or (elapsed or 0.0) - spent.waited_429 >= self.max_elapsed

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
