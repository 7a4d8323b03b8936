"""The table ``exo-deploy whatif`` prints (``keeper.cli.whatif.format_whatif``): every outcome
said in ``keeper.model.whatif_words``'s words, where each lost instance goes or why it cannot,
and no line past 80 columns, on a made-up answer (the command against a real master is
tests/processes/test_cli_whatif.py's)."""

from __future__ import annotations

from keeper.cli.whatif import WIDTH, format_whatif
from keeper.core.whatif import estimate
from keeper.model.api_models import (
    WhatIfDeployment,
    WhatIfInstance,
    WhatIfNode,
    WhatIfPlacement,
    WhatIfResponse,
    WhatIfThresholds,
)

GB = 1024**3


def node(name: str) -> WhatIfNode:
    return WhatIfNode(node_id=f"12D3KooW{name}", name=name)


def test_the_table_says_every_outcome_within_80_columns() -> None:
    long_model = "mlx-community/Llama-3.3-70B-Instruct-4bit-with-a-very-long-suffix"
    reason = (
        "no placement apart from the nodes serving m (studio-1, studio-2, studio-3): "
        "No cycles found with sufficient memory"
    )
    answer = WhatIfResponse(
        nodes=[node("studio-0"), node("mini")],
        deployments=[
            WhatIfDeployment(
                deployment_id="d1",
                model_id="m/stays",
                outcome="stays",
                replicas=1,
                before=1,
                after=1,
                lost=[],
                placed=[],
            ),
            WhatIfDeployment(
                deployment_id="d2",
                model_id=long_model,
                outcome="moves",
                replicas=2,
                before=2,
                after=2,
                lost=[WhatIfInstance(instance_id="i", nodes=[node("mini"), node("studio-0")])],
                placed=[WhatIfPlacement(nodes=[node("studio-5")], model_on_disk=True)],
            ),
            WhatIfDeployment(
                deployment_id="d3",
                model_id="m/loses",
                outcome="loses_replica",
                replicas=3,
                before=3,
                after=2,
                lost=[WhatIfInstance(instance_id="j", nodes=[node("mini")])],
                placed=[],
                reason=reason,
            ),
            WhatIfDeployment(
                deployment_id="d4",
                model_id="m/cannot",
                outcome="cannot_place",
                replicas=1,
                before=1,
                after=0,
                lost=[WhatIfInstance(instance_id="k", nodes=[node("studio-0")])],
                placed=[],
                reason="No cycles found with sufficient memory",
            ),
            # None of its instances on the nodes, because it has none: not placed before the
            # loss, and not after.
            WhatIfDeployment(
                deployment_id="d5",
                model_id="m/unplaced",
                outcome="stays",
                replicas=1,
                before=0,
                after=0,
                lost=[],
                placed=[],
                reason="No cycles found with sufficient memory",
            ),
        ],
    )
    lines = format_whatif(answer).splitlines()
    assert all(len(line) <= WIDTH for line in lines), lines
    # The OUTCOME column as wide as its longest words, "still cannot be placed".
    assert lines[:2] == [
        "If studio-0, mini went now:",
        "MODEL                                     OUTCOME                 LEFT",
    ]
    assert lines[2] == "m/stays                                   unaffected              1 of 1"
    assert lines[3].startswith("mlx-community/Llama-3.3-70B-Instruct-...  moves")
    assert lines[4:6] == ["  was on: mini+studio-0", "  goes to: studio-5 (on disk)"]
    assert lines[6].split() == ["m/loses", "loses", "replica", "2", "of", "3"]
    assert lines[7] == "  was on: mini"
    why = " ".join(line.strip() for line in lines[8:10])
    assert why == f"why: {reason}"
    assert lines[10].split() == ["m/cannot", "cannot", "place", "0", "of", "1"]
    assert lines[11:13] == ["  was on: studio-0", "  why: No cycles found with sufficient memory"]
    assert lines[13:] == [
        "m/unplaced                                still cannot be placed  0 of 1",
        "  why: No cycles found with sufficient memory",
    ]
    empty = WhatIfResponse(nodes=[node("mini")], deployments=[])
    assert format_whatif(empty) == "If mini went now:\nno deployments: nothing to move"


def test_each_replacement_says_when_it_serves_again_on_a_line_of_its_own() -> None:
    fast = WhatIfThresholds(
        suspect_after_s=3.0, dead_after_s=8.0, exo_timeout_s=30.0, exo_sweep_s=10.0
    )
    staged = estimate(fast, 2 * GB, on_disk=True, download_rate=None)
    fetched = estimate(fast, 2 * GB, on_disk=False, download_rate=None)
    answer = WhatIfResponse(
        nodes=[node("mini-a")],
        deployments=[
            WhatIfDeployment(
                deployment_id="d",
                model_id="m/two",
                outcome="moves",
                replicas=2,
                before=2,
                after=2,
                lost=[WhatIfInstance(instance_id="i", nodes=[node("mini-a")])],
                placed=[
                    WhatIfPlacement(nodes=[node("mini-b")], model_on_disk=True, estimate=staged),
                    WhatIfPlacement(nodes=[node("mini-c")], model_on_disk=False, estimate=fetched),
                ],
            )
        ],
        thresholds=fast,
    )
    lines = format_whatif(answer).splitlines()
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[3:] == [
        "  was on: mini-a",
        "  goes to: mini-b (on disk): serving again in ~4 s (suspect 3 s, load ~1 s at an",
        "    assumed 2 GB/s)",
        "  goes to: mini-c (downloads first): serving again in over ~4 s (suspect 3 s,",
        "    download time unknown, load ~1 s at an assumed 2 GB/s)",
    ]
