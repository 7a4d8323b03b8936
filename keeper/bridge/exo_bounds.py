"""How much of exo's answers the bridge reads, and how deeply nested: the limits and the checks.

exo is another system: the bridge reads its answers but must not be taken down by them. Two
things in an answer could: its size (the whole body held in memory, then parsed into objects
several times larger) and its nesting (Python's JSON parser recurses once per level, so an
answer nested about a thousand deep raises ``RecursionError``, not ``ValueError``, from the
parser or from whatever walks the result after it). So each answer is read only up to a size
cap chosen for what it is (``keeper.bridge.exo_client`` streams the body and stops reading at
the cap), and parsed only once a scan of its brackets shows it nested no deeper than
``MAX_DEPTH``. Over either bound the answer is not parsed, and the reason says which, in words;
the caller treats it as any answer it cannot read (exo's State then: nothing is acted on).

The scan is pure and made of C loops over the bytes only (``nesting_depth`` says how): it
costs less than the parse it guards, on exo's States and on the worst a body within the cap
can be.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate, chain, count
from operator import add, sub
from typing import Any

MIB = 2**20

# exo's recorded States (tests/fixtures/exo_recordings) are 4 to 15 KB for three nodes and a
# model or two; a State grows with nodes, instances and each node's downloads, so a large
# cluster's is a few MB. 16 MiB is ample room for that, and bounds what one read may cost.
STATE_MAX_BYTES = 16 * MIB
# exo's model list is 74 KB for 123 models; its placement previews 15 KB for one model on
# three nodes (every sharding, kind and node set). 4 MiB holds thousands of models, or the
# previews of a much larger cluster.
LISTING_MAX_BYTES = 4 * MIB
# Answers to commands and error answers: 56 B to 1.1 KB recorded (27 KB for a 422 echoing the
# whole request). Only their start is ever used beyond a 2xx's small JSON.
COMMAND_MAX_BYTES = 1 * MIB
# exo's recorded answers nest at most 13 levels (a 422 echoing an instance); a State, 11.
# 64 leaves exo room to grow, and keeps whatever walks exo's JSON (the parser, pydantic,
# ``json.dumps`` of the State served on) far below Python's recursion limit of 1,000.
MAX_DEPTH = 64


class OverBoundsError(ValueError):
    """An answer larger or more deeply nested than the bridge reads; ``str()`` says which."""


def too_large(what: str, cap: int, size: int | None = None) -> str:
    """Why an answer over ``cap`` bytes is not read: its ``size`` if exo said it up front."""
    limit = f"{cap // MIB} MiB" if cap % MIB == 0 else f"{cap} bytes"
    if size is None:
        return f"{what} is over the {limit} the bridge reads"
    return f"{what} is {size / 1e6:.1f} MB, over the {limit} the bridge reads"


def parse_json(body: bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """``body`` as JSON. ``OverBoundsError`` if it nests deeper than ``max_depth``, checked
    before parsing; ``ValueError`` if it is not JSON."""
    if nesting_depth(body) > max_depth:
        raise OverBoundsError(f"{what} is nested deeper than {max_depth} levels")
    try:
        return json.loads(body)
    except ValueError:
        raise ValueError(f"{what} is not JSON") from None


# Every byte but the quote and the brackets: what the scan drops once escapes are gone.
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'"[]{}')
# A string with only its brackets left, or one that never ends, which runs to the end: either
# way one match per string, scanned once.
_STRING = re.compile(rb'"[^"]*+"?')
# Opening brackets as the digit 1, closing ones as 0: eight of them make one byte.
_BITS = bytes.maketrans(b"[]{}", b"1010")


def _walk(byte: int) -> tuple[int, int]:
    """The eight brackets of ``byte`` (the first as its highest bit): the change of depth over
    them, and the highest depth reached in them, from 0 before them."""
    depth = peak = 0
    for bit in range(7, -1, -1):
        depth += 1 if byte >> bit & 1 else -1
        peak = max(peak, depth)
    return depth, peak


# What eight brackets do, for each of the 256 ways they can be: the change of depth (plus 8,
# to fit a byte) and the highest depth reached in them.
_CHANGE = bytes(_walk(byte)[0] + 8 for byte in range(256))
_PEAK = bytes(_walk(byte)[1] for byte in range(256))


def nesting_depth(body: bytes) -> int:
    """How deeply ``body``'s arrays and objects nest, brackets inside strings left out (0 for a
    bare value). A bracket never closed counts as one a parser would enter: such a body is not
    JSON, and the depth is at least what a parser would go through before it found that out.

    Each step is one C loop over the bytes: a Python loop over each byte of a State of several MB
    once a second would cost more than the step itself. A bracket is inside a string when an
    odd number of unescaped quotes comes before it. So: the escapes that could pass for a quote
    are dropped (``\\\\`` first, so that in ``\\\\"`` the quote still ends a string, then
    ``\\"``), then every byte but quotes and brackets, then quotes side by side (two fewer quotes
    before every bracket after them: none changes sides). What is left of the strings is those
    holding a bracket, one match each for the regular expression. The brackets left are packed
    eight to a byte, and the depth is summed a byte at a time from what each byte's eight do.
    """
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = unescaped.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    bits = _STRING.sub(b"", structure).translate(_BITS)
    if not bits:
        return 0
    # Closing brackets after the last fill the last byte: they reach no depth.
    bits += b"0" * (-len(bits) % 8)
    packed = int(bits, 2).to_bytes(len(bits) // 8, "big")
    # The depth before each byte (the changes summed, less the 8 each carries), plus its peak.
    before = chain((0,), map(sub, accumulate(packed.translate(_CHANGE)), count(8, 8)))
    return max(map(add, before, packed.translate(_PEAK)))
