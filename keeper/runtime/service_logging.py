"""How every service process logs: one format, INFO for our own lines, and the HTTP clients'
loggers held at WARNING (docs/design.md §6.9, "No secret in a log line").

httpx writes ``HTTP Request: POST http://host/hooks/SECRET?k=... "HTTP/1.1 200 OK"`` at INFO for
every request, and httpcore its connection steps at DEBUG with the same URLs. A webhook's path
and query are bearer secrets (Slack's and Discord's webhook URLs are the credential), and the
bridge's exo and etcd calls would flood the log once a second besides. So every service's start
(the master, the bridge, a node, the cluster, the soak) calls ``configure_service_logging`` here,
once, rather than each remembering to quiet the loggers; our own lines name a webhook by scheme,
host and port only (``keeper.runtime.outbox.endpoint_label``).

The loggers' levels are set on the loggers themselves, not only on the root handler, so a later
``basicConfig(level=DEBUG)`` for debugging our own code does not bring the URLs back.
"""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The loggers that would write a request's full URL: httpx (INFO, one line a request) and
# httpcore (DEBUG, each connection step), its transport. At WARNING they say only what fails,
# and httpx's warnings name no URL.
QUIET_LOGGERS = ("httpx", "httpcore")


def quiet_http_clients() -> None:
    """Hold the HTTP clients' loggers at WARNING, whatever the root logger's level."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def configure_service_logging(level: int = logging.INFO) -> None:
    """The logging of a service process: our format at ``level``, the HTTP clients quiet."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
    quiet_http_clients()
