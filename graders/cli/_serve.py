"""`gradekit serve`: a reward computer or grader over HTTP, for Bailian, DashScope, Vertex, OpenRLHF and Foundry."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from pathlib import Path

import typer

from ._common import fail

PORT_IN_USE = 3  # exit status when the port is taken: a supervisor can tell it from a broken config (2)


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    config: Path = typer.Option(Path("configs/config.yaml"), "--config", "-c", help="Server config: seed 001's configs/config.yaml plus reward.grader."),
    host: str = typer.Option(None, "--host", envvar="GRADEKIT_SERVER_HOST", help="Bind address (default: server.host, else 127.0.0.1)."),
    port: int = typer.Option(None, "--port", envvar="GRADEKIT_SERVER_PORT", help="Port (default: server.port, else 8000); 0 picks a free one."),
    hedge: bool = typer.Option(None, "--hedge/--no-hedge", show_default=False,
                               help="Hedged judge requests when the grader's judge is a fleet (default: the config's hedge:, "
                                    "else the grader file's judge.hedge, else on). See docs/fleets.md."),
) -> None:
    """Serve the config's reward.class or reward.grader until SIGTERM/SIGINT.

    Routes: POST /compute_reward (Bailian), POST /api/v1 (DashScope), POST / (Vertex Cloud Run), POST /get_reward (OpenRLHF), POST /grade (Foundry endpoint grader), GET /health.

    The first line on stdout is the URL it listens on. SIGTERM stops accepting connections, finishes in-flight requests, closes the grader and exits 0.

    Exit status: 0 after a clean SIGTERM/SIGINT drain; 2: the config is wrong (the message names the file and key); 3: the port is already in use (one line says so); 1: the server could not start for another reason.
    """
    from ..server import RewardServer, ServerConfigError, build_computer, create_app, load_server_config
    from ..server._app import TOKEN_ENV
    from ..server._run import PortInUse
    from ._common import certificates_to_stderr

    certificates_to_stderr()  # on stderr (stdout's first line is the URL): an aligned rubric's certificate as it loads

    try:
        cfg = load_server_config(config)
        if hedge is not None:
            cfg.hedge = hedge
        computer = build_computer(cfg)
        app = create_app(computer, cfg)
    except ServerConfigError as e:
        raise fail(str(e)) from e
    enabled = cfg.logging.enable
    if enabled and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gradekit.judge._redact import guard_handlers

    guard_handlers()  # every line the log prints, httpx's request lines (a judge URL's user:password@) included
    bind = host or cfg.server.host
    if not _is_loopback(bind) and not (cfg.server.auth_token or os.environ.get(TOKEN_ENV)):
        typer.echo(f"warning: serving on {bind} with no bearer token (server.auth_token or {TOKEN_ENV}); "
                   "anyone who can reach the port can spend your judge budget", err=True)

    def announce(server: RewardServer) -> None:
        typer.echo(f"{server.url}")  # first line of stdout: what tests, scripts and benchmarks read

    server = RewardServer(app, host=bind, port=cfg.server.port if port is None else port, graceful_timeout=cfg.server.graceful_timeout,
                          log_level="info" if enabled else "warning", on_started=announce)
    try:
        server.serve()
    except PortInUse as e:
        raise fail(str(e), code=PORT_IN_USE) from e
    except RuntimeError as e:
        raise fail(str(e), code=1) from e
