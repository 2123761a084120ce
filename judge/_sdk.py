"""What the installed openai SDK's client is made of: the HTTP library it sends through, and its timeout.

Both wires read these (the SDK's wire, :mod:`gradekit.judge._wire`, and the fast wire,
:mod:`gradekit.judge._fastwire`), as do the fleet and the native routes: they live below all of them.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import openai


@functools.cache
def sdk_http() -> Any:
    """The HTTP library the installed openai SDK sends through: httpx (1.x, 2.x) or httpx2 (3.x).

    Its ``Response`` is what ``client.post(cast_to=Response)`` returns raw and its ``Request`` is what
    an ``APITimeoutError`` carries; both are taken from the SDK's own client class, never from a
    transport package assumed to be installed (openai 3.x installs httpx2, not httpx).
    """
    for cls in openai.DefaultAsyncHttpxClient.__mro__:
        root = cls.__module__.partition(".")[0]
        if root != "openai" and cls is not object:
            return importlib.import_module(root)
    raise RuntimeError("the openai SDK's async client is not built on an HTTP library gradekit knows")


def whole_request_seconds(client: Any) -> float | None:
    """The SDK client's timeout as seconds for a whole request (the longest part of a transport Timeout), or None."""
    timeout = getattr(client, "timeout", None)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout) if timeout > 0 else None
    parts = [getattr(timeout, name, None) for name in ("connect", "read", "write", "pool")]
    seconds = [float(p) for p in parts if isinstance(p, (int, float)) and p > 0]
    return max(seconds) if seconds else None
