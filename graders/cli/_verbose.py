"""`gradekit -v`: the judge requests as they go (the HTTP client's request lines; with
GRADEKIT_VERBOSE=2 openai's debug lines too), on stderr, with every key redacted."""

from __future__ import annotations

import logging
import os
import re
import sys

import typer

# Header and field forms a key travels in; the value after them is replaced.
_KEYED = re.compile(r"""(?i)(authorization['"]?\s*[:=]\s*['"]?(?:bearer\s+)?|api[-_]?key['"]?\s*[:=]\s*['"]?|x-api-key['"]?\s*[:=]\s*['"]?)"""
                    r"""([^'"\s,}]+)""")
_SECRET = re.compile(r"\b(sk-[A-Za-z0-9_-]{6,}|Bearer\s+[A-Za-z0-9._~+/=-]{6,})")
REDACTED = "<redacted>"


def _known_keys(argv: list[str]) -> list[str]:
    """Keys this process was given: the environment's and --api-key's, so a key in any form is caught."""
    keys = [v for k, v in os.environ.items() if re.search(r"(?i)(api_?key|token|secret)", k) and len(v) >= 4]
    for i, arg in enumerate(argv):
        if arg == "--api-key" and i + 1 < len(argv):
            keys.append(argv[i + 1])
        elif arg.startswith("--api-key="):
            keys.append(arg.partition("=")[2])
    return sorted({k for k in keys if k}, key=len, reverse=True)


def redact(text: str, keys: list[str] = ()) -> str:  # type: ignore[assignment]
    """The text with every key it may hold replaced by <redacted>."""
    for key in keys:
        text = text.replace(key, REDACTED)
    text = _KEYED.sub(lambda m: m.group(1) + REDACTED, text)
    from gradekit.judge._redact import redact as hide  # URL credentials and every key a judge was built with, too

    return hide(_SECRET.sub(REDACTED, text)) or ""


class _Redacting(logging.Handler):
    def __init__(self, level: int, keys: list[str]) -> None:
        super().__init__(level)
        self.keys = keys
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            typer.echo(redact(self.format(record), self.keys), err=True)
        except Exception:  # noqa: BLE001 -- a log line must never break the run
            self.handleError(record)


def show_requests(verbosity: int) -> None:
    """1: one line per judge request (httpx or the fast wire, INFO); 2: openai's debug lines too (DEBUG)."""
    if verbosity <= 0:
        return
    level = logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _Redacting(level, _known_keys(sys.argv))
    # openai 3 sends through httpx2 (its own logger); httpx for other clients and older openai; gradekit's fast
    # wire (aiohttp, gradekit.judge._fastwire) logs its request lines as they do.
    for name in ("httpx2", "httpx", "openai", "gradekit.judge.wire", *(("gradekit",) if verbosity > 1 else ())):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _Redacting)]:
            logger.removeHandler(old)  # once per process, however often the CLI runs in it (tests)
        logger.setLevel(level)
        logger.addHandler(handler)
        logger.propagate = False
