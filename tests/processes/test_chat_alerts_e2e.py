"""Failing chats reach the operator end to end (docs/design.md §6.9): ``exo-deploy master
--exo-compat`` (the stand-in for a stock exo) with no node, so the deployment can never be
placed, and ``exo-deploy bridge`` in front of it with ``--hold-s 1`` and a webhook on a real
socket (``tests/webhook_receiver.py``). Chats through the bridge's front door are held a second
and refused with 503; the receiver gets one ``requests_failing`` naming the deployment, how many
chats failed over what time and its status, and the bridge's ``GET /metrics`` counts them
failed. Every wait has a deadline; every process is stopped."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from model_ids import QWEN as MODEL
from process_helpers import exo_and_bridge, free_port, get_json, run_cli, wait_for
from webhook_receiver import Receiver

from keeper.core.request_alerts import FAILING_WINDOW_S, MIN_FAILED

pytestmark = pytest.mark.e2e

# The notice follows the failed chat that makes the run: it is queued as that chat is counted,
# then POSTed at once; well within this.
NOTICE_WITHIN_S = 15.0
# A chat through the door: held 1 s (--hold-s 1), sent once to exo (its 404), then refused.
CHAT_WITHIN_S = 15.0


def chat(bridge_url: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(timeout=CHAT_WITHIN_S, trust_env=False) as client:
        return client.post(f"{bridge_url}/v1/chat/completions", json=body).status_code


def failing_notices(receiver: Receiver) -> list[dict[str, Any]] | None:
    found = [r.body for r in receiver.received if r.body["kind"] == "requests_failing"]
    return found or None


@pytest.mark.e2e(seconds=30)
def test_chats_failing_through_the_bridge_reach_the_webhook(tmp_path: Path) -> None:
    receiver = Receiver(free_port())
    receiver.start()
    try:
        with exo_and_bridge(
            tmp_path,
            lambda port: ["master", "--exo-compat", "--port", str(port)],
            *("--data-dir", str(tmp_path / "bridge"), "--hold-s", "1", "--webhook", receiver.url),
        ) as processes:
            bridge_url = processes.bridge_url
            deployed = run_cli("deploy", MODEL, "--url", bridge_url, "--json")
            assert deployed.returncode == 0, deployed.stderr
            listed = get_json(f"{bridge_url}/deployments")
            assert listed is not None
            (view,) = listed["deployments"]
            deployment_id = view["deployment"]["deploymentId"]
            with ThreadPoolExecutor(MIN_FAILED) as pool:
                statuses = list(pool.map(chat, [bridge_url] * MIN_FAILED))
            assert statuses == [503] * MIN_FAILED
            (failing,) = wait_for(
                "the requests_failing notice", NOTICE_WITHIN_S, lambda: failing_notices(receiver)
            )
            metrics = httpx.get(f"{bridge_url}/metrics", trust_env=False).text
    finally:
        receiver.stop()
    assert failing["deployment_id"] == deployment_id and failing["model_id"] == MODEL
    assert (failing["failed"], failing["chats"]) == (MIN_FAILED, MIN_FAILED)
    assert failing["window_s"] == FAILING_WINDOW_S
    # Nothing can hold it: placing during the bridge's startup grace, cant_place after.
    assert failing["status"] == "placing" or failing["status"].startswith("cant_place: ")
    assert failing["text"] == (
        f"exo-deploy: chats to {MODEL} (deployment {deployment_id}) are failing: "
        f"{MIN_FAILED} of {MIN_FAILED} failed in the last 1 min, the first at "
        f"{failing['since'][11:19]} UTC; its status: {failing['status']}"
    )
    (received,) = [r for r in receiver.received if r.body["kind"] == "requests_failing"]
    assert received.key == failing["id"]
    assert failing["id"] == f"requests_failing:{deployment_id}:{failing['since']}"
    assert (
        f'exo_deploy_requests_total{{deployment="{deployment_id}",outcome="failed"}} '
        f"{float(MIN_FAILED)}"
    ) in metrics
