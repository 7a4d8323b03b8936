"""What a what-if answer says of each deployment, in words (docs/design.md §5.14).

``exo-deploy whatif`` and the TUI's what-if dialog both word ``WhatIfDeployment`` for an
operator; the words are made here, once, so the two never tell one deployment's fate two ways.
They live beside the wire shapes rather than with the what-if rule in ``keeper.core`` because
the TUI reads the answer with the data model alone (it never imports the core).

The answer's ``outcome`` is about the nodes asked of: ``stays`` means none of the deployment's
instances used them. That is two different things to a reader: a deployment that loses nothing
is *unaffected*, but one that has no instance now, and gets none, does not stay anywhere: it
*still cannot be placed*, and why (the keeper's reason) is what matters about it. So the words
go by ``verdict``, which tells those two apart, not by the outcome alone.
"""

from __future__ import annotations

from typing import Literal

from keeper.model.api_models import (
    WhatIfDeployment,
    WhatIfEstimate,
    WhatIfNode,
    WhatIfPlacement,
    WhatIfThresholds,
)

# Rates are worded in GB/s of 1024**3 bytes, as the State's sizes are counted.
GB = 1024**3

Verdict = Literal["unaffected", "moves", "loses_replica", "cannot_place", "still_cannot_place"]

# Each verdict as a table's OUTCOME column says it: a few words, no details.
VERDICT_LABELS: dict[Verdict, str] = {
    "unaffected": "unaffected",
    "moves": "moves",
    "loses_replica": "loses replica",
    "cannot_place": "cannot place",
    "still_cannot_place": "still cannot be placed",
}


def verdict(deployment: WhatIfDeployment) -> Verdict:
    """What the loss does to the deployment: ``unaffected`` when it loses nothing, unless it
    has no instance now and would get none (``still_cannot_place``); otherwise its outcome."""
    if deployment.outcome == "stays":
        return "still_cannot_place" if deployment.after == 0 else "unaffected"
    return deployment.outcome


def node_names(nodes: list[WhatIfNode]) -> str:
    """An instance's nodes: ``a+b``."""
    return "+".join(node.name for node in nodes)


def places_words(placed: list[WhatIfPlacement]) -> str:
    """Where replacements go: ``mini-b (on disk), studio+mini-a (downloads first)``."""
    return ", ".join(
        f"{node_names(p.nodes)} ({'on disk' if p.model_on_disk else 'downloads first'})"
        for p in placed
    )


def outcome_words(deployment: WhatIfDeployment) -> str:
    """What happens to the deployment, in a phrase: ``unaffected``, ``moves from mini-a to
    mini-b (on disk)``, ``loses a replica: 1 of 2 left``, ``cannot be placed: 0 of 1 left``,
    ``still cannot be placed: <the keeper's reason>``."""
    said = verdict(deployment)
    if said == "unaffected":
        return "unaffected"
    if said == "still_cannot_place":
        why = deployment.reason
        return f"still cannot be placed: {why}" if why else "still cannot be placed"
    left = f"{deployment.after} of {deployment.replicas} left"
    if said == "moves":
        lost = ", ".join(node_names(i.nodes) for i in deployment.lost)
        return f"moves from {lost or 'the node'} to {places_words(deployment.placed)}"
    if said == "loses_replica":
        gone = max(deployment.before - deployment.after, 1)
        replicas = "a replica" if gone == 1 else f"{gone} replicas"
        return f"loses {replicas}: {left}"
    return f"cannot be placed: {left}"


def why_words(deployment: WhatIfDeployment) -> str | None:
    """The keeper's reason, for a line of its own under the deployment's; None when there is
    none or the phrase already says it (``still cannot be placed: <reason>``)."""
    if verdict(deployment) == "still_cannot_place":
        return None
    return deployment.reason


def seconds_words(estimate: WhatIfEstimate, thresholds: WhatIfThresholds) -> str:
    """``serving again in ~4 s (suspect 3 s, load ~1 s)``, or with fast failover off ``~45 s
    (exo's timeout 30-40 s, load ~5 s)``; a download adds its part, or says its time is unknown
    (the node reports no rate) and the total a floor (``over ~4 s``); a load at the assumed
    rate says so (``load ~1 s at an assumed 2 GB/s``)."""
    if thresholds.suspect_after_s > 0:
        parts = [f"suspect {thresholds.suspect_after_s:g} s"]
    else:
        low = thresholds.exo_timeout_s
        parts = [f"exo's timeout {low:g}-{low + thresholds.exo_sweep_s:g} s"]
    if estimate.download_s is None:
        parts.append("download time unknown")
    elif estimate.download_s > 0:
        parts.append(f"download ~{estimate.download_s:.0f} s")
    load = f"load ~{max(estimate.load_s, 1):.0f} s"
    if estimate.load_rate_assumed:
        load += f" at an assumed {estimate.load_rate / GB:g} GB/s"
    parts.append(load)
    if estimate.total_s is not None:
        total = f"~{estimate.total_s:.0f} s"
    else:  # what is known of it is a floor: the download only adds to it
        total = f"over ~{estimate.detection_s + estimate.load_s:.0f} s"
    return f"serving again in {total} ({', '.join(parts)})"


def placement_words(placement: WhatIfPlacement, thresholds: WhatIfThresholds | None) -> str:
    """A replacement and when it serves: ``mini-b (on disk): serving again in ~4 s (suspect
    3 s, load ~1 s at an assumed 2 GB/s)``; where it goes alone from a service that sends no
    estimate."""
    where = places_words([placement])
    if placement.estimate is None or thresholds is None:
        return where
    return f"{where}: {seconds_words(placement.estimate, thresholds)}"
