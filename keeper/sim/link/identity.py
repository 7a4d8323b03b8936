"""Node identity: a node id *is* an ed25519 public key, and a node proves it by signing.

exo's node ids are libp2p peer ids: the base58 text of an identity multihash of the node's
ed25519 public key (which is why every one begins ``12D3KooW``). Ours are made the same way, so
the id alone carries the key that checks it: the master needs no table of keys, and a node that
keeps its key (``load_or_create_key``) is the same node after a restart. At ``Hello`` the node
signs the master's fresh challenge together with the id it claims (``hello_payload``); the
master checks the signature with the key inside that id (``hello_refusal``). A peer that knows a
node's id but not its key cannot be that node.

Simulated nodes in one process (tests, the demo, the virtual soak) derive their key from their
name (``NodeKey.for_name``), so their ids are stable and readable in fixtures. Anyone who knows
the name can derive that key: such keys identify a simulation, they do not protect one. A node
process keeps a random key in a file instead.

The encoding is libp2p's, written out here because it is three fixed byte prefixes: the
protobuf ``PublicKey`` message (field 1 KeyType = 1 Ed25519, field 2 Data = 32 bytes) inside an
identity multihash (code 0x00, length 36).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

# protobuf PublicKey{Type: Ed25519 (field 1, varint 1), Data: (field 2, 32 bytes)}'s header.
_PROTOBUF_ED25519 = bytes([0x08, 0x01, 0x12, 0x20])
# Identity multihash (code 0x00) of the 36-byte protobuf message above.
_IDENTITY_MULTIHASH = bytes([0x00, 0x24])
_PEER_ID_PREFIX = _IDENTITY_MULTIHASH + _PROTOBUF_ED25519
_KEY_BYTES = 32
# The permission bits a node key file may not have: any for the group or others (ssh's rule for
# a private key). Read or write, either lets another user be, or unmake, the node.
_OTHERS_BITS = 0o077
# What a node signs is tagged with what it is for, so a signature made here can never be
# replayed as anything else, and carries the version of this handshake.
_HELLO_CONTEXT = b"exo-deploy node hello v1\0"
# A fresh challenge per connection: 32 random bytes, as hex in the protocol's JSON.
CHALLENGE_BYTES = 32
# What a simulated node's key is derived from besides its name (``NodeKey.for_name``).
_SIMULATED_KEY_CONTEXT = b"exo-deploy simulated node key\0"


def peer_id(public_key: bytes) -> str:
    """The libp2p peer id of a raw 32-byte ed25519 public key."""
    if len(public_key) != _KEY_BYTES:
        raise ValueError(f"an ed25519 public key is {_KEY_BYTES} bytes, not {len(public_key)}")
    return base58.b58encode(_PEER_ID_PREFIX + public_key).decode()


def public_key_of(node_id: str) -> bytes | str:
    """The raw ed25519 public key inside a peer id, or why the id holds none."""
    try:
        raw = base58.b58decode(node_id.encode())
    except ValueError:
        return "it is not base58 text"
    if len(raw) != len(_PEER_ID_PREFIX) + _KEY_BYTES or not raw.startswith(_PEER_ID_PREFIX):
        return "it is not the peer id of an ed25519 key (libp2p's 12D3KooW... form)"
    return raw[len(_PEER_ID_PREFIX) :]


def new_challenge() -> str:
    return secrets.token_hex(CHALLENGE_BYTES)


def hello_payload(challenge: str, node_id: str) -> bytes:
    """What a node signs at Hello: the master's challenge and the id it claims."""
    return _HELLO_CONTEXT + challenge.encode() + b"\0" + node_id.encode()


def hello_refusal(node_id: str, challenge: str, signature_hex: str) -> str | None:
    """Why a Hello does not prove ``node_id`` (None: it does)."""
    key = public_key_of(node_id)
    if isinstance(key, str):
        return f"node id {node_id[:20]!r} cannot be checked: {key}"
    try:
        signature = bytes.fromhex(signature_hex)
    except ValueError:
        return "the signature is not hex"
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, hello_payload(challenge, node_id))
    except InvalidSignature:
        return f"the signature does not prove node {node_id[:20]}...: not signed by its key"
    return None


@dataclass(frozen=True)
class NodeKey:
    """A node's private key and the id it makes."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def for_name(cls, name: str) -> NodeKey:
        """A simulated node's key, derived from its name (known to anyone who knows the name)."""
        seed = hashlib.sha256(_SIMULATED_KEY_CONTEXT + name.encode()).digest()
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_bytes(cls, raw: bytes) -> NodeKey:
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    @property
    def node_id(self) -> str:
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return peer_id(raw)

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign_hello(self, challenge: str) -> str:
        return self.private.sign(hello_payload(challenge, self.node_id)).hex()


class KeyFileError(Exception):
    """A node's key file cannot be used (a message naming the file and why)."""


def default_key_file(name: str) -> Path:
    """Where ``exo-deploy node --name NAME`` keeps its key unless told: the user's state dir
    (XDG), one file per node name, so a node started again under its name is the same node."""
    if not name or "/" in name or name in {".", ".."}:
        raise KeyFileError(f"node name {name!r} cannot name a key file; pass --key-file PATH")
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "exo-deploy" / "nodes" / f"{name}.key"


def load_or_create_key(path: Path) -> NodeKey:
    """The node's key from ``path`` (32 raw bytes, hex), created there (mode 0600) if absent."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        key = NodeKey.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created owner-only from the start: the key is the node's identity.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key.private_bytes().hex() + "\n")
        return key
    except OSError as exc:
        raise KeyFileError(f"cannot read node key file {path}: {exc.strerror or exc}") from None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise KeyFileError(f"node key file {path} is not hex") from None
    if len(raw) != _KEY_BYTES:
        raise KeyFileError(
            f"node key file {path} holds {len(raw)} bytes, not an ed25519 key's {_KEY_BYTES}"
        )
    _check_private(path)
    return NodeKey.from_bytes(raw)


def _check_private(path: Path) -> None:
    """KeyFileError unless only the file's owner may read or write it, as ssh refuses a private
    key others can read (docs/design.md §6.7): a key others could read is another's to prove the
    node's id with, and one they could write lets them make the node someone else."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise KeyFileError(f"cannot read node key file {path}: {exc.strerror or exc}") from None
    if mode & _OTHERS_BITS:
        raise KeyFileError(
            f"node key file {path} is open to group or others (mode {mode:04o}); it must be "
            f"the owner's alone: chmod 600 {path}"
        )
