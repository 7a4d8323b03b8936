"""etcd's v3 JSON gateway, as the bridge calls it: each endpoint in turn, TLS, etcd's user.

One ``Gateway`` per store, shared by the command path (the event loop's thread) and the lease
loop (a worker thread). What it adds to a POST:

- **Which endpoint.** The one that answered last first, then the others in order.
- **TLS** with the context ``keeper.bridge.etcd_access`` built (the CA, the client certificate).
- **etcd's user.** The token of ``/v3/auth/authenticate`` in the ``Authorization`` header. etcd
  drops a simple token after five idle minutes and a JWT at its expiry, and says so with a 401
  (``invalid auth token``): the gateway authenticates again, once, and sends the call again, which
  is safe because a 401 is answered before anything is done. One lock, so two threads seeing the
  401 at once authenticate once.
- **Why it failed, in words.** A refusal of who the bridge is (the certificate, the CA, the
  password, a role without the prefix) names the flag and the file (``EtcdUnavailableError`` with
  ``refused``), because the operator's fix is there, not in etcd's health. A failure after the
  request may have been sent (a read timeout, a dropped connection, etcd's own ``request timed
  out``) is flagged ``maybe_sent``: a write's outcome is then unknown (docs/design.md §8.5,
  "Unknown is said as unknown"), unlike a connection never made.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

import httpx

from keeper.bridge.etcd_access import StoreAccess, StoreAddress

# One request to a store member on the LAN answers in milliseconds; a second means it is gone.
REQUEST_TIMEOUT_S = 1.0
# etcd checks a password with bcrypt, slow by design: about 0.1 s of a core, over a second on a
# busy machine. The token it gives serves for minutes, so this one answer is worth the wait that
# a lease renewal's is not.
AUTHENTICATE_TIMEOUT_S = 5.0
# How much of etcd's error body goes into a refusal's words: its message is one line.
ERROR_CHARS = 160


class EtcdUnavailableError(Exception):
    """No endpoint did the call. ``maybe_sent``: one may have received it (a write's outcome is
    unknown); ``refused``: an endpoint refused this bridge's credentials (named in the message)."""

    def __init__(self, message: str, *, maybe_sent: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.maybe_sent = maybe_sent
        self.refused = refused


def _body_text(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text.strip()[:ERROR_CHARS]
    if isinstance(body, dict):
        message = cast(dict[str, Any], body).get("message") or cast(dict[str, Any], body).get(
            "error"
        )
        if isinstance(message, str):
            return message[:ERROR_CHARS]
    return answer.text.strip()[:ERROR_CHARS]


def answer_refusal(status: int, text: str, options: StoreAccess) -> str | None:
    """Why etcd refused this bridge's credentials, naming the flag to fix; None if it did not."""
    user = options.user
    password_file = options.options.password_file
    cert = options.options.cert
    if "CommonName of client" in text:
        return (
            f"etcd's JSON gateway refuses --store-cert {cert}: with auth enabled it takes no "
            "client certificate with a CommonName; issue one without (docs/bridge.md)"
        )
    if "authentication failed" in text:
        return f"etcd refused the password of user {user!r} (--store-password-file {password_file})"
    if "user name is empty" in text:
        return "etcd has auth enabled: give --store-user NAME and --store-password-file FILE"
    if status == 403 or "permission denied" in text:
        who = f"user {user!r}" if user else "this bridge"
        return f"etcd denied {who} ({text}): its role needs readwrite on the --store-prefix"
    if status == 401:
        return f"etcd refused the token of user {user!r} ({text})"
    if "authentication is not enabled" in text:
        return f"etcd has no auth enabled: drop --store-user {user!r} and --store-password-file"
    return None


def transport_refusal(error: httpx.HTTPError, options: StoreAccess) -> str | None:
    """Why a TLS handshake failed, naming the flag to fix; None for a plain network failure."""
    text = str(error)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        ca = options.options.ca
        source = f"--store-ca {ca}" if ca is not None else "the system's CAs (give --store-ca)"
        return f"etcd's certificate is not trusted by {source}: {text}"
    if "ALERT" in text.upper() and ("CERTIFICATE" in text.upper() or "UNKNOWN_CA" in text.upper()):
        cert = options.options.cert
        if cert is None:
            return "etcd asks for a client certificate: give --store-cert FILE and --store-key FILE"
        return f"etcd refused the client certificate --store-cert {cert}: {text}"
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        return "etcd does not speak TLS there: use --store etcd://"
    return None


# How a TLS listener's refusal of plaintext reaches the client: the connection closed with no
# answer (RemoteProtocolError), or reset (ReadError) when the close finds part of the request
# still unread in etcd's buffer, which depends on timing alone (design.md, "etcd as production
# runs it").
_DROPPED_UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError)


def failure_words(error: httpx.HTTPError, access: StoreAccess) -> str:
    """A transport failure in words: the refusal if it is one, else its type (with a hint when
    a plaintext request was dropped unanswered or reset, as a TLS etcd does)."""
    why = transport_refusal(error, access)
    if why is not None:
        return why
    if access.tls is None and isinstance(error, _DROPPED_UNANSWERED):
        return f"{type(error).__name__} (a TLS etcd? then --store etcds://)"
    return type(error).__name__


# Failures that prove the request never left: the connection was not made.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class Gateway:
    """etcd's v3 JSON gateway on each endpoint, tried in order (the first that answers)."""

    def __init__(
        self,
        address: StoreAddress,
        timeout_s: float = REQUEST_TIMEOUT_S,
        access: StoreAccess | None = None,
    ) -> None:
        self.address = address
        self.access = access if access is not None else StoreAccess()
        self._timeout = timeout_s
        self._client = httpx.Client(
            trust_env=False,
            timeout=timeout_s,
            verify=self.access.tls if self.access.tls is not None else True,
        )
        self._preferred = 0
        self._token: str | None = None
        self._auth_lock = threading.Lock()

    @property
    def verify(self) -> Any:
        """What an httpx client of this store verifies with (the watch's, ``keeper.bridge.
        etcd_store``)."""
        return self.access.tls if self.access.tls is not None else True

    def _order(self) -> list[str]:
        points = list(self.address.endpoints)
        return points[self._preferred :] + points[: self._preferred]

    def headers(self, timeout_s: float | None = None) -> dict[str, str]:
        """The ``Authorization`` header with etcd's token, authenticating first if need be."""
        if self.access.user is None:
            return {}
        token = self._token
        if token is None:
            token = self._authenticate(None, timeout_s)
        return {"Authorization": token}

    def _authenticate(self, stale: str | None, timeout_s: float | None) -> str:
        """A fresh token, unless another thread already replaced ``stale``."""
        with self._auth_lock:
            if self._token is not None and self._token != stale:
                return self._token
            self._token = None
            answer = self._post_any(
                "/v3/auth/authenticate",
                {"name": self.access.user, "password": self.access.password},
                max(timeout_s or self._timeout, AUTHENTICATE_TIMEOUT_S),
                authenticated=False,
            )
            token = answer.get("token")
            if not isinstance(token, str) or not token:
                raise EtcdUnavailableError("etcd's authenticate answer holds no token")
            self._token = token
            return token

    def call(self, path: str, body: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        return self._post_any(path, body, timeout_s, authenticated=True)

    def _post_any(
        self,
        path: str,
        body: Mapping[str, Any],
        timeout_s: float | None,
        *,
        authenticated: bool,
    ) -> Any:
        errors: list[str] = []
        maybe_sent = False
        refused = False
        for offset, endpoint in enumerate(self._order()):
            renewed = False
            while True:
                headers = self.headers(timeout_s) if authenticated else {}
                try:
                    answer = self._client.post(
                        self.address.http_url(endpoint, path),
                        json=body,
                        headers=headers,
                        timeout=timeout_s if timeout_s is not None else self._timeout,
                    )
                except httpx.HTTPError as exc:
                    why = transport_refusal(exc, self.access)
                    refused = refused or why is not None
                    maybe_sent = maybe_sent or not isinstance(exc, _NOT_SENT)
                    errors.append(f"{endpoint}: {failure_words(exc, self.access)}")
                    break
                if answer.status_code == 200:
                    self._preferred = (self._preferred + offset) % len(self.address.endpoints)
                    return answer.json()
                text = _body_text(answer)
                if (
                    answer.status_code == 401
                    and authenticated
                    and not renewed
                    and "Authorization" in headers
                ):
                    renewed = True
                    self._authenticate(headers["Authorization"], timeout_s)
                    continue
                why = answer_refusal(answer.status_code, text, self.access)
                refused = refused or why is not None
                # etcd's own 5xx (request timed out, leader changed) may follow a proposal.
                maybe_sent = maybe_sent or answer.status_code >= 500
                errors.append(f"{endpoint}: {why or f'{answer.status_code} {text}'}")
                break
        raise EtcdUnavailableError("; ".join(errors), maybe_sent=maybe_sent, refused=refused)

    def close(self) -> None:
        self._client.close()

    # --- key-value calls ----------------------------------------------------------------------

    def range(
        self, key: str, end: str | None = None, timeout_s: float | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        body: dict[str, Any] = {"key": b64(key)}
        if end is not None:
            body["range_end"] = b64(end)
        answer = self.call("/v3/kv/range", body, timeout_s)
        return cast(list[dict[str, Any]], answer.get("kvs", [])), int(answer["header"]["revision"])

    def txn(
        self,
        compare: Sequence[Mapping[str, Any]],
        success: Sequence[Mapping[str, Any]],
        failure: Sequence[Mapping[str, Any]] = (),
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            self.call(
                "/v3/kv/txn",
                {"compare": list(compare), "success": list(success), "failure": list(failure)},
                timeout_s,
            ),
        )


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()
