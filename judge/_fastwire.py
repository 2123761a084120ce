"""The fast wire: the non-streamed chat request, the one almost every judgement is, on aiohttp + orjson.

The openai SDK spends about five times the CPU of a bare HTTP request on each call (its request
options, its HTTP client's request and response objects, its connection pool's bookkeeping): on a
fast local judge that, not the judge, bounds what one core can grade. This path sends the same
request with less: the URL and headers are the ones the SDK itself builds for this client (taken
once, by asking the client to send a probe request into a transport that only records it: auth,
``OpenAI-Organization``/``OpenAI-Project``, default headers and query, the base URL), the body is
the bytes the SDK would send (orjson where its output is the SDK's to the byte, the SDK's own
encoding where not), pooled keep-alive connections, and no object per request beyond aiohttp's.

What comes back is what the SDK would raise or return: a 4xx/5xx becomes the SDK's own error class
through the SDK's own mapping (so retries, the breaker and the dialect read it unchanged, rate-limit
headers and ``Retry-After`` included); no answer in time is ``APITimeoutError`` (the whole request is
bounded in :func:`gradekit.judge._wire.post`; a connect or read part of the client's timeout shorter
than that bounds the connection and the first byte and every gap too); a refused, reset or cut
connection is ``APIConnectionError``. TLS is the SDK's HTTP library's own
default context; proxies come from the environment as the SDK's do.

Anything unusual stays on the SDK (:func:`open_wire` answers None): streaming and embeddings (never
routed here), a client that is not a plain ``AsyncOpenAI`` with a fixed key, a SOCKS or ``ALL_PROXY``
proxy, a request body the SDK would encode in a way this path cannot reproduce, an SDK whose request
this path cannot read, or the switch: ``Judge(fast_wire=False)`` or ``GRADEKIT_FAST_WIRE=0``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import math
import os
import re
import sys
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai

from ._sdk import sdk_http, whole_request_seconds

log = logging.getLogger("gradekit.judge")
# One line per request, as the SDK's HTTP library logs them (``gradekit -v`` shows this logger at INFO).
wire_log = logging.getLogger("gradekit.judge.wire")

ENV = "GRADEKIT_FAST_WIRE"
_OFF = {"0", "false", "no", "off"}
# Headers the HTTP library sets for each request itself (aiohttp offers only the encodings it can decode).
_TRANSPORT_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding", "accept-encoding"})
_PROBE: dict[str, Any] = {"model": "probe", "messages": [{"role": "user", "content": "é ✓"}], "temperature": 0.5,
                          "nested": {"list": [1, 2.25, None, True], "empty": {}}}
# Where orjson's float text may not be Python's repr: an exponent (a digit, then e-, e+ or e and a digit), or a
# small float written out in full (0.0000...). Searched for "e" first: a class at the head of a pattern is slow.
_EXPONENT = re.compile(rb"e[-+0-9]")
_DIGITS = frozenset(b"0123456789")


def _may_differ(data: bytes) -> bool:
    if b"0.0000" in data:
        return True
    return any(m.start() and data[m.start() - 1] in _DIGITS for m in _EXPONENT.finditer(data))


# Every wire not yet collected: closed quietly when the process ends (a wire held by a sync façade's loop, which
# never closes, would otherwise meet aiohttp's "Unclosed client session" at interpreter shutdown).
_OPEN: weakref.WeakSet[FastWire] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for wire in list(_OPEN):
        try:
            wire.close_now()
        except Exception:  # noqa: BLE001 -- the process is ending
            pass


def wanted(flag: bool | None) -> bool:
    """Whether the fast wire is on: ``Judge(fast_wire=...)`` if given, else ``GRADEKIT_FAST_WIRE`` (default on)."""
    if flag is not None:
        return flag
    return os.environ.get(ENV, "1").strip().lower() not in _OFF


class WireReply:
    """What the fleet reads of a 2xx: its status and headers (case-insensitive)."""

    __slots__ = ("status_code", "headers")

    def __init__(self, status_code: int, headers: Mapping[str, str]) -> None:
        self.status_code = status_code
        self.headers = headers


class Template:
    """The SDK's request for one client, as it would send it: URL, headers, body encoding, timeouts."""

    __slots__ = ("url", "headers", "compact", "connect", "read", "keepalive")

    def __init__(self, url: str, headers: dict[str, str], compact: bool, connect: float | None, read: float | None,
                 keepalive: float | None) -> None:
        self.url, self.headers, self.compact = url, headers, compact
        self.connect, self.read, self.keepalive = connect, read, keepalive


