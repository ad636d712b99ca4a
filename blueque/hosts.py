"""Which host names Blueque's HTTP servers (the dashboard, ``blueque metrics``, a listener's
``--metrics-port``) answer to.

On a loopback address a server answers only to requests whose ``Host`` names it as this
machine (localhost, 127.0.0.1, ::1) or as one of the names given with ``--allowed-host``: any
web page its user opens could otherwise point its own name at 127.0.0.1 (DNS rebinding), and
the browser would then count the server's pages as that page's own. Elsewhere it answers to
the names given, or to any when none is (it was opened up on purpose).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

#: the names a server on a loopback address answers to, besides its --allowed-host ones
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(host: str, named: Sequence[str]) -> list[str] | None:
    """The host names requests to a server bound to ``host`` may name: on a loopback
    address, its own names and ``named``; elsewhere ``named``, or any (None) when none is
    given (it was opened up on purpose, behind its own authentication)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return [*LOOPBACK_NAMES, *named]
    return list(named) or None


@dataclass(frozen=True)
class HostRule:
    """The names a server answers to (ports aside, case ignored), and its refusal of any
    other ``Host`` header, for the server ``what`` ("dashboard", "metrics server")."""

    allowed: frozenset[str]
    what: str

    @classmethod
    def of(cls, allowed: Sequence[str], what: str) -> HostRule:
        return cls(frozenset(name.lower().strip("[]") for name in allowed), what)

    def refusal(self, header: str | None) -> str | None:
        """None if a request whose Host header is ``header`` is answered; else why not."""
        try:
            name = urlsplit(f"//{header}").hostname if header else None
        except ValueError:  # "[not-an-address": no name at all
            name = None
        if name in self.allowed:
            return None
        return (f"this {self.what} answers to {', '.join(sorted(self.allowed))}, not "
                f"{header or ''!r}: start it with --allowed-host NAME to reach it as NAME")
