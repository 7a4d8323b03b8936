"""What is new in a deployment's chats, for the timeline: "2 chats to Qwen3-0.6B-4bit held
until it could serve, then answered" (docs/design.md §8.6, §9.7).

The service counts each chat through its front door once, when it ends, by outcome, and
``GET /deployments`` says how many ended each way over a sliding window
(``RequestsView.outcomes``, the last five minutes). It never says which chats are new: between
two readings a count grows by the chats that ended since and shrinks by those that aged out of
the window, and the two cannot be told apart. So the rule is:

- *A growth is news*: at least that many chats ended that way since the last reading. It is a
  lower bound: a chat that aged out in the same interval hides one that ended. Readings come
  every second or so (the poll, or the stream's view of the deployments), so that takes a chat
  of the same outcome leaving the window in the very second a new one ends: rare for the
  outcomes told here, which come in bursts around an incident.
- *A drop, or no change, says nothing*: chats aged out (fewer held chats in the window is not
  news of anything). The next growth is measured from the lower count, so a chat that ends
  after a drop is still told.
- *The first reading says nothing*: on connecting, once the deployment appears, and after the
  connection came back (``forget``), its counts are the whole window's, not what just happened;
  told as new, five minutes of chats would read as one burst at the moment of connecting.
- *No reading* (``requests`` None: no chat ended in the window, or no front door) counts as
  none of each, so the first chats after a quiet spell are told.

Only what an operator acts on is told: ``held`` (clients waited for the model to serve),
``migrated`` (exo cut a chat mid-answer and the front door continued it) and ``failed`` (a client
got an error). ``ok`` is the normal case; ``retried``, ``cancelled`` and ``rejected`` are counted
in describe. Pure: readings and ``now`` in, entries out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.model.timeline import Level, TimelineEntry
from keeper.model.api_models import DeploymentView
from keeper.model.request_rule import Outcome
from keeper.model.state import DeploymentId

# The outcomes the timeline tells, in the order a burst's lines read: waited, continued,
# failed (the worst last, nearest what follows it).
TOLD: tuple[Outcome, ...] = ("held", "migrated", "failed")
# How each reads: a held or continued chat was answered, late or after a cut (a caution); a
# failed one reached its client as an error.
_LEVEL: Mapping[Outcome, Level] = MappingProxyType(
    {"held": "warn", "migrated": "warn", "failed": "error"}
)
_NONE: Mapping[str, int] = MappingProxyType({})


def outcome_growth(before: Mapping[str, int], after: Mapping[str, int]) -> dict[Outcome, int]:
    """For each outcome told, how many more chats the window holds in ``after`` than in
    ``before``, where it grew (module doc: a growth is news, a drop is chats aging out)."""
    grown: dict[Outcome, int] = {
        outcome: after.get(outcome, 0) - before.get(outcome, 0) for outcome in TOLD
    }
    return {outcome: count for outcome, count in grown.items() if count > 0}


def growth_words(outcome: Outcome, count: int, model_id: str) -> str:
    """One outcome's news in words: ``2 chats to Qwen3-0.6B-4bit held until it could serve,
    then answered``."""
    chats = f"{count} chat{'s' if count != 1 else ''} to {short_model(model_id)}"
    if outcome == "held":
        return f"{chats} held until it could serve, then answered"
    if outcome == "migrated":
        return f"{chats} cut mid-answer, continued from where it was cut"
    return f"{chats} failed: {'its client' if count == 1 else 'their clients'} got an error"


def growth_entries(growth: Mapping[Outcome, int], model_id: str, now: float) -> list[TimelineEntry]:
    """The timeline's lines for one deployment's growth, in ``TOLD``'s order."""
    return [
        TimelineEntry(
            now, _LEVEL[outcome], growth_words(outcome, growth[outcome], model_id), model_id
        )
        for outcome in TOLD
        if outcome in growth
    ]


@dataclass
class ChatReadings:
    """Each deployment's last reading of its chats' outcomes, to tell what is new in the next
    (module doc)."""

    _last: dict[DeploymentId, Mapping[str, int]] = field(default_factory=dict)

    def took(self, views: Iterable[DeploymentView], now: float) -> list[TimelineEntry]:
        """A new reading of every deployment (``GET /deployments``, received at ``now``): what
        the timeline says of the chats that ended since the last one. A deployment no longer
        listed is forgotten."""
        entries: list[TimelineEntry] = []
        readings: dict[DeploymentId, Mapping[str, int]] = {}
        for view in views:
            d_id = view.deployment.deployment_id
            outcomes = view.requests.outcomes if view.requests is not None else _NONE
            readings[d_id] = outcomes
            before = self._last.get(d_id)
            if before is not None:
                growth = outcome_growth(before, outcomes)
                entries += growth_entries(growth, view.deployment.model_card.model_id, now)
        self._last = readings
        return entries

    def forget(self) -> None:
        """The connection was lost: the next reading is a first one again, and says nothing."""
        self._last = {}
