"""A node id is an ed25519 key's libp2p peer id, and only that key's signature proves it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from keeper.sim.link.identity import (
    KeyFileError,
    NodeKey,
    default_key_file,
    hello_refusal,
    load_or_create_key,
    new_challenge,
    peer_id,
    public_key_of,
)


def test_ids_have_libp2ps_ed25519_form_and_carry_their_key() -> None:
    key = NodeKey.generate()
    assert key.node_id.startswith("12D3KooW") and len(key.node_id) == 52
    public = public_key_of(key.node_id)
    assert isinstance(public, bytes) and peer_id(public) == key.node_id
    assert NodeKey.for_name("studio").node_id == NodeKey.for_name("studio").node_id
    assert NodeKey.for_name("studio").node_id != NodeKey.for_name("mini").node_id


def test_only_the_ids_own_key_over_this_challenge_proves_it() -> None:
    key, other = NodeKey.generate(), NodeKey.generate()
    challenge = new_challenge()
    assert hello_refusal(key.node_id, challenge, key.sign_hello(challenge)) is None
    refusal = hello_refusal(key.node_id, challenge, other.sign_hello(challenge))
    assert refusal is not None and "not signed by its key" in refusal
    # A signature for another challenge (a replayed Hello) proves nothing.
    assert hello_refusal(key.node_id, challenge, key.sign_hello(new_challenge())) is not None
    assert hello_refusal(key.node_id, challenge, "zz") == "the signature is not hex"


@pytest.mark.parametrize(
    ("node_id", "why"),
    [
        ("3c018300-0485-4175-ad91-d7a662574ccb", "not base58"),
        ("12D3KooW", "not the peer id of an ed25519 key"),
        ("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "not the peer id of an ed25519 key"),
    ],
)
def test_an_id_that_holds_no_key_cannot_be_proven(node_id: str, why: str) -> None:
    refusal = hello_refusal(node_id, new_challenge(), "00" * 64)
    assert refusal is not None and why in refusal


def test_a_key_file_is_made_owner_only_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "studio.key"
    made = load_or_create_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(path).node_id == made.node_id


@pytest.mark.parametrize(
    ("content", "why"), [("not hex\n", "is not hex"), ("abcd\n", "holds 2 bytes")]
)
def test_a_bad_key_file_is_named_not_replaced(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "node.key"
    path.write_text(content)
    with pytest.raises(KeyFileError, match=why) as refused:
        load_or_create_key(path)
    assert str(path) in str(refused.value)
    assert path.read_text() == content


def test_the_default_key_file_is_per_name_in_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_key_file("studio") == tmp_path / "exo-deploy" / "nodes" / "studio.key"


@pytest.mark.parametrize("name", ["../../etc", "", ".."])
def test_a_name_that_is_no_file_name_asks_for_a_key_file(name: str) -> None:
    with pytest.raises(KeyFileError, match="--key-file"):
        default_key_file(name)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o644, 0o666])
def test_a_key_file_open_to_group_or_others_is_refused_naming_file_and_mode(
    tmp_path: Path, mode: int
) -> None:
    """As ssh refuses a private key others can read: the key is the node's identity."""
    path = tmp_path / "node.key"
    made = load_or_create_key(path)
    path.chmod(mode)
    with pytest.raises(KeyFileError) as refused:
        load_or_create_key(path)
    assert str(refused.value) == (
        f"node key file {path} is open to group or others (mode {mode:04o}); it must be the "
        f"owner's alone: chmod 600 {path}"
    )
    path.chmod(0o400)  # the owner's alone, even read-only: fine
    assert load_or_create_key(path).node_id == made.node_id
