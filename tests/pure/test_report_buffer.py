"""A node's reports coalesce: the latest per key, in the order each was last sent."""

from __future__ import annotations

from keeper.model.events import InstanceDeleted, NodeTimedOut
from keeper.sim.master.report_buffer import MAX_PENDING_REPORTS, ReportBuffer


def test_a_newer_report_replaces_the_pending_one_and_moves_to_the_end() -> None:
    buffer = ReportBuffer()
    buffer.file(("info",), NodeTimedOut(node_id="first"))
    buffer.file(("runner", "r"), NodeTimedOut(node_id="runner"))
    buffer.file(("info",), NodeTimedOut(node_id="second"))
    buffer.file(("deletion", "i"), InstanceDeleted(instance_id="i"))
    assert buffer.take() == [
        NodeTimedOut(node_id="runner"),
        NodeTimedOut(node_id="second"),
        InstanceDeleted(instance_id="i"),
    ]
    assert buffer.replaced == 1
    assert buffer.take() == [] and len(buffer) == 0


def test_the_buffer_says_when_it_holds_its_most() -> None:
    buffer = ReportBuffer()
    for n in range(MAX_PENDING_REPORTS - 1):
        buffer.file(("download", n), NodeTimedOut(node_id=str(n)))
    assert not buffer.full
    buffer.file(("download", "last"), NodeTimedOut(node_id="last"))
    assert buffer.full
