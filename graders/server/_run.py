"""Running the app under uvicorn: in the foreground for ``gradekit serve``, on a thread for tests."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512
_FULL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\n"
         b"content-length: 61\r\n\r\n" b'{"detail": "Server is busy (server.max_connections reached)."}')


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with what it lacks: a deadline for each request's headers, and a cap on open connections.

    Stock uvicorn starts no timer until a first response is sent, and its keep-alive timer restarts on
    every byte, so a client that sends half a request line (or one byte a second) holds its socket
    forever. Here a connection waiting for a request's headers gets ``header_timeout`` seconds from the
    moment it started waiting, however it trickles; then it is closed. Past ``max_connections`` the
    connection that has waited longest for its headers is closed to make room (a request in progress
    is never cut); when every connection is busy, the new one is answered 503 and closed.
    """

    header_timeout: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._make_room():
            transport.write(_FULL)
            transport.close()
            return
        self._watch()

    def _waiting(self) -> bool:
        their, ours = self.conn.their_state, self.conn.our_state
        return their is h11.IDLE or (their is h11.SEND_BODY and ours in (h11.DONE, h11.MUST_CLOSE))

    def _watch(self) -> None:
        """Arm the header deadline when the connection starts waiting for a request; disarm it once one is in."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._waiting():
            if self._header_timer is None:
                self._waiting_since = self.loop.time()
                self._header_timer = self.loop.call_later(self.header_timeout, self._expire)
        elif self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self._waiting() and not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> bool:
        idle = [c for c in self.connections if isinstance(c, _GuardedH11) and c is not self and c._header_timer is not None
                and not c.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._waiting_since)
        oldest._header_timer.cancel()  # type: ignore[union-attr]
        oldest._header_timer = None
        oldest.transport.close()
        oldest.connections.discard(oldest)  # closed now: it must not count against the cap until its callback runs
        return True

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


class _Uvicorn(uvicorn.Server):
    """uvicorn, told when it is listening, and exiting normally after a graceful SIGTERM.

    Stock uvicorn re-raises the signal once it has shut down, so the process dies "killed by
    SIGTERM" (or raises KeyboardInterrupt) even though every request was answered; a CLI should
    exit 0 after a clean drain.
    """

    def __init__(self, config: uvicorn.Config, on_started: Callable[[_Uvicorn], None] | None = None) -> None:
        super().__init__(config)
        self._on_started = on_started
        self.signalled: list[int] = []
        self.freeze_gc = False

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.freeze_gc:
            # Everything alive now (imported libraries, the grader, its judge) lives as long as the
            # process: take it out of the collector's view, or every full collection under load walks
            # ~10^5 objects and stalls the loop for tens of milliseconds (a 503 would wait that long).
            gc.collect()
            gc.freeze()
        if self.started and self._on_started is not None:
            self._on_started(self)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(sig: int, frame: FrameType | None) -> None:
            self.signalled.append(sig)
            self.handle_exit(sig, frame)  # first signal: drain; a second SIGINT: force quit

        originals = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, original in originals.items():
                signal.signal(sig, original)


class PortInUse(RuntimeError):
    """The address the server was to listen on is taken."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port``, as uvicorn would bind it (SO_REUSEADDR, so a
    restart right after a stop does not wait out TIME_WAIT); PortInUse when another process has it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} on {host} is already in use; stop what holds it or pass --port") from None
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


class RewardServer:
    """Serves an app on ``host:port`` with graceful shutdown.

    ``serve()`` blocks in the foreground: SIGTERM or SIGINT stops accepting connections, waits up
    to ``graceful_timeout`` seconds for in-flight requests, then runs the app's shutdown (the
    computer is closed) and returns. ``start()``/``stop()`` (or ``with``) run it on a thread for
    tests; ``port=0`` picks a free port and ``url`` says which. Every connection has a deadline for
    its request headers and the open connections are capped (``header_timeout``, ``max_connections``;
    by default the reward app's ``server.header_timeout_s`` and ``server.max_connections``).
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 8000, graceful_timeout: float = 30.0,
                 log_level: str = "info", on_started: Callable[[RewardServer], None] | None = None,
                 header_timeout: float | None = None, max_connections: int | None = None) -> None:
        # A reward app's own config (server.header_timeout_s, server.max_connections) decides unless told here.
        section = getattr(getattr(getattr(app, "state", None), "config", None), "server", None)  # None: not a reward app
        protocol = type("GuardedH11", (_GuardedH11,), {
            "header_timeout": float(header_timeout or getattr(section, "header_timeout_s", None) or HEADER_TIMEOUT_S),
            "max_connections": int(max_connections or getattr(section, "max_connections", None) or MAX_CONNECTIONS)})
        # log_config=None: keep the host's logging setup; access_log off: the app logs every request itself.
        config = uvicorn.Config(app, host=host, port=port, log_config=None, log_level=log_level, access_log=False,
                                lifespan="on", timeout_graceful_shutdown=graceful_timeout, http=protocol)  # type: ignore[arg-type]
        self.host = host
        self._notify = on_started
        self._server = _Uvicorn(config, on_started=lambda _: self._notify(self) if self._notify else None)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` once listening."""
        if not self._server.started or not self._server.servers:
            raise RuntimeError("the server is not listening yet")
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve(self) -> None:
        """Serve in the foreground until SIGTERM/SIGINT.

        Raises:
            PortInUse: the address is taken (checked by binding before uvicorn starts, which would
                otherwise log several lines and exit on its own).
            RuntimeError: it could not start for another reason.
        """
        self._server.freeze_gc = True  # this process is the server's: its startup objects stay for good
        sock = bind_socket(self.host, self._server.config.port)
        self._server.run(sockets=[sock])
        if not self._server.started:
            raise RuntimeError("the reward server did not start (see the log above)")

    def start(self, timeout: float = 30.0) -> RewardServer:
        """Serve on a daemon thread; returns once listening."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._server.run, name="gradekit-reward-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise RuntimeError("the reward server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop, as on SIGTERM: in-flight requests finish, then the computer is closed."""
        thread = self._thread
        if thread is None:
            return
        self._server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            self._server.force_exit = True
            thread.join(5)
        self._thread = None

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
