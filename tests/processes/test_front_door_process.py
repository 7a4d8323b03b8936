"""The bridge's front door on real sockets: ``exo-deploy cluster --exo-compat`` (the stand-in
for a stock exo, with node processes) and ``exo-deploy bridge`` as processes, one streamed chat
sent to the bridge's ``POST /v1/chat/completions`` and read event by event as it comes, then
one whose client hangs up mid-answer: the bridge asks exo to cancel it, and exo (the stand-in,
as exo) answers, having cancelled it or ended it already (docs/design.md §8.6). Every wait has
a deadline; every process is stopped."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from model_ids import QWEN as MODEL
from process_helpers import (
    START_DEADLINE_S,
    cluster_argv,
    exo_and_bridge,
    get_json,
    run_cli,
    stop,
    wait_for,
)

pytestmark = pytest.mark.e2e


# A chat long enough to be left mid-answer: 400 tokens at a simulated node's 20 a second.
LONG_TOKENS = 400


def requests_total(bridge_url: str, outcome: str) -> float:
    """The bridge's ``exo_deploy_requests_total`` for ``outcome``, summed over deployments."""
    metrics = httpx.get(f"{bridge_url}/metrics", trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("exo_deploy_requests_total{") and f'outcome="{outcome}"' in line
    )


@pytest.mark.e2e(seconds=35)
def test_a_streamed_chat_through_the_bridge_s_front_door(tmp_path: Path) -> None:
    with exo_and_bridge(
        tmp_path,
        lambda port: cluster_argv(port, tmp_path / "cluster", "--exo-compat"),
        *("--hold-s", "5"),
    ) as processes:
        exo_url, bridge_url = processes.exo_url, processes.bridge_url

        def with_nodes() -> bool | None:
            state = get_json(f"{exo_url}/state")
            return True if state is not None and state["topology"]["nodes"] else None

        wait_for("exo with nodes", START_DEADLINE_S, with_nodes)
        deployed = run_cli("deploy", MODEL, "--url", bridge_url, "--json")
        assert deployed.returncode == 0, deployed.stderr

        def serving() -> bool | None:
            listed = get_json(f"{bridge_url}/deployments")
            views = listed["deployments"] if listed is not None else []
            return True if views and views[0]["status"] == "serving" else None

        wait_for("the deployment serving (after the 15 s grace)", 45, serving)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "stream": True,
            "max_tokens": 6,
        }
        events: list[str] = []
        with (
            httpx.Client(timeout=30, trust_env=False) as client,
            client.stream("POST", f"{bridge_url}/v1/chat/completions", json=body) as answer,
        ):
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            events = [
                line.removeprefix("data: ")
                for line in answer.iter_lines()
                if line.startswith("data: ")
            ]
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        chunks = [json.loads(event) for event in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert text and chunks[-1]["choices"][0]["finish_reason"] is not None
        assert requests_total(bridge_url, "ok") == 1

        # A client that hangs up after three tokens of a long answer.
        with (
            httpx.Client(timeout=30, trust_env=False) as client,
            client.stream(
                "POST",
                f"{bridge_url}/v1/chat/completions",
                json={**body, "max_tokens": LONG_TOKENS},
            ) as answer,
        ):
            assert answer.status_code == 200
            read: list[str] = []
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    read.append(line)
                if len(read) == 3:
                    break
        assert len(read) == 3 and not any("[DONE]" in line for line in read)

        def cancelled() -> str | None:
            said = (tmp_path / "bridge.out").read_text(errors="replace")
            line = next((x for x in said.splitlines() if "left mid-answer" in x), None)
            return line if line is not None and requests_total(bridge_url, "cancelled") else None

        line = wait_for("the chat cancelled on exo and counted", 15, cancelled)
        # exo answered the cancel: it cancelled the chat, or had already ended it because
        # the bridge's connection to it closed first (the stand-in's words, as exo's).
        assert (
            "exo's cancel: HTTP 200" in line
            or "exo's cancel: HTTP 404 Command not found or already completed" in line
        ), line
        assert requests_total(bridge_url, "cancelled") == 1
        assert requests_total(bridge_url, "ok") == 1
        assert requests_total(bridge_url, "failed") == 0
        assert stop(processes.bridge) == 0
