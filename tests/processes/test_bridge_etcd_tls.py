"""Bridges on etcd as production runs it: TLS, client certificates, a user limited to the prefix.

A real etcd (``keeper.sim.cluster.etcd_members`` with ``EtcdTls``) speaking TLS with
``--client-cert-auth``, auth enabled and a user ``bridge`` whose role reads and writes the test
prefix only; certificates from ``tests/etcd_tls.py``. Checked: two bridges with
``--store etcds://`` and the files act, take writes and take over; plaintext is refused by that
etcd; every wrong credential is exit 2 naming it (a password, a certificate of another CA, a CA
that did not sign etcd's, no certificate, a CommonName, an unreadable file, credentials in the
URL, never echoed); a password changed under a running bridge is named in ``/healthz`` and in
each refused write; an expired token is renewed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import shared_http as http
from etcd_bridges import LEASE_S, PREFIX, TAKEOVER_MARGIN_S, Stack, stack
from etcd_tls import Pki, make_pki
from model_ids import QWEN as MODEL
from process_helpers import free_port, wait_for

from keeper.bridge.etcd_access import StoreAccessOptions, load_access
from keeper.bridge.etcd_store import EtcdStore, parse_store_url
from keeper.model.events import DeploymentStandbyChanged
from keeper.sim.cluster.etcd_members import EtcdTls

pytestmark = pytest.mark.e2e

ROOT_PASSWORD = "root-pw-for-tests"
PASSWORD = "bridge-pw-for-tests"


@dataclass
class Secure:
    running: Stack
    pki: Pki
    password_file: Path

    def flags(
        self,
        *,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        password_file: Path | None = None,
    ) -> list[str]:
        return [
            "--store-ca",
            str(ca or self.pki.ca),
            "--store-cert",
            str(cert or self.pki.client_cert),
            "--store-key",
            str(key or self.pki.client_key),
            "--store-user",
            "bridge",
            "--store-password-file",
            str(password_file or self.password_file),
        ]


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[Secure]:
    pki = make_pki(tmp_path / "pki")
    tls = EtcdTls(pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key)
    password_file = tmp_path / "bridge.password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    with stack(tmp_path, tls=tls) as running:
        running.etcd.enable_auth(ROOT_PASSWORD, "bridge", PASSWORD, PREFIX)
        found = Secure(running, pki, password_file)
        running.store_flags = found.flags()
        yield found


def bridge_exit(secure: Secure, *argv: str) -> subprocess.CompletedProcess[str]:
    """``exo-deploy bridge`` against the stack's exo with ``argv`` for the store: its exit."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "keeper.cli",
            "bridge",
            "--exo",
            secure.running.exo_url,
            "--port",
            str(free_port()),
            "--store-prefix",
            PREFIX,
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bridges_act_write_and_take_over_on_tls_with_a_user(secure: Secure) -> None:
    running = secure.running
    for name in ("b1", "b2"):
        running.start_bridge(name)
    for bridge in running.bridges.values():
        running.wait_answering(bridge)
    acting = running.wait_acting(15)
    seen = acting.health()
    assert seen is not None and seen["store"]["url"] == running.etcd.endpoints
    assert seen["store"]["url"].startswith("etcds://") and seen["store"]["reachable"]
    standby = next(b for b in running.bridges.values() if b is not acting)
    created = http.post(
        f"{standby.url}/deployments", json={"model_id": MODEL, "standby": 0}, timeout=10
    )
    assert created.status_code == 200, created.text
    running.signal(acting, signal.SIGKILL)
    new = running.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 5, not_=acting.name)
    assert new is standby
    listed = http.get(f"{new.url}/deployments", timeout=10).json()["deployments"]
    assert [v["deployment"]["modelCard"]["modelId"] for v in listed] == [MODEL]


def test_plaintext_is_refused_by_that_etcd(secure: Secure) -> None:
    endpoint = secure.running.etcd.members[0].endpoint
    with pytest.raises(httpx.HTTPError):  # etcd drops a plain HTTP request unanswered
        http.post(f"http://{endpoint}/v3/kv/range", json={"key": "YQ=="}, timeout=5)
    refused = bridge_exit(secure, "--store", f"etcd://{endpoint}")
    assert refused.returncode == 2, refused.stderr
    assert "not reachable" in refused.stderr and "etcds://" in refused.stderr


