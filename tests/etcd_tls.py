"""A throwaway certificate authority for the TLS etcd tests and the store bench.

A production etcd speaks TLS and asks every client for a certificate its CA signed
(``--client-cert-auth``); the tests start one like it (``keeper.sim.cluster.etcd_members.EtcdTls``)
and need the files it and the bridge read: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, and a second CA with a client certificate of its own, which
that etcd must refuse. ``cryptography`` (already a dependency, for the node keys) makes them in
milliseconds; EC P-256 keys, as a modern etcd deployment would use.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any test run, short enough that a leaked file is worthless soon.
VALID_DAYS = 2


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA etcd trusts and the bridge checks etcd's certificate with
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by ``ca``: etcd lets it in
    client_key: Path
    stranger_ca: Path  # another CA
    stranger_cert: Path  # signed by ``stranger_ca``: etcd refuses it
    stranger_key: Path
    named_cert: Path  # signed by ``ca`` with a CommonName: the gateway refuses it under auth
    named_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)] if common else [])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _authority(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    name: str,
    common: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    server: bool,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(issuer[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server:
        # etcd's server certificate also serves its members' own client connections.
        usage.append(ExtendedKeyUsageOID.SERVER_AUTH)
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
    else:
        names = [x509.DNSName(name)]
    builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=not common)
    builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer[1], hashes.SHA256()), key


def make_pki(folder: Path) -> Pki:
    """A CA, etcd's server certificate, a client certificate, and a stranger's, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _authority("exo-deploy test etcd CA")
    stranger_ca = _authority("someone else's CA")
    files = Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server-key.pem",
        client_cert=folder / "client.pem",
        client_key=folder / "client-key.pem",
        stranger_ca=folder / "stranger-ca.pem",
        stranger_cert=folder / "stranger.pem",
        stranger_key=folder / "stranger-key.pem",
        named_cert=folder / "named.pem",
        named_key=folder / "named-key.pem",
    )
    _write_cert(files.ca, ca[0])
    _write_cert(files.stranger_ca, stranger_ca[0])
    for cert_path, key_path, made in (
        (files.server_cert, files.server_key, _leaf("etcd", "etcd", ca, server=True)),
        # No CommonName: with auth enabled, etcd's JSON gateway refuses a client certificate
        # that has one (it would not be the user; docs/design.md §8.5).
        (files.client_cert, files.client_key, _leaf("exo-deploy-bridge", "", ca, server=False)),
        (files.stranger_cert, files.stranger_key, _leaf("stranger", "", stranger_ca, server=False)),
        (files.named_cert, files.named_key, _leaf("named", "named", ca, server=False)),
    ):
        _write_cert(cert_path, made[0])
        _write_key(key_path, made[1])
    return files
