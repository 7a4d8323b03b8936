"""The bridge's staged failover against the stock-exo stand-in (docs/design.md §5.12, and
docs/bridge.md): the keeper's copies go to exo as ``POST /download/start`` with exo's shard and
card, are recorded once exo took them, and are deleted through ``DELETE /download/...`` with
their deployment; an exo without the download routes is kept without staging."""

from __future__ import annotations

import pytest
from bridge_harness import exo_with_bridge
from model_ids import QWEN
from waiting import wait_until

from keeper.model.state import DownloadCompleted, download_model_id


def _starts(calls: list[tuple[str, str, object]]) -> list[dict[str, object]]:
    return [
        body
        for method, path, body in calls
        if (method, path) == ("POST", "/download/start") and isinstance(body, dict)
    ]


@pytest.mark.anyio
async def test_the_bridge_stages_through_exo_and_deletes_the_copy_with_its_deployment() -> None:
    async with exo_with_bridge() as h:
        deployment_id, instance_id = await h.serve_qwen()
        assert deployment_id is not None
        serving = set(h.master.state.instances[instance_id].shard_assignments.node_to_runner)
        (other,) = [n for n in h.master.state.topology.nodes if n not in serving]

        def staged() -> bool:
            entries = h.master.state.downloads.get(other, [])
            held = any(
                isinstance(e, DownloadCompleted) and download_model_id(e) == QWEN for e in entries
            )
            return held and h.bridge.state.deployments[deployment_id].staged_on == (other,)

        await wait_until(staged, 60, "the copy staged in exo and recorded")
        (start,) = _starts(h.link.calls)
        assert start["target_node_id"] == other
        shard = start["shard_metadata"]
        assert isinstance(shard, dict)
        ((tag, body),) = shard.items()
        assert tag == "PipelineShardMetadata"
        assert body["modelCard"]["modelId"] == QWEN
        assert "samplingDefaults" in body["modelCard"]  # exo's own card, not one rebuilt

        def listed() -> list[tuple[str, str]]:
            view = h.bridge.deployments_view().deployments[0]
            return [(c.node_id, c.state) for c in view.staged]

        # GET /deployments follows exo's State at the bridge's next poll.
        await wait_until(lambda: listed() == [(other, "completed")], 5, "listed as staged")

        await h.bridge.delete_deployment(deployment_id)
        deletion = f"/download/{other}/{QWEN}"
        await wait_until(
            lambda: ("DELETE", deletion, None) in h.link.calls, 30, "the copy deleted in exo"
        )


@pytest.mark.anyio
async def test_an_exo_without_the_download_routes_is_kept_without_staging() -> None:
    async with exo_with_bridge() as h:
        h.link.answers[("POST", "/download/start")] = lambda _: (404, {"detail": "Not Found"})
        deployment_id, _ = await h.serve_qwen()
        assert deployment_id is not None
        await wait_until(lambda: len(_starts(h.link.calls)) == 1, 60, "staging tried once")
        # Said once, never asked again, nothing recorded, and the model is kept as ever.
        await wait_until(lambda: h.bridge._staging.unsupported is not None, 10, "said")  # pyright: ignore[reportPrivateUsage]
        before = len(h.link.calls)
        await wait_until(lambda: len(h.link.calls) >= before, 65, "time passing")
        assert len(_starts(h.link.calls)) == 1
        assert h.bridge.state.deployments[deployment_id].staged_on == ()
        assert h.serving()