def test_every_wrong_credential_is_exit_2_naming_it(secure: Secure, tmp_path: Path) -> None:
    url = secure.running.etcd.endpoints
    pki = secure.pki
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    cases = {
        "a wrong password": (
            secure.flags(password_file=wrong),
            [f"refused the password of user 'bridge' (--store-password-file {wrong})"],
        ),
        "a certificate of another CA": (
            secure.flags(cert=pki.stranger_cert, key=pki.stranger_key),
            [f"refused the client certificate --store-cert {pki.stranger_cert}"],
        ),
        "a CA that did not sign etcd's": (
            secure.flags(ca=pki.stranger_ca),
            [f"not trusted by --store-ca {pki.stranger_ca}"],
        ),
        "a certificate with a CommonName": (
            secure.flags(cert=pki.named_cert, key=pki.named_key),
            [f"refuses --store-cert {pki.named_cert}", "CommonName"],
        ),
        "no client certificate": (
            ["--store-ca", str(pki.ca), *secure.flags()[6:]],
            ["asks for a client certificate: give --store-cert"],
        ),
        "a missing CA file": (
            secure.flags(ca=tmp_path / "absent.pem"),
            [f"--store-ca {tmp_path / 'absent.pem'}: cannot read it"],
        ),
        "a key that is not a key": (
            secure.flags(key=pki.ca),
            [f"--store-key {pki.ca}: not an unencrypted PEM private key"],
        ),
        "a certificate and a key that do not match": (
            secure.flags(key=pki.stranger_key),
            ["do not go together"],
        ),
    }
    # Each refusal is its own bridge process; they share nothing, so they run at once.
    with ThreadPoolExecutor(4) as pool:
        runs = list(
            pool.map(lambda case: bridge_exit(secure, "--store", url, *case[0]), cases.values())
        )
    for (what, (_, said)), done in zip(cases.items(), runs, strict=True):
        assert done.returncode == 2, (what, done.stderr)
        for words in said:
            assert words in done.stderr, (what, done.stderr)
        assert "Traceback" not in done.stderr, (what, done.stderr)
    leaked = bridge_exit(
        secure, "--store", url.replace("etcds://", "etcds://bridge:hunter2secret@")
    )
    assert leaked.returncode == 2
    assert "--store-user" in leaked.stderr and "hunter2secret" not in leaked.stderr


def test_a_password_changed_under_a_running_bridge_is_named(secure: Secure) -> None:
    running = secure.running
    bridge = running.start_bridge("b1")
    running.wait_answering(bridge)
    running.wait_acting(15)
    # etcd drops the user's tokens when its password changes: the next call renews, and fails.
    running.etcd.etcdctl(
        "user",
        "passwd",
        "bridge",
        "--interactive=false",
        user=f"root:{ROOT_PASSWORD}",
        stdin=("changed-elsewhere\n"),
    )
    said = f"refused the password of user 'bridge' (--store-password-file {secure.password_file})"

    def named() -> str | None:
        seen = bridge.health()
        error = seen["store"]["error"] if seen is not None else None
        return error if error is not None and said in error else None

    wait_for("/healthz to name the refused password", 15, named)
    refused = http.post(
        f"{bridge.url}/deployments", json={"model_id": MODEL, "standby": 0}, timeout=10
    )
    assert refused.status_code == 503 and said in refused.text, refused.text
    assert PASSWORD not in refused.text and PASSWORD not in str(bridge.health())


def test_an_expired_token_is_renewed(secure: Secure) -> None:
    address = parse_store_url(secure.running.etcd.endpoints)
    access = load_access(
        address,
        StoreAccessOptions(
            secure.pki.ca,
            secure.pki.client_cert,
            secure.pki.client_key,
            "bridge",
            secure.password_file,
        ),
    )
    store = EtcdStore(address, "in-test", prefix=PREFIX, access=access)
    store.open()
    first = store._gateway._token  # pyright: ignore[reportPrivateUsage]
    assert first is not None
    # What etcd answers to a token it dropped (idle past --auth-token-ttl, or revoked).
    store._gateway._token = "dropped.1"  # pyright: ignore[reportPrivateUsage]
    (written,) = store.commit_now([DeploymentStandbyChanged(deployment_id="d", standby=1)])
    assert written.idx == store.next_idx - 1
    renewed = store._gateway._token  # pyright: ignore[reportPrivateUsage]
    assert renewed not in (None, "dropped.1")
    store.close()
