"""``exo-deploy master --token-file PATH`` as a real process: the token is read from the file and
required for changes, and it is not in the process's command line (what ``ps`` shows other users);
a file that gives no token stops the start with exit 2 and a message naming it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import shared_http as http
from model_ids import QWEN
from process_helpers import (
    START_DEADLINE_S,
    free_port,
    get_json,
    run_cli,
    start_cli,
    stop,
    wait_for,
)

from keeper.cli import EXIT_USAGE

TOKEN = "s3cret-token-from-a-file"


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_DEPLOY_TOKEN", raising=False)  # the processes inherit the rest


def test_a_token_file_that_cannot_be_read_stops_the_start_naming_it(tmp_path: Path) -> None:
    absent = tmp_path / "no-such-token"
    done = run_cli("master", "--port", str(free_port()), "--token-file", str(absent))
    assert done.returncode == EXIT_USAGE
    assert f"cannot read the token file {absent}: No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_a_master_takes_its_token_from_a_file_and_not_from_its_command_line(
    tmp_path: Path,
) -> None:
    token_path = tmp_path / "token"
    token_path.write_text(f"{TOKEN}\n", encoding="utf-8")
    token_path.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["master", "--port", str(port), "--token-file", str(token_path)]
    with tempfile.TemporaryFile() as output:
        process = start_cli(argv, output)
        try:
            wait_for("the master to answer", START_DEADLINE_S, lambda: get_json(f"{url}/healthz"))
            shown = Path(f"/proc/{process.pid}/cmdline").read_bytes()
            assert str(token_path).encode() in shown
            assert TOKEN.encode() not in shown
            body = {"model_id": QWEN}
            refused = http.post(f"{url}/deployments", json=body)
            assert refused.status_code == 401
            headers = {"Authorization": f"Bearer {TOKEN}"}
            created = http.post(f"{url}/deployments", json=body, headers=headers)
            assert created.status_code == 200, created.text
        finally:
            stop(process)
