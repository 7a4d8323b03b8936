"""The dashboard streams are bounded (keeper.sim.master.dashboard_stream): past the master's limit
``GET /events`` is a 503 naming it, a stream that closes frees its slot, and a client that
connects and never reads is dropped by the send deadline (keeper.httpapi.connection_deadlines),
which frees its slot too. On a real uvicorn, with raw sockets for the clients."""

from __future__ import annotations

import socket
from contextlib import ExitStack

from exo_errors import assert_exo_error
from process_helpers import wait_for
from threaded_master import (
    Served,
    connect,
    events_status,
    read_head,
    request_head,
    served_master,
    wait_ended,
)

from keeper.httpapi.connection_deadlines import ConnectionDeadlines
from keeper.model.events import NodeTimedOut
from keeper.sim.master.service import MasterConfig
from keeper.sim.master.subscriptions import MAX_DASHBOARD_STREAMS

LIMIT = 2
STALL_S = 1.0
# The smallest receive buffer Linux allows: a client that never reads has its window shut after
# a few kB, so the server's buffers fill after a few hundred kB of events, not megabytes.
TINY_RECEIVE_BUFFER = 4096
# Events per burst while filling a deaf client's buffers: about 2 MB of stream each, so the
# megabytes a loopback connection's kernel buffers take fill in a few bursts.
BURST = 1_000
PADDING = "x" * 2_000


def open_stream(served: Served, *, receive_buffer: int | None = None) -> socket.socket:
    sock = connect(served.port, receive_buffer=receive_buffer)
    sock.sendall(request_head("/events"))
    if receive_buffer is None:
        assert read_head(sock).startswith(b"HTTP/1.1 200")
    return sock


def test_the_limit_is_a_constant_with_room_for_a_cluster_s_dashboards() -> None:
    assert MasterConfig().max_dashboard_streams == MAX_DASHBOARD_STREAMS == 64


def test_a_stream_past_the_limit_is_a_503_naming_it_and_a_closed_one_frees_its_slot() -> None:
    with served_master(MasterConfig(max_dashboard_streams=LIMIT)) as served, ExitStack() as held:
        streams = [held.enter_context(open_stream(served)) for _ in range(LIMIT)]
        refused = events_status(served)
        assert_exo_error(refused, 503, f"already streams to {LIMIT} dashboards", "GET /events")
        streams[0].close()
        wait_for(
            "the closed stream's slot", 10, lambda: events_status(served).status_code == 200 or None
        )


def test_a_client_that_never_reads_is_dropped_and_its_slot_freed() -> None:
    deadlines = ConnectionDeadlines(send_stall_s=STALL_S)
    config = MasterConfig(max_dashboard_streams=1)
    with (
        served_master(config, deadlines) as served,
        open_stream(served, receive_buffer=TINY_RECEIVE_BUFFER) as deaf,
    ):
        wait_for(
            "the deaf stream to hold the only slot",
            10,
            lambda: events_status(served).status_code == 503 or None,
        )
        bursts = 0

        def freed() -> bool | None:
            # The cluster keeps changing, as it would, so the stream has to keep writing.
            nonlocal bursts
            events = [NodeTimedOut(node_id=f"n{bursts}-{i}-{PADDING}") for i in range(BURST)]
            served.portal.call(served.master.emit, events)
            bursts += 1
            return events_status(served).status_code == 200 or None

        wait_for("the deaf stream dropped", 60, freed)
        # Reset: its buffers dropped, not kept to deliver a close it would never read.
        assert wait_ended(deaf, 10) == "reset"
