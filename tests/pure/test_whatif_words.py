"""What-if's words for each deployment (``keeper.model.whatif_words``), the one wording the
TUI's dialog and ``exo-deploy whatif`` share: a deployment the loss leaves alone is
``unaffected``, one with no instance now and none after ``still cannot be placed`` with why."""

from __future__ import annotations

import pytest

from keeper.core.whatif import detection_s, estimate
from keeper.model.api_models import (
    WhatIfDeployment,
    WhatIfEstimate,
    WhatIfInstance,
    WhatIfNode,
    WhatIfOutcome,
    WhatIfPlacement,
    WhatIfThresholds,
)
from keeper.model.whatif_words import (
    VERDICT_LABELS,
    outcome_words,
    places_words,
    seconds_words,
    verdict,
    why_words,
)

NO_FIT = "No cycles found with sufficient memory"


def node(name: str) -> WhatIfNode:
    return WhatIfNode(node_id=f"12D3KooW{name}", name=name)


def deployment(
    outcome: WhatIfOutcome,
    *,
    replicas: int = 1,
    before: int = 1,
    after: int = 1,
    lost: tuple[tuple[str, ...], ...] = (),
    placed: tuple[tuple[tuple[str, ...], bool], ...] = (),
    reason: str | None = None,
) -> WhatIfDeployment:
    return WhatIfDeployment(
        deployment_id="d",
        model_id="m",
        outcome=outcome,
        replicas=replicas,
        before=before,
        after=after,
        lost=[
            WhatIfInstance(instance_id=f"i{n}", nodes=[node(x) for x in names])
            for n, names in enumerate(lost)
        ],
        placed=[
            WhatIfPlacement(nodes=[node(x) for x in names], model_on_disk=on_disk)
            for names, on_disk in placed
        ],
        reason=reason,
    )


@pytest.mark.parametrize(
    ("answer", "said", "words"),
    [
        (deployment("stays"), "unaffected", "unaffected"),
        # Short already and left so (its one instance elsewhere): the loss takes nothing.
        (deployment("stays", replicas=2, after=1, reason=NO_FIT), "unaffected", "unaffected"),
        (
            deployment("stays", before=0, after=0, reason=NO_FIT),
            "still_cannot_place",
            f"still cannot be placed: {NO_FIT}",
        ),
        (deployment("stays", before=0, after=0), "still_cannot_place", "still cannot be placed"),
        (
            deployment("moves", lost=(("mini-a",),), placed=((("mini-b",), True),)),
            "moves",
            "moves from mini-a to mini-b (on disk)",
        ),
        (
            deployment("moves", placed=((("studio", "mini-b"), False),)),
            "moves",
            "moves from the node to studio+mini-b (downloads first)",
        ),
        (
            deployment("loses_replica", replicas=2, before=2, after=1, reason=NO_FIT),
            "loses_replica",
            "loses a replica: 1 of 2 left",
        ),
        (
            deployment("loses_replica", replicas=3, before=3, after=1),
            "loses_replica",
            "loses 2 replicas: 1 of 3 left",
        ),
        # Counted as one at least, whatever the counts say.
        (
            deployment("loses_replica", replicas=3, before=1, after=1),
            "loses_replica",
            "loses a replica: 1 of 3 left",
        ),
        (
            deployment("cannot_place", after=0, reason=NO_FIT),
            "cannot_place",
            "cannot be placed: 0 of 1 left",
        ),
    ],
)
def test_each_deployment_in_words(answer: WhatIfDeployment, said: str, words: str) -> None:
    assert verdict(answer) == said
    assert outcome_words(answer) == words


def test_the_reason_goes_under_the_line_unless_the_line_says_it() -> None:
    assert why_words(deployment("stays", before=0, after=0, reason=NO_FIT)) is None
    assert why_words(deployment("cannot_place", after=0, reason=NO_FIT)) == NO_FIT
    assert why_words(deployment("stays", replicas=2, reason=NO_FIT)) == NO_FIT
    assert why_words(deployment("stays")) is None


def test_the_table_s_labels() -> None:
    assert VERDICT_LABELS == {
        "unaffected": "unaffected",
        "moves": "moves",
        "loses_replica": "loses replica",
        "cannot_place": "cannot place",
        "still_cannot_place": "still cannot be placed",
    }


def test_places_say_the_nodes_and_whether_the_model_is_there() -> None:
    answer = deployment("moves", placed=((("a", "b"), True), (("c",), False)))
    assert places_words(answer.placed) == "a+b (on disk), c (downloads first)"


# --- in seconds (docs/design.md §5.14) -------------------------------------------------------

FAST = WhatIfThresholds(suspect_after_s=3.0, dead_after_s=8.0, exo_timeout_s=30.0, exo_sweep_s=10.0)
OFF = FAST.model_copy(update={"suspect_after_s": 0.0, "dead_after_s": 0.0})
GB = 1024**3


def test_the_estimate_adds_detection_download_and_load() -> None:
    staged = estimate(FAST, 2 * GB, on_disk=True, download_rate=None)
    assert staged == WhatIfEstimate(
        detection_s=3.0,
        download_s=0.0,
        load_s=1.0,
        total_s=4.0,
        load_rate=2 * GB,
        load_rate_assumed=True,
    )
    assert seconds_words(staged, FAST) == (
        "serving again in ~4 s (suspect 3 s, load ~1 s at an assumed 2 GB/s)"
    )
    off = estimate(OFF, 10 * GB, on_disk=True, download_rate=None)
    assert (off.detection_s, off.total_s) == (40.0, 45.0)
    assert seconds_words(off, OFF) == (
        "serving again in ~45 s (exo's timeout 30-40 s, load ~5 s at an assumed 2 GB/s)"
    )
    shard = estimate(FAST, 8 * GB, on_disk=True, download_rate=None, load_bytes=4 * GB)
    assert (shard.load_s, shard.total_s) == (2.0, 5.0)  # a shard loads, the model downloads
    fetched = estimate(FAST, 2 * GB, on_disk=False, download_rate=0.2 * GB, load_rate=4 * GB)
    assert (fetched.download_s, fetched.load_s, fetched.total_s) == (10.0, 0.5, 13.5)
    assert (fetched.load_rate, fetched.load_rate_assumed) == (4 * GB, False)
    assert seconds_words(fetched, FAST) == (
        "serving again in ~14 s (suspect 3 s, download ~10 s, load ~1 s)"
    )


def test_a_download_at_an_unknown_rate_leaves_the_total_unknown() -> None:
    unknown = estimate(FAST, 2 * GB, on_disk=False, download_rate=0.0, load_rate=0.0)
    assert (unknown.download_s, unknown.load_s, unknown.total_s) == (None, 1.0, None)
    assert seconds_words(unknown, FAST) == (
        "serving again in over ~4 s (suspect 3 s, download time unknown, load ~1 s at an "
        "assumed 2 GB/s)"
    )
    assert detection_s(FAST) == 3.0 and detection_s(OFF) == 40.0
