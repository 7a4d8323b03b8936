"""How long the bridge waits for exo's State before it reads the next URL: short for a quick
exo, longer for a slow one (docs/design.md §8.3).

A read of ``GET /state`` that outlives its deadline moves the bridge to the next exo URL, so a
frozen node it follows is left within one poll and a half. But a fixed deadline cannot tell a
frozen exo from a slow one: on a loaded machine (or a large cluster's State on a busy Mac) every
node answered in 1-2.5 s, each read outlived 1.5 s, and the bridge called exo unreachable and
placed nothing while exo was answering. So the deadline follows what exo takes:

- after a walk that read a State in ``read_s``: ``SLOW_FACTOR`` times that read, never under
  ``FLOOR_S`` (a quick exo keeps the short deadline a freeze needs) nor over ``CEILING_S``;
- after a walk in which no URL gave a State in time: twice the deadline, up to ``CEILING_S``
  (every node frozen at once is rarer than every node slow; a walk later, a slow exo is read).

The deadline bounds a read; the *hedge* (``hedge_after``, half of it) is when the next URL is
read beside the one in use, the first answer winning: a frozen followed node is left within a
hedge (0.75 s for a quick exo), not a whole deadline, while a slow one is still read.

Pure: the follower (``keeper.bridge.following``) times the read and keeps the deadline.
"""

from __future__ import annotations

# A quick exo's deadline: a hundred times a LAN answer, yet a frozen followed node is left
# within one poll and a half (the value the bridge has always used).
FLOOR_S = 1.5
# A read may take up to this many times the last good one before the node is taken for frozen:
# a State's size and the node's load change little from one second to the next.
SLOW_FACTOR = 3.0
# The longest the bridge waits for one State: the longest exo holds a read during an election
# (measured up to 6 s); past it the bridge would be blind for more than a few polls in a row.
CEILING_S = 6.0
# The next URL is read beside the one in use once that one has taken this share of its deadline:
# half of it (0.75 s for a quick exo, which answers in a tenth of that) is well past any answer
# the URL in use was going to give in time, and leaves the next URL the other half.
HEDGE_SHARE = 0.5


def next_deadline(current_s: float, read_s: float | None) -> float:
    """The deadline for the next walk's reads, after one that read a State in ``read_s``
    seconds (None: no URL gave one in time) with ``current_s`` (module doc)."""
    if read_s is None:
        return min(CEILING_S, current_s * 2)
    return min(CEILING_S, max(FLOOR_S, SLOW_FACTOR * read_s))


def hedge_after(deadline_s: float) -> float:
    """How long a read of the URL in use runs alone before the next URL is read beside it
    (``keeper.bridge.following``): a share of the read's deadline, so a slow exo, whose
    deadline grew with its reads, is not hedged on every read."""
    return HEDGE_SHARE * deadline_s
