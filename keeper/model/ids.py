"""Fresh ids for deployments, instances, runners, commands and chats.

Whoever mints ids takes an ``IdFactory`` (default ``new_id``, a random uuid4) as a parameter,
so a run that must replay exactly (the virtual soak) passes a seeded one instead of replacing
``uuid.uuid4`` for the whole process. It sits beside the data model so that placement, the
master and the bridge can all take it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

IdFactory = Callable[[], str]


def new_id() -> str:
    """A random uuid4, as exo writes its ids."""
    return str(uuid4())
