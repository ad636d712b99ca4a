"""``blueque dashboard``: serve the dashboard with uvicorn (loopback by default)."""

from __future__ import annotations

import argparse
import logging
import os
import socket

import uvicorn

from blueque.client import Client
from blueque.cron import CronEntry
from blueque.hosts import allowed_hosts
from blueque.web.app import create_app

log = logging.getLogger("blueque.web")

TOKEN_ENV = "BLUEQUE_DASHBOARD_TOKEN"  # also named in cli.py's help


def read_token(path: str | None) -> str | None:
    """The action token: from --token-file (never from the command line, where ``ps`` shows
    it), else $BLUEQUE_DASHBOARD_TOKEN; None (read-only) when neither is set."""
    if path:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
        if not token:
            raise ValueError(f"the token file {path} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def serve(client: Client, args: argparse.Namespace, cron_entries: list[CronEntry]) -> int:
    token = read_token(args.token_file)
    app = create_app(client=client, token=token, cron_entries=cron_entries,
                     refresh=args.refresh,
                     allowed_hosts=allowed_hosts(args.host, args.allowed_host))
    sock = listening_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.warning("dashboard on http://%s:%d/ (%s)", shown, port,
                "actions enabled with the token" if token else "read-only")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", proxy_headers=False,
                                           server_header=False))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (IPv4 or IPv6, as the host resolves),
    bound here so that a port in use or a host that is not this machine's is a clear usage
    error (uvicorn would exit 3, which `blueque` means as "Redis unreachable")."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as error:
        raise OSError(f"{host}:{port}: {error.strerror or error}") from error