def _finite(value: Any) -> bool:
    """Whether every float inside ``value`` is finite (orjson writes NaN as null; the SDK refuses it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return False
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return True


def encode(request: Any) -> bytes:
    """``request`` as ``json.dumps(ensure_ascii=False, separators=(",", ":"), allow_nan=False)`` writes it, by orjson.

    orjson writes JSON's own types alike, and every float alike within [1e-4, 1e16); outside it, its
    float text has an exponent or four zeros after the point (``1e16``, ``0.00001``): where the output
    shows such a pattern (in a float, or by chance inside a string) or holds a ``null`` that may be a
    NaN, or the value holds a type orjson would write its own way (a subclass, a date, a dataclass), the
    stdlib writes it instead. Checked against 900,000 random floats (tests/judge/test_fastwire.py).
    """
    import orjson

    try:
        # Subclasses, dates and dataclasses go to ``default`` (none: TypeError), so the stdlib writes them as the SDK does.
        data = orjson.dumps(request, option=orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME
                            | orjson.OPT_PASSTHROUGH_DATACLASS)
    except TypeError:  # orjson.JSONEncodeError: a key that is not a str, an int past 64 bits, a passed-through type
        return _compact(request)
    if not _may_differ(data) and (b"null" not in data or _finite(request)):
        return data
    return _compact(request)


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _plain_client(client: Any) -> str | None:
    """Why ``client`` is not one the fast wire may stand in for (None: it may)."""
    if type(client) is not openai.AsyncOpenAI:
        return f"a {type(client).__name__}, not a plain AsyncOpenAI"
    if not isinstance(getattr(client, "api_key", None), str):
        return "its key is not a fixed string"
    for dynamic in ("custom_auth", "_api_key_provider", "workload_identity", "_provider"):
        if getattr(client, dynamic, None) is not None:
            return f"its auth is dynamic ({dynamic.strip('_')})"
    return None


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY``/``HTTPS_PROXY``, unless ``NO_PROXY`` covers it)."""
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    if parts.hostname and proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme) or None


def _unusual_proxy() -> str | None:
    """A proxy setting aiohttp does not read as the SDK's HTTP library does (SOCKS, ALL_PROXY)."""
    for name, value in os.environ.items():
        lower = name.lower()
        if lower == "all_proxy" and value:
            return f"{name} is set"
        if lower.endswith("_proxy") and value.strip().lower().startswith("socks"):
            return f"{name} is a SOCKS proxy"
    return None


async def template_of(client: Any) -> Template | None:
    """The request the SDK builds for ``client`` (a probe sent into a recording transport), or None."""
    reason = _plain_client(client) or _unusual_proxy()
    if reason is not None:
        log.debug("fast wire off for %s: %s", getattr(client, "base_url", "?"), reason)
        return None
    http = sdk_http()
    seen: list[Any] = []

    def record(request: Any) -> Any:
        seen.append(request)
        return http.Response(200, json={}, request=request)

    recorder = http.AsyncClient(transport=http.MockTransport(record))
    try:
        probe = client.copy(http_client=recorder)
        await probe.post("/chat/completions", body=_PROBE, cast_to=http.Response)
    except Exception as exc:  # an SDK this path cannot read: the SDK sends everything
        log.debug("fast wire off: the SDK's probe request failed (%s: %s)", type(exc).__name__, exc)
        return None
    finally:
        await recorder.aclose()
    if len(seen) != 1 or seen[0].method != "POST":
        return None
    sent = seen[0]
    body = sent.content
    if body == _compact(_PROBE):
        compact = True
    elif body == json.dumps(_PROBE).encode():
        compact = False  # an older HTTP library's json=: ASCII escapes and ", " separators
    else:
        log.debug("fast wire off: the SDK encodes request bodies in a way this path does not reproduce")
        return None
    headers = {k: v for k, v in sent.headers.items() if k.lower() not in _TRANSPORT_HEADERS}
    if any(k.lower() == "idempotency-key" for k in headers):
        return None  # a key per request: the SDK's to make
    timeout = client.timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        connect = read = _seconds(timeout)
    else:
        connect = _seconds(getattr(timeout, "connect", None))
        read = _seconds(getattr(timeout, "read", None))
    # judge._wire.post bounds the whole request by the longest part; a part as long as that bound adds a timer per
    # read (aiohttp reschedules its read timer on every chunk) and bounds nothing the whole-request one does not.
    whole = whole_request_seconds(client)
    connect, read = (None if part is not None and whole is not None and part >= whole else part for part in (connect, read))
    from openai._constants import DEFAULT_CONNECTION_LIMITS

    keepalive = _seconds(getattr(DEFAULT_CONNECTION_LIMITS, "keepalive_expiry", None))
    return Template(str(sent.url), headers, compact, connect, read, keepalive)


