"""What a service tells its front door (docs/design.md §8.6): how long a chat may be held, how
often continued, how many may be in at once, and what it knows of each model's deployment.

Apart from the door itself (``keeper.runtime.front_door``) because a service's flags and its
view of the deployments are built from these without the machinery that forwards chats.
"""

from __future__ import annotations

from dataclasses import dataclass

# How long a request may wait for its deployment to serve (``--hold-s``): a fast failover
# serves again in 6.4-6.6 s on a real cluster, a staged one (a load) in about 40 s; 30 s
# covers the first several times over and a client's usual minute-long timeout still holds.
DEFAULT_HOLD_S = 30.0
# Continuations of one chat at most (``--migrations``): two losses in one answer is already
# rare; more would let a chat that breaks every instance wander the cluster.
DEFAULT_MIGRATIONS = 2
# Requests in the front door at once, held ones included (``--max-inflight``): exo serves a
# few chats at a time per instance; 256 waiting is far more than a cluster drains in a hold,
# and bounds the memory and connections a burst can take.
DEFAULT_MAX_INFLIGHT = 256
# What a 503 or a 429 tells the client to wait: about one fast failover.
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class FrontDoorConfig:
    """The front door's bounds: ``--hold-s``, ``--migrations``, ``--max-inflight``."""

    hold_s: float = DEFAULT_HOLD_S
    migrations: int = DEFAULT_MIGRATIONS
    max_inflight: int = DEFAULT_MAX_INFLIGHT


@dataclass(frozen=True)
class ModelDeployment:
    """What the front door needs of a model's deployment: its id, whether it serves in the
    service's view, its status in words for a refusal, and the instances of its model a chat
    in flight may be on and still be answered (``keeper.model.readiness.chat_homes``)."""

    deployment_id: str
    serving: bool
    words: str
    homes: frozenset[str] = frozenset()
