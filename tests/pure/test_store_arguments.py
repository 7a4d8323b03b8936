"""``--store`` and ``--store-prefix`` read as the bridge reads them: a usage error (exit 2) names
what is wrong, and a good value comes back as the endpoints in order."""

from __future__ import annotations

import pytest

from keeper.bridge.etcd_store import check_prefix, parse_store_url
from keeper.runtime.starting import MasterStartError


def test_endpoints_in_order() -> None:
    address = parse_store_url("etcd://studio.local:2379, mini:2379,10.0.0.3:12379")
    assert address.endpoints == ("studio.local:2379", "mini:2379", "10.0.0.3:12379")
    assert address.url == "etcd://studio.local:2379,mini:2379,10.0.0.3:12379"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("http://studio:2379", "expected etcd://HOST:PORT"),
        ("etcd://studio", "'studio' is not HOST:PORT"),
        ("etcd://studio:99999", "is not HOST:PORT"),
        ("etcd://studio:2379,", "'' is not HOST:PORT"),
        ("etcd://:2379", "is not HOST:PORT"),
    ],
)
def test_a_bad_store_url_is_named(value: str, said: str) -> None:
    with pytest.raises(MasterStartError, match=said):
        parse_store_url(value)


@pytest.mark.parametrize("prefix", ["exo/", "/exo", "/", ""])
def test_a_prefix_needs_slashes_both_ends(prefix: str) -> None:
    with pytest.raises(MasterStartError, match="--store-prefix"):
        check_prefix(prefix)
    assert check_prefix("/exo-deploy/") == "/exo-deploy/"