class FastWire:
    """One SDK client's chat route on aiohttp, on one event loop; see the module docstring."""

    def __init__(self, client: Any, template: Template) -> None:
        import aiohttp

        self.client, self.template = client, template
        url = template.url
        # Credentials in the URL became the probe's Authorization header (the SDK's HTTP library sends them so, in
        # place of the key); aiohttp refuses both at once, so they go in the header only.
        parts = urlsplit(url)
        self._url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url
        ssl_context: Any = None
        if url.startswith("https:"):
            ssl_context = sdk_http().create_ssl_context()  # the SDK's HTTP library's trust store and settings
        connector = aiohttp.TCPConnector(limit=1000, ssl=ssl_context if ssl_context is not None else True,
                                         keepalive_timeout=template.keepalive or 5.0)
        # HTTP(S)_PROXY and NO_PROXY as the SDK's client reads them, looked up once: aiohttp's trust_env would
        # look up the proxy and ~/.netrc in a thread for every request (two thread hops, most of its CPU).
        self._proxy = _env_proxy(self._url)
        self._session = aiohttp.ClientSession(
            connector=connector, trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=template.connect, sock_read=template.read),
            auto_decompress=True, skip_auto_headers=("User-Agent",), headers=template.headers)
        self._aiohttp = aiohttp
        self._loop = asyncio.get_running_loop()
        self._headers = template.headers
        _OPEN.add(self)

    def body(self, request: Mapping[str, Any]) -> bytes:
        """The request body exactly as the SDK would send it."""
        if not self.template.compact:
            return json.dumps(request).encode()
        return encode(request)

    async def send(self, request: Mapping[str, Any]) -> tuple[WireReply, Any]:
        """One chat request: its reply and JSON body, or the SDK's exception for what went wrong."""
        import orjson

        aiohttp = self._aiohttp
        data = self.body(request)
        if wire_log.isEnabledFor(logging.DEBUG):
            wire_log.debug("Sending HTTP Request: POST %s", self.template.url)
        try:
            async with self._session.post(self._url, data=data, proxy=self._proxy) as response:
                content = await response.read()
                status, headers = response.status, response.headers
                if wire_log.isEnabledFor(logging.INFO):
                    wire_log.info('HTTP Request: POST %s "HTTP/%s.%s %d %s"', self.template.url, *response.version, status,
                                  response.reason)
        except asyncio.TimeoutError as exc:  # aiohttp's read and connect timeouts (ServerTimeoutError is one)
            raise openai.APITimeoutError(request=self._request()) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise openai.APIConnectionError(request=self._request()) from exc
        if status >= 400:
            raise self._status_error(status, headers, content)
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            body = json.loads(content)  # what orjson refuses and json reads (NaN, huge ints, UTF-16), as the SDK path would
        return WireReply(status, headers), body

    def _request(self) -> Any:
        """The SDK's request object for this route, for an exception to carry (only when one is raised)."""
        return sdk_http().Request("POST", self.template.url, headers=self._headers)

    def _status_error(self, status: int, headers: Mapping[str, str], content: bytes) -> openai.APIStatusError:
        """The SDK's own exception for an error status: its class, message and body, read by its own mapping."""
        http = sdk_http()
        response = http.Response(status, headers=list(headers.items()), content=content, request=self._request())
        return self.client._make_status_error_from_response(response)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        await self._session.close()

    def close_now(self) -> None:
        """Close without awaiting: for a wire whose event loop is closed or will not run again (its connections are
        dropped; aiohttp would otherwise log "Unclosed client session" when it is collected)."""
        connector = self._session.connector
        if connector is not None and not connector.closed:
            connector._close()  # the synchronous part of close(); what it would await is the loop's to finish

    def __del__(self) -> None:
        """A wire nobody closed (a loop left running, as a sync façade's is, or a process ending) closes quietly."""
        session = getattr(self, "_session", None)
        if session is None or session.closed:
            return
        loop = self._loop
        try:
            if loop.is_running() and not loop.is_closed():
                loop.call_soon_threadsafe(self.close_now)  # the loop's own thread touches its transports
            else:
                self.close_now()
        except Exception:  # noqa: BLE001 -- a finalizer must not raise; the process may be ending
            pass


async def open_wire(client: Any) -> FastWire | None:
    """A fast wire for ``client`` on the running loop, or None when the SDK is to send everything."""
    if "aiohttp" not in sys.modules:
        try:
            import aiohttp  # noqa: F401
            import orjson  # noqa: F401
        except ImportError:
            return None
    template = await template_of(client)
    return None if template is None else FastWire(client, template)
