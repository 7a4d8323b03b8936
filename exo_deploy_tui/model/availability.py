"""A deployment's last 24 hours as the dashboard shows them: the master's serving records,
summarised by ``keeper.model.history``.

The rule (what counts as down, what an incident is, availability, MTTR) is
``keeper.model.history``'s alone, shared with the master's ``GET /deployments/{id}/history``; this
module only picks the window and the clock. The records carry the master's wall time, so the window
is taken on the master's clock (our ``now`` plus the measured offset) and the answer is then moved
onto the dashboard's clock, where every other time on screen is. It ends on the master's whole
second: availability moves by about 0.001 % a second, so one summary serves every frame of that
second and the model can keep it (``ClusterModel.day_history``). Pure: ``now`` and the offset are
passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from keeper.model.history import History, summarize
from keeper.model.state import DeploymentId, ServingRecord

# The AVAIL column and describe's history: the last day, long enough to hold a night's
# incidents when the operator looks in the morning.
AVAILABILITY_WINDOW_S = 24 * 3600.0


def window_end(now: float, master_clock_offset_s: float) -> float:
    """The end of the window on the master's clock: its whole second at our ``now``."""
    return float(math.floor(now + master_clock_offset_s))


def summarize_day(
    deployment_id: DeploymentId, records: Sequence[ServingRecord], end: float
) -> History:
    """The 24 h before ``end`` (the master's clock), times left on the master's clock."""
    return summarize(
        deployment_id, records, window_start=end - AVAILABILITY_WINDOW_S, window_end=end
    )


def on_our_clock(history: History, master_clock_offset_s: float) -> History:
    """``history`` with every time moved from the master's clock onto the dashboard's."""
    shift = -master_clock_offset_s
    if shift == 0:
        return history
    return replace(
        history,
        window_start=history.window_start + shift,
        window_end=history.window_end + shift,
        incidents=tuple(
            replace(
                incident,
                start=incident.start + shift,
                end=None if incident.end is None else incident.end + shift,
            )
            for incident in history.incidents
        ),
        complete_from=None if history.complete_from is None else history.complete_from + shift,
    )
