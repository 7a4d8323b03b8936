"""A deployment's staging in words counts every copy exo's State shows (docs/design.md §5.12).

The keeper stages standby copies of a model where none is on disk; a copy someone else fetched
(an operator, exo's own dashboard, an earlier instance) serves a failover as well. The words
used to count only the copies the keeper asked for ("standby 1: 0 of 0 copies staged" with the
model on every node's disk).
"""

from __future__ import annotations

import json

from recorded_exo import cluster_recorded

from keeper.model.exo_state import ExoRead, read_exo_state
from keeper.model.state import Deployment
from keeper.runtime.deployments import staging_summary


def test_staging_counts_every_copy_on_disk_not_only_those_the_keeper_asked_for() -> None:
    raw = json.loads(cluster_recorded("state-custom-card-instance-ready"))
    serving, other, _ = raw["topology"]["nodes"]
    held = [e for e in raw["downloads"][serving] if "DownloadCompleted" in e]
    raw["downloads"][other] = held  # a copy fetched by someone else (exo's dashboard, say)
    read = read_exo_state(raw)
    assert isinstance(read, ExoRead)
    state = read.state
    ((_, instance),) = state.instances.items()
    assert list(instance.shard_assignments.node_to_runner) == [serving]
    (shard,) = instance.shard_assignments.runner_to_shard.values()
    deployment = Deployment(deployment_id="d", model_card=shard.model_card, standby=1)
    assert staging_summary(deployment, state, None) == (
        "standby 1: on disk on 1 node besides those serving; "
        "0 of 0 copies the keeper asked for staged"
    )
    asked = deployment.model_copy(update={"staged_on": (other,)})
    assert staging_summary(asked, state, None) == (
        "standby 1: on disk on 1 node besides those serving; "
        "1 of 1 copies the keeper asked for staged"
    )
