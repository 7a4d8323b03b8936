"""How the bridge reaches etcd: the store's address, TLS and etcd's user, all checked at start.

A production etcd speaks TLS, asks each client for a certificate its CA signed
(``--client-cert-auth``) and often has users with roles besides (docs/design.md §6.7). The
bridge's side of that is here, apart from the store's records (``keeper.bridge.etcd_store``) and
the calls (``keeper.bridge.etcd_gateway``), because it is read once, at start, and everything
wrong with it is a usage error (exit 2) naming the flag and the file:

- ``--store etcd://`` is plaintext, ``etcds://`` is TLS; ``--store-ca``, ``--store-cert`` and
  ``--store-key`` only make sense with TLS, a certificate only with its key.
- ``--store-user`` with ``--store-password-file``, and only over TLS: etcd's authenticate call
  carries the password in clear, so over ``etcd://`` anyone on the path would read it.
- Credentials inside the URL (``etcd://user:pw@host``) are refused without being echoed: the URL
  is shown in ``/healthz``, in the log and in every refusal, a password must never be.

Each file is read and parsed here (the certificate, the key, whether they match, the CA), so a
missing, unreadable or malformed one is named before the bridge starts rather than surfacing as
an SSL error at the first call.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from keeper.runtime.starting import MasterStartError

log = logging.getLogger(__name__)

PLAIN_SCHEME = "etcd://"
TLS_SCHEME = "etcds://"
# A password file is one line; anything much longer is the wrong file (a key, a log).
MAX_PASSWORD_BYTES = 4096
# Permission bits that let others than the owner read a secret (ssh refuses a key with them).
SHARED_BITS = 0o077


@dataclass(frozen=True)
class StoreAddress:
    endpoints: tuple[str, ...]  # HOST:PORT, in order
    tls: bool = False

    @property
    def url(self) -> str:
        """The store as it is shown (``/healthz``, the log, refusals): never any credential."""
        return (TLS_SCHEME if self.tls else PLAIN_SCHEME) + ",".join(self.endpoints)

    def http_url(self, endpoint: str, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://{endpoint}{path}"


def parse_store_url(value: str) -> StoreAddress:
    """``etcd://`` or ``etcds://HOST:PORT[,HOST:PORT...]``; MasterStartError (exit 2) naming
    what is wrong. A URL with credentials is refused without repeating it."""
    if "@" in value:
        raise MasterStartError(
            "--store: credentials in the URL are refused (the URL is shown in /healthz, the log "
            "and errors); give --store-user NAME and --store-password-file FILE instead"
        )
    if value.startswith(TLS_SCHEME):
        tls, rest = True, value.removeprefix(TLS_SCHEME)
    elif value.startswith(PLAIN_SCHEME):
        tls, rest = False, value.removeprefix(PLAIN_SCHEME)
    else:
        raise MasterStartError(
            f"--store {value!r}: expected etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS)"
        )
    endpoints: list[str] = []
    for item in rest.rstrip("/").split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise MasterStartError(f"--store {value!r}: {item!r} is not HOST:PORT")
        endpoints.append(f"{host}:{int(port)}")
    return StoreAddress(tuple(endpoints), tls)


@dataclass(frozen=True)
class StoreAccessOptions:
    """The access flags as given: ``--store-ca``, ``--store-cert``, ``--store-key``,
    ``--store-user``, ``--store-password-file``."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    user: str | None = None
    password_file: Path | None = None


@dataclass(frozen=True)
class StoreAccess:
    """What the gateway needs: the TLS context (None for ``etcd://``) and etcd's user."""

    options: StoreAccessOptions = StoreAccessOptions()
    tls: ssl.SSLContext | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def user(self) -> str | None:
        return self.options.user


def check_access_options(address: StoreAddress, options: StoreAccessOptions) -> None:
    """The flags' combinations (module doc); MasterStartError naming the first that is wrong."""
    if not address.tls:
        for flag, given in (
            ("--store-ca", options.ca),
            ("--store-cert", options.cert),
            ("--store-key", options.key),
        ):
            if given is not None:
                raise MasterStartError(
                    f"{flag} needs a TLS store: --store {address.url} is plaintext "
                    f"(use {TLS_SCHEME}HOST:PORT)"
                )
        if options.user is not None:
            raise MasterStartError(
                f"--store-user over plaintext --store {address.url} would send the password "
                f"in clear: use {TLS_SCHEME}HOST:PORT"
            )
    if (options.cert is None) != (options.key is None):
        raise MasterStartError("--store-cert and --store-key go together (a certificate, its key)")
    if (options.user is None) != (options.password_file is None):
        raise MasterStartError("--store-user and --store-password-file go together")
    if options.user is not None and not options.user.strip():
        raise MasterStartError("--store-user: empty name")


def _read(flag: str, path: Path, limit: int | None = None) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1 if limit is not None else -1)
    except OSError as exc:
        raise MasterStartError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    if limit is not None and len(data) > limit:
        raise MasterStartError(f"{flag} {path}: longer than {limit} bytes, not a password file")
    return data


def _warn_if_shared(flag: str, path: Path) -> None:
    mode = path.stat().st_mode
    if mode & SHARED_BITS:
        log.warning(
            "%s %s is readable by others than its owner (mode %o): chmod 600 it",
            flag,
            path,
            mode & 0o777,
        )


# cryptography is imported by the two checks below, not above: only a bridge given TLS files
# calls them, and every bridge imports this module (about 60 ms of CPU at each start;
# docs/design.md §10, "Start-up").


def _check_cert(flag: str, path: Path) -> None:
    from cryptography import x509  # noqa: PLC0415 (see above)

    try:
        x509.load_pem_x509_certificates(_read(flag, path))
    except ValueError:
        raise MasterStartError(f"{flag} {path}: not a PEM certificate") from None


def _check_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 (as in _check_cert)

    try:
        serialization.load_pem_private_key(_read("--store-key", path), password=None)
    except (ValueError, TypeError):
        raise MasterStartError(f"--store-key {path}: not an unencrypted PEM private key") from None


def _tls_context(options: StoreAccessOptions) -> ssl.SSLContext:
    if options.ca is not None:
        _check_cert("--store-ca", options.ca)
    try:
        context = ssl.create_default_context(
            cafile=str(options.ca) if options.ca is not None else None
        )
    except ssl.SSLError as exc:
        raise MasterStartError(f"--store-ca {options.ca}: not usable ({exc})") from None
    if options.cert is not None and options.key is not None:
        _check_cert("--store-cert", options.cert)
        _check_key(options.key)
        _warn_if_shared("--store-key", options.key)
        try:
            context.load_cert_chain(str(options.cert), str(options.key))
        except ssl.SSLError as exc:
            raise MasterStartError(
                f"--store-cert {options.cert} and --store-key {options.key} do not go together "
                f"({exc.reason or exc})"
            ) from None
    return context


def _password(path: Path) -> str:
    raw = _read("--store-password-file", path, MAX_PASSWORD_BYTES)
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise MasterStartError(f"--store-password-file {path}: not UTF-8 text") from None
    if not text:
        raise MasterStartError(f"--store-password-file {path}: empty")
    _warn_if_shared("--store-password-file", path)
    return text


def load_access(address: StoreAddress, options: StoreAccessOptions) -> StoreAccess:
    """The checked flags with their files read; MasterStartError (exit 2) naming what is wrong."""
    check_access_options(address, options)
    tls = _tls_context(options) if address.tls else None
    password = _password(options.password_file) if options.password_file is not None else None
    return StoreAccess(options, tls, password)
