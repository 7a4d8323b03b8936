"""``--exo URL[,URL...]`` checked before the bridge starts: each item an http(s) URL with a host,
none twice, none empty.

Apart from ``keeper.bridge.server`` so that ``exo-deploy``'s parser checks the flag (a usage
error, exit 2) without importing the bridge itself (docs/design.md §10, "Start-up").
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from keeper.runtime.starting import MasterStartError

__all__ = ["check_exo_url", "check_exo_urls"]


def check_exo_url(url: str) -> str:
    """The exo URL without a trailing slash; MasterStartError if it is not http(s)://HOST."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise MasterStartError(f"--exo {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise MasterStartError(f"--exo {url!r} is not exo's API URL (expected http://HOST:PORT)")
    return url.rstrip("/")


def check_exo_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """``--exo URL[,URL...]`` as checked URLs, in order; MasterStartError naming the bad item."""
    items = [item.strip() for item in urls.split(",")] if isinstance(urls, str) else list(urls)
    if not any(items):
        raise MasterStartError("--exo: no URL given (expected http://HOST:PORT[,http://...])")
    checked: list[str] = []
    for position, item in enumerate(items, start=1):
        if not item:
            raise MasterStartError(
                f"--exo {','.join(items)!r}: item {position} is empty (a stray comma?)"
            )
        url = check_exo_url(item)
        if url in checked:
            raise MasterStartError(f"--exo lists {url} twice")
        checked.append(url)
    return tuple(checked)
