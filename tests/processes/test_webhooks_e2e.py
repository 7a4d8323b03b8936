"""Alert webhooks of a real ``exo-deploy master`` process: while its webhook hangs, the API
answers and the notices wait in the outbox; stopped and started again, the master delivers them
to the webhook once it answers, each id once, and its log never names the webhook's secret path
or query (httpx's request lines are held back, docs/design.md §6.9). And ``exo-deploy webhooks
test``'s exit codes.

The notices come from a deployment no node can hold (there are none): after the master's real
15 s startup grace the keeper tries, placement says why not, and the deployment is
``cant_place`` (an incident, too: placement explained why it cannot start). Every wait is on a
condition with a deadline; the master is stopped even on failure.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import shared_http as http
from model_ids import QWEN as MODEL
from process_helpers import (
    START_DEADLINE_S,
    free_port,
    get_json,
    run_cli,
    start_cli,
    stop,
    wait_for,
)
from webhook_receiver import SECRET_PATH, SECRET_QUERY, Receiver

pytestmark = pytest.mark.e2e

# The keeper's 15 s startup grace, then a step: the notices are queued by then.
NOTICES_WITHIN_S = 45
DELIVERED_WITHIN_S = 30
# An API call while the webhook hangs answers within this (it answers in milliseconds).
API_ANSWER_S = 2.0


@contextlib.contextmanager
def master(data_dir: Path, port: int, webhook: str, log: Path) -> Iterator[str]:
    argv = ["master", "--port", str(port), "--data-dir", str(data_dir), "--webhook", webhook]
    with log.open("ab") as output:
        process = start_cli(argv, output)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for("the master to answer", START_DEADLINE_S, lambda: get_json(f"{url}/healthz"))
            yield url
        finally:
            assert stop(process) == 0, log.read_text()


def webhook_health(url: str) -> dict[str, Any] | None:
    health = get_json(f"{url}/healthz")
    return health["webhooks"]["endpoints"][0] if health is not None else None


def test_a_master_keeps_its_api_while_its_webhook_hangs_and_delivers_after_a_restart(
    tmp_path: Path,
) -> None:
    receiver = Receiver(free_port(), mode="hang")
    receiver.start()
    port = free_port()
    data_dir, log = tmp_path / "master", tmp_path / "master.log"
    try:
        with master(data_dir, port, receiver.url, log) as url:
            deployed = run_cli("deploy", MODEL, "--url", url)
            assert deployed.returncode == 0, deployed.stderr

            def queued() -> int | None:
                health = webhook_health(url)
                return health["pending"] if health is not None and health["pending"] >= 2 else None

            pending = wait_for("notices queued", NOTICES_WITHIN_S, queued)
            wait_for("a POST hanging at the webhook", 10, lambda: receiver.attempts or None)
            # Deliveries are stuck; the API answers at once.
            started = time.monotonic()
            answer = http.get(f"{url}/deployments", timeout=API_ANSWER_S)
            assert answer.status_code == 200
            assert time.monotonic() - started < API_ANSWER_S
            (row,) = answer.json()["deployments"]
            assert row["status"] == "cant_place"
            health = webhook_health(url)
            assert health is not None and health["delivered_total"] == 0
            assert health["url"] == f"http://127.0.0.1:{receiver.port}/…"  # no secret path
        receiver.mode = "ok"
        receiver.release()
        with master(data_dir, port, receiver.url, log) as url:
            wait_for(
                "the queued notices delivered",
                DELIVERED_WITHIN_S,
                lambda: len(receiver.ids()) >= pending or None,
            )
            health = webhook_health(url)
            assert health is not None and health["delivered_total"] >= pending
    finally:
        receiver.stop()
    kinds = receiver.kinds()
    assert "cant_place" in kinds and "incident_opened" in kinds, kinds
    ids = receiver.ids()
    assert len(ids) == len(set(ids)), ids  # a clean stop sends nothing twice
    assert all(r.key == r.body["id"] for r in receiver.received)
    (cant,) = [r.body for r in receiver.received if r.body["kind"] == "cant_place"]
    assert cant["model_id"] == MODEL
    assert cant["text"].startswith(f"exo-deploy: {MODEL} cannot be placed")
    logged = log.read_text()
    assert f"127.0.0.1:{receiver.port}" in logged  # the webhook is named: by its host and port
    assert SECRET_PATH not in logged and SECRET_QUERY not in logged


def test_webhooks_test_says_what_each_answered_and_exits_by_the_worst(tmp_path: Path) -> None:
    ok, failing = Receiver(free_port()), Receiver(free_port(), mode="error")
    ok.start()
    failing.start()
    try:
        answered = run_cli("webhooks", "test", "--webhook", ok.url)
        assert answered.returncode == 0, answered.stderr
        assert f"http://127.0.0.1:{ok.port}/…: 200" in answered.stdout
        assert ok.kinds() == ["test"]
        refused = run_cli("webhooks", "test", "--webhook", ok.url, "--webhook", failing.url)
        assert refused.returncode == 1
        assert f"http://127.0.0.1:{failing.port}/…: 500" in refused.stdout
        down = f"http://127.0.0.1:{free_port()}/x"
        unreachable = run_cli("webhooks", "test", "--webhook", failing.url, "--webhook", down)
        assert unreachable.returncode == 3
        assert "no answer" in unreachable.stdout
        bad = run_cli("webhooks", "test", "--webhook", "ftp://example.com/x")
        assert bad.returncode == 2
        assert "'ftp://example.com/x'" in bad.stderr
    finally:
        ok.stop()
        failing.stop()


def test_a_master_given_a_bad_webhook_url_exits_2_naming_it(tmp_path: Path) -> None:
    flag = run_cli(
        "master", "--port", str(free_port()), "--data-dir", str(tmp_path), "--webhook", "not a url"
    )
    assert flag.returncode == 2
    assert "'not a url'" in flag.stderr
