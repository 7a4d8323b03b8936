"""The tests' own HTTP requests to the processes they start, through one client.

``httpx.get`` and its siblings build a new ``Client`` for every call, and a client builds an SSL
context, loading the CA bundle, even for plain HTTP: about 15 ms of CPU per request against 0.5 ms
through a client kept (measured on the suite's machine). The process tests poll every 0.2 s, in
several workers at once, so on two cores those contexts were a large share of the suite's CPU.

One client for them all, with keep-alive off: each request is still a new connection, as with
``httpx.get``, so a server that was frozen, killed or restarted on its port is met exactly as a
fresh request meets it, and no idle connection counts against a server's connection bounds.
Requests go straight to loopback (``trust_env=False``: no proxy from the environment). The few
requests that check a TLS certificate build their own client with its ``verify``.
"""

from __future__ import annotations

from typing import Any

import httpx

# No connection is kept between requests (module docstring). Thread-safe: the load tests
# send from several threads.
_CLIENT = httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return _CLIENT.request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return _CLIENT.get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return _CLIENT.post(url, **kwargs)


def patch(url: str, **kwargs: Any) -> httpx.Response:
    return _CLIENT.patch(url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return _CLIENT.delete(url, **kwargs)
