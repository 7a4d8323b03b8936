"""The store's access flags read as the bridge reads them (``keeper.bridge.etcd_access``), and
etcd's refusals put in words (``keeper.bridge.etcd_gateway``): each wrong combination or file is
a usage error naming the flag, a URL with credentials is refused without repeating them, and a
failed append's answer tells whether an earlier try landed (``keeper.bridge.etcd_store.landed``)."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import httpx
import pytest

from keeper.bridge.etcd_access import (
    StoreAccess,
    StoreAccessOptions,
    StoreAddress,
    check_access_options,
    load_access,
    parse_store_url,
)
from keeper.bridge.etcd_gateway import AUTHENTICATE_TIMEOUT_S, answer_refusal, failure_words
from keeper.bridge.etcd_store import STARTUP_TIMEOUT_S, EtcdStore, landed
from keeper.runtime.starting import MasterStartError

TLS = parse_store_url("etcds://a:2379,b:2379")
PLAIN = parse_store_url("etcd://a:2379")


def test_tls_scheme_and_url_shown() -> None:
    assert TLS.tls and TLS.url == "etcds://a:2379,b:2379"
    assert TLS.http_url("a:2379", "/v3/kv/range") == "https://a:2379/v3/kv/range"
    assert not PLAIN.tls and PLAIN.http_url("a:2379", "/x") == "http://a:2379/x"


@pytest.mark.parametrize(
    "value", ["etcd://bridge:s3cret-pw@a:2379", "etcds://a:2379,bridge:s3cret-pw@b:2379"]
)
def test_credentials_in_the_url_are_refused_and_never_echoed(value: str) -> None:
    with pytest.raises(MasterStartError) as raised:
        parse_store_url(value)
    assert "--store-user" in str(raised.value) and "--store-password-file" in str(raised.value)
    assert "s3cret-pw" not in str(raised.value) and "bridge" not in str(raised.value)


@pytest.mark.parametrize(
    ("address", "options", "said"),
    [
        (PLAIN, StoreAccessOptions(ca=Path("ca.pem")), "--store-ca needs a TLS store"),
        (PLAIN, StoreAccessOptions(cert=Path("c"), key=Path("k")), "--store-cert needs a TLS"),
        (PLAIN, StoreAccessOptions(key=Path("k")), "--store-key needs a TLS"),
        (
            PLAIN,
            StoreAccessOptions(user="u", password_file=Path("p")),
            "password in clear",
        ),
        (TLS, StoreAccessOptions(cert=Path("c")), "--store-cert and --store-key go together"),
        (TLS, StoreAccessOptions(key=Path("k")), "--store-cert and --store-key go together"),
        (TLS, StoreAccessOptions(user="u"), "--store-user and --store-password-file"),
        (TLS, StoreAccessOptions(password_file=Path("p")), "--store-user and --store-password"),
        (TLS, StoreAccessOptions(user=" ", password_file=Path("p")), "--store-user: empty"),
    ],
)
def test_combinations_refused(
    address: StoreAddress, options: StoreAccessOptions, said: str
) -> None:
    with pytest.raises(MasterStartError, match=said):
        check_access_options(address, options)


def test_good_combinations_pass() -> None:
    check_access_options(PLAIN, StoreAccessOptions())
    check_access_options(TLS, StoreAccessOptions())
    check_access_options(TLS, StoreAccessOptions(Path("a"), Path("c"), Path("k"), "u", Path("p")))


@pytest.mark.parametrize(
    ("content", "said"),
    [("", "empty"), ("\n", "empty"), ("x" * 5000, "longer than 4096 bytes")],
)
def test_a_bad_password_file_is_named(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "pw"
    path.write_text(content)
    with pytest.raises(MasterStartError, match=f"--store-password-file {path}: {said}"):
        load_access(TLS, StoreAccessOptions(user="u", password_file=path))


def test_a_password_is_one_line_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("pa:ss word\r\n")
    path.chmod(0o600)
    access = load_access(TLS, StoreAccessOptions(user="u", password_file=path))
    assert access.password == "pa:ss word" and access.user == "u"
    assert "pa:ss" not in repr(access)


def test_an_unreadable_or_malformed_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(MasterStartError, match=r"--store-ca .*absent\.pem: cannot read it"):
        load_access(TLS, StoreAccessOptions(ca=tmp_path / "absent.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(MasterStartError, match=f"--store-ca {junk}: not a PEM certificate"):
        load_access(TLS, StoreAccessOptions(ca=junk))


WITH_USER = StoreAccess(StoreAccessOptions(user="bridge", password_file=Path("/etc/pw")))


@pytest.mark.parametrize(
    ("status", "text", "said"),
    [
        (
            400,
            "etcdserver: authentication failed, invalid user ID or password",
            "refused the password of user 'bridge' (--store-password-file /etc/pw)",
        ),
        (400, "etcdserver: user name is empty", "give --store-user NAME"),
        (403, "etcdserver: permission denied", "its role needs readwrite on the --store-prefix"),
        (401, "etcdserver: invalid auth token", "refused the token of user 'bridge'"),
        (400, "CommonName of client sending a request against gateway", "CommonName"),
    ],
)
def test_refusals_in_words(status: int, text: str, said: str) -> None:
    words = answer_refusal(status, text, WITH_USER)
    assert words is not None and said in words


def test_other_answers_are_no_refusal() -> None:
    assert answer_refusal(503, "etcdserver: request timed out", WITH_USER) is None
    assert answer_refusal(400, "etcdserver: too many operations in txn request", WITH_USER) is None


@pytest.mark.parametrize(
    "error",
    [httpx.RemoteProtocolError("closed unanswered"), httpx.ReadError("connection reset")],
)
def test_a_plaintext_request_dropped_or_reset_hints_at_tls(error: httpx.HTTPError) -> None:
    """A TLS etcd closes a plaintext connection unanswered; whether the client sees that as a
    close or a reset is timing alone, so both carry the hint."""
    words = failure_words(error, StoreAccess())
    assert words == f"{type(error).__name__} (a TLS etcd? then --store etcds://)"


def test_no_tls_hint_for_a_refused_connection_or_on_tls() -> None:
    assert failure_words(httpx.ConnectError("refused"), StoreAccess()) == "ConnectError"
    on_tls = StoreAccess(tls=ssl.create_default_context())
    assert failure_words(httpx.ReadError("connection reset"), on_tls) == "ReadError"


def _failed_answer(value: str | None) -> dict[str, object]:
    kvs = [] if value is None else [{"value": base64.b64encode(value.encode()).decode()}]
    return {"succeeded": False, "responses": [{"response_range": {"kvs": kvs}}]}


def test_landed_only_when_the_first_key_holds_our_value() -> None:
    assert landed(_failed_answer('{"idx":3}'), '{"idx":3}')
    assert not landed(_failed_answer('{"idx":3,"other":1}'), '{"idx":3}')
    assert not landed(_failed_answer(None), '{"idx":3}')
    assert not landed({"succeeded": False}, '{"idx":3}')
    assert not landed({"succeeded": False, "responses": []}, '{"idx":3}')


def test_the_first_read_and_the_password_check_wait_longer_than_a_lease_renewal() -> None:
    # A bridge starting beside a busy etcd: its first answers (a TLS handshake, bcrypt) may take
    # over a second, which the lease's short timeout (0.5 s for a 2 s lease) would call a dead
    # store, and the bridge would exit 2.
    waits: list[tuple[str, float | None]] = []

    def etcd(request: httpx.Request) -> httpx.Response:
        waits.append((request.url.path, request.extensions["timeout"]["read"]))
        if request.url.path == "/v3/auth/authenticate":
            return httpx.Response(200, json={"token": "t"})
        if request.url.path == "/v3/kv/txn":
            return httpx.Response(200, json={"succeeded": True, "header": {"revision": "2"}})
        return httpx.Response(200, json={"kvs": [], "header": {"revision": "1"}})

    access = StoreAccess(StoreAccessOptions(user="bridge"), password="pw")
    store = EtcdStore(PLAIN, "b1", lease_s=2.0, access=access)
    store._gateway._client = httpx.Client(transport=httpx.MockTransport(etcd))  # pyright: ignore[reportPrivateUsage]
    store.open(["node-a"])
    assert [path for path, _ in waits] == [
        "/v3/auth/authenticate",
        "/v3/kv/range",  # the log
        "/v3/kv/range",  # no log yet: the snapshot
        "/v3/kv/range",  # the prefix's exo cluster
        "/v3/kv/txn",  # recorded
    ]
    assert [wait for _, wait in waits] == [STARTUP_TIMEOUT_S] * 5
    waits.clear()
    store._gateway._token = None  # pyright: ignore[reportPrivateUsage]
    store._gateway.range("/x")  # pyright: ignore[reportPrivateUsage]
    assert waits == [("/v3/auth/authenticate", AUTHENTICATE_TIMEOUT_S), ("/v3/kv/range", 0.5)]
