"""Secrets out of every text gradekit shows or stores: keys, URL credentials, tokens.

One place renders URLs and errors as text: :func:`redact_url` for an endpoint's URL (a run's
summary, its checkpoint identity, a breaker's message, the endpoints report) and :func:`redact`
for any message (a Verdict's error, a log line, an endpoint's reason). Three things are hidden:

- every secret the process was given: the API keys a Judge was built with and the passwords in its
  URLs (:func:`remember`), wherever they appear, e.g. a 401 body that echoes the key back;
- credentials inside a URL: ``user:password@`` and query parameters named like a secret
  (``api-key``, ``key``, ``token``, ``sig``, ``password``...), so an unknown one is hidden too;
- text that looks like a bearer token or an OpenAI-style key (``Bearer ...``, ``sk-...``).

What a judge replied is stored too (a failed row's ``raw_reply``, a rationale, a reasoning), and a
provider may quote the request back (its ``Authorization`` header, its URL): a
:class:`~judge._verdict.Verdict` redacts those fields as it redacts its error.

Each is replaced by ``***``; what is left (the host, the path, the rest of the message) still says
where and what went wrong.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import urllib.parse

MASK = "***"
_MIN_SECRET = 6  # shorter "keys" (a test's "k", "x") would mask ordinary letters of every message
_SECRET_PARAMS = re.compile(r"^(?:api[-_]?key|key|token|access[-_]?token|auth|authorization|password|passwd|pwd|secret|"
                            r"client[-_]?secret|sig|signature|code|x-api-key|subscription-key)$", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/\s@?#'\"]+)@")
_QUERY_SECRET = re.compile(r"(?P<name>[?&;](?:api[-_]?key|key|token|access[-_]?token|auth|password|passwd|pwd|secret|"
                           r"client[-_]?secret|sig|signature|code|subscription-key)=)(?P<value>[^&#\s'\"]+)", re.IGNORECASE)
_BEARER = re.compile(r"(?P<name>\b(?:Bearer|Basic)\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})")
_KEY_LIKE = re.compile(r"\b(?:sk|rk|pk)-(?:[A-Za-z0-9_-]{2,}-)?[A-Za-z0-9_-]{16,}")

_known: set[str] = set()
_lock = threading.Lock()


def remember(*secrets: str | None) -> None:
    """Secrets to hide wherever they appear from now on in this process (API keys, URL passwords)."""
    with _lock:
        for secret in secrets:
            if secret and len(secret.strip()) >= _MIN_SECRET:
                _known.add(secret.strip())


def remember_url(url: str | None) -> None:
    """The password and secret-named query values inside ``url``, as secrets to hide (see :func:`remember`)."""
    if not url:
        return
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return
    if parts.password:
        remember(parts.password, urllib.parse.unquote(parts.password))
        # httpx sends ``user:password@`` as ``Authorization: Basic base64(user:password)``: a reply may echo that too.
        basic = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password)}"
        remember(base64.b64encode(basic.encode()).decode())
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_PARAMS.match(name):
            remember(value)


def redact(text: str | None) -> str | None:
    """``text`` with every known secret, URL credential and token-like string replaced by ``***``."""
    if not text:
        return text
    text = str(text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)  # a longer secret first: one holding another is masked whole
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    # Each pattern only where its tell is in the text: most texts (every verdict's rationale) hold none, and
    # four regex passes over each would double what building a Verdict costs.
    if "@" in text and "://" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    if "=" in text:
        text = _QUERY_SECRET.sub(lambda m: f"{m['name']}{MASK}", text)
    if "Bearer" in text or "Basic" in text:
        text = _BEARER.sub(lambda m: f"{m['name']}{MASK}", text)
    if "k-" in text:
        text = _KEY_LIKE.sub(MASK, text)
    return text


def redact_url(url: str | None) -> str | None:
    """An endpoint's URL as it may be shown or stored: no ``user:password@``, no secret-named query values."""
    if not url:
        return url
    remember_url(url)
    return redact(url)


def check_base_url(url: str) -> str:
    """An API root a request can be sent to: http(s) with a host. Anything else is a ValueError with the fix,
    before any request (``127.0.0.1:8000/v1`` would otherwise be sent as a relative URL, 50 times, until the breaker)."""
    text = url.strip()
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as e:
        raise ValueError(f"`base_url` {redact_url(text)!r} is not a URL ({e})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        hint = f"http://{text}" if not parts.scheme or "://" not in text else f"https://{text.split('://', 1)[1]}"
        raise ValueError(f"`base_url` {redact_url(text)!r} has no http:// or https:// scheme and host; "
                         f"did you mean {redact_url(hint)!r}? (the API root, often ending in /v1)")
    try:
        parts.port  # noqa: B018 - read for its check: "80x0" or 99999 would fail every request in this process instead
    except ValueError:
        port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise ValueError(f"`base_url` {redact_url(text)!r} has a port that is not a number from 0 to 65535 ({port!r}); "
                         "fix the port (e.g. http://127.0.0.1:8000/v1)") from None
    return url


class RedactingFilter(logging.Filter):
    """Applied to gradekit's loggers: a log line carries no secret, whichever handler prints it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a malformed record: leave it to logging's own error path)
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


def guard_handlers(logger: logging.Logger | None = None) -> None:
    """Put the redacting filter on every handler of ``logger`` (the root logger by default), idempotently.

    A logger's filter sees only its own records; a handler's sees every record that reaches it, also those of
    libraries (httpx logs each request's URL, ``user:password@`` included, at INFO). A process that prints
    its log (``gradekit serve`` with ``logging.enable``) guards its handlers.
    """
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def guard_loggers(*names: str) -> None:
    """Put the redacting filter on gradekit's loggers (idempotent)."""
    for name in names or ("gradekit", "gradekit.judge", "gradekit.runs", "gradekit.cache", "gradekit.server"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())


guard_loggers()
