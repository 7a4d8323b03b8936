"""What stops a service before it serves: the error a start raises, and the bind check.

A master, a bridge or the stand-in refuses to start with one line naming what cannot work (an
address in use, a bad flag, a public address without a token); the process entry
(``keeper.runtime.entry``) turns these into exit 2 or 1. They live in the runtime, below the
HTTP layer, because everything that starts a service raises or checks them — the entry, the
webhooks' settings, the bridge's store and exo URLs, the HTTP server binding its socket — and the
runtime must not stand on the HTTP layer (docs/design.md §2.1).

Bound to a loopback address a service is reachable only from its own machine, so it needs no
token; bound to any other address it could be driven by anyone on the network, so
``check_bind`` refuses to start it without one (the token itself is checked per request by
``keeper.httpapi.auth``).
"""

from __future__ import annotations

import ipaddress

from keeper.model.constants import TOKEN_ENV


class MasterStartError(Exception):
    """The master cannot start (address in use, bad data dir...); the message says why."""


class InsecureBindError(Exception):
    """Binding a non-loopback address without a token."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname that might resolve anywhere: treat as exposed


def check_bind(host: str, token: str | None) -> None:
    """InsecureBindError, naming how to fix it, for a non-loopback ``host`` without a token."""
    if token:
        return
    if not is_loopback(host):
        raise InsecureBindError(
            f"Refusing to listen on {host} without a token: anyone who can reach it could change "
            f"the cluster. Pass --token-file PATH or set {TOKEN_ENV}, or bind 127.0.0.1."
        )
