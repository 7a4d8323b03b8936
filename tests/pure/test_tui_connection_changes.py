"""The connection rule on its own: losing the master is said once and dated from the loss,
getting it back says for how long and how it is read, and before any data nothing is said."""

from __future__ import annotations

from exo_deploy_tui.model.connection_changes import connection_changed
from exo_deploy_tui.model.rows import Connection
from exo_deploy_tui.model.updates import ConnectionUpdate

LIVE = Connection("live")


def test_a_loss_is_said_once_and_dated_from_the_first_failure() -> None:
    lost, said = connection_changed(
        LIVE, ConnectionUpdate("down", "refused", 2.0), 100.0, has_data=True
    )
    assert lost == Connection("down", "refused", 2.0, stale_since=100.0)
    assert [(e.at, e.level, e.text) for e in said] == [(100.0, "error", "lost the master: refused")]
    again, said = connection_changed(
        lost, ConnectionUpdate("down", "refused", 4.0), 103.0, has_data=True
    )
    assert again.stale_since == 100.0 and again.retry_in_s == 4.0
    assert said == []


def test_an_unreadable_master_is_said_so_and_readable_again_after_the_time_lost() -> None:
    unreadable, said = connection_changed(
        LIVE, ConnectionUpdate("unreadable", "bad JSON"), 10.0, has_data=True
    )
    assert [e.text for e in said] == ["cannot read the master: bad JSON"]
    back, said = connection_changed(unreadable, ConnectionUpdate("polling"), 22.5, has_data=True)
    assert back == Connection("polling")
    assert [(e.level, e.text) for e in said] == [
        ("good", "master readable again after 12.5 s (polling)")
    ]


def test_a_lost_master_is_reachable_again_live() -> None:
    lost, _ = connection_changed(LIVE, ConnectionUpdate("down"), 0.0, has_data=True)
    _, said = connection_changed(lost, ConnectionUpdate("live"), 3.0, has_data=True)
    assert [e.text for e in said] == ["master reachable again after 3.0 s (live)"]


def test_before_any_data_nothing_is_said_and_nothing_is_stale() -> None:
    connecting = Connection("connecting")
    failed, said = connection_changed(
        connecting, ConnectionUpdate("down", "refused"), 5.0, has_data=False
    )
    assert said == [] and failed.stale_since is None
    _, said = connection_changed(failed, ConnectionUpdate("live"), 6.0, has_data=False)
    assert said == []
