"""A judge that is down, countably: a loopback port that accepts each connection and closes it.

A closed port cannot count what was sent to it; this one can. Every request a client makes
fails as a dropped connection (the SDK's ``APIConnectionError``), and ``accepted`` says how
many connections were tried, so a test can assert how soon a run gave up on a dead judge.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class DownJudge:
    """``with DownJudge() as down: ... down.base_url ... down.accepted``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock = socket.socket()
        self._sock.bind((host, 0))
        self._sock.listen(256)
        self.accepted = 0
        self.base_url = f"http://{host}:{self._sock.getsockname()[1]}/v1"
        self._thread = threading.Thread(target=self._serve, name="judge-down", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() so the thread ends
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> DownJudge:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
