"""The tests' own HTTP requests to the processes they start, through one client.

``httpx.get`` and its siblings build a new ``Client`` for every call, and a client builds an SSL
context, loading the CA bundle, even for plain HTTP: about 15 ms of CPU per request against 0.5 ms
through a client kept (measured on the suite's machine). The process tests poll every 0.2 s, in
several workers at once, so on two cores those contexts were a large share of the suite's CPU.

One client per TLS setting, with keep-alive off: each request is still a new connection, as with
``httpx.get``, so a server that was frozen, killed or restarted on its port is met exactly as a
fresh request meets it, and no idle connection counts against a server's connection bounds.
Requests go straight to loopback (``trust_env=False``: no proxy from the environment).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

# No connection is kept between requests (module docstring).
_LIMITS = httpx.Limits(max_keepalive_connections=0)
_clients: dict[str | bool, httpx.Client] = {}
_lock = threading.Lock()


def client(verify: str | bool = True) -> httpx.Client:
    """The shared client for ``verify`` (a CA file, or whether to check certificates at all)."""
    with _lock:
        found = _clients.get(verify)
        if found is None:
            found = _clients[verify] = httpx.Client(trust_env=False, limits=_LIMITS, verify=verify)
        return found


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return client().request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return client().get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return client().post(url, **kwargs)


def patch(url: str, **kwargs: Any) -> httpx.Response:
    return client().patch(url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return client().delete(url, **kwargs)
