"""One acting bridge among several on a shared store: taking over, standing by, fencing each call.

With ``--store`` every bridge of an exo cluster runs the same ticks, but only the one holding the
store's leader key acts (``keeper.bridge.etcd_store``). This is the bridge's side of that, kept
out of the service so the tick reads as before: ``may_act`` says whether this tick acts, and on a
change it takes over (resumes the creations and deletions the last acting bridge recorded, and
has the service start a keeper of its own) or stands by (forgets what it had in flight: the
acting bridge follows it from the store). Each exo call is announced first (``fence_*``): written
in a transaction that succeeds only while this bridge holds the leader key, so one that lost it
sends nothing. The instances to delete and the creations in flight are kept in the store as
they change (``persist_doomed``, ``forget_settled_intents``), so a takeover resumes them.

A bridge acts only on an exo that lists nodes (``prefix_refusal``): the store's prefix is checked
to be this exo cluster's by the nodes recorded there, and an exo in its cold start lists none, so
any prefix would pass; a bridge pointed at cluster A's prefix during B's cold start would take
A's records as its own and act on them. So it stands by, saying why (``/healthz`` 503, each
deployment's detail), until exo lists its nodes and the check can be made
(docs/design.md §8.5).

``trim_excess`` is the one rule a shared store adds: a scale-down taken by another bridge chose
the instances to delete on that bridge's view, which lacks this one's creations in flight, so a
creation landing after it would leave one replica too many; the acting bridge deletes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.etcd_store import EtcdStore
from keeper.bridge.exo_client import ExoState
from keeper.bridge.in_flight import LATE_LANDING_WATCH_S, Creation
from keeper.model.state import State

log = logging.getLogger(__name__)


def no_nodes_refusal(prefix: str) -> str:
    """Why a bridge does not act while exo lists no nodes (module doc)."""
    return (
        f"exo lists no nodes yet, so store prefix {prefix} cannot be told to be this exo "
        "cluster's: not acting until exo lists its nodes"
    )


class SharedActing:
    """Whether this bridge acts on the shared store, and what acting there takes (module doc)."""

    def __init__(
        self,
        store: EtcdStore,
        *,
        own: Callable[[], State],
        creations: Callable[[], Creations],
        doomed: Callable[[], DoomedInstances],
        monotonic: Callable[[], float],
        new_keeper: Callable[[float], None],
    ) -> None:
        self.store = store
        self._own = own  # the bridge's State, from the store's log
        self._creations = creations
        self._doomed = doomed
        self._monotonic = monotonic
        self._new_keeper = new_keeper  # start a keeper of this bridge's own, at this time
        self.was_acting = False  # acting at the last tick (a change: take over or stand by)
        # Why this bridge may not act on the prefix: it belongs to another exo cluster, or exo
        # lists no nodes to tell (``prefix_refusal``); None when it may.
        self.foreign: str | None = None
        self._doomed_in_store: set[str] = set()
        self._intents_in_store: set[str] = set()

    @property
    def acting(self) -> bool:
        return self.store.acting and self.foreign is None

    def may_act(self, exo: ExoState) -> bool:
        """Whether this tick acts: the leader key is this bridge's and exo is the cluster the
        prefix belongs to. Taking over and standing by happen here."""
        nodes = exo.state.topology.nodes
        refusal = (
            no_nodes_refusal(self.store.prefix) if not nodes else self.store.check_cluster(nodes)
        )
        if refusal is not None and refusal != self.foreign:
            log.warning("%s: %s", self.store.name, refusal)  # once per reason, not per tick
        self.foreign = refusal
        acting = self.acting
        if acting and not self.was_acting:
            self._take_over()
        elif not acting and self.was_acting:
            self._stand_by()
        self.was_acting = acting
        if acting:
            self._merge_doomed()
            self.trim_excess(exo)
        return acting

    def _take_over(self) -> None:
        now = self._monotonic()
        creations, doomed = self._creations(), self._doomed()
        creations.forget_all()
        doomed.clear()
        self._doomed_in_store = set()
        own = self._own()
        placed = {i for d in own.deployments.values() for i in d.placed_instance_ids}
        self._merge_doomed()
        intents = self.store.read_prefix("intent/")
        self._intents_in_store = set(intents)
        for instance_id, value in intents.items():
            intent = json.loads(value)
            if instance_id in placed or instance_id in doomed:
                continue  # landed and recorded (its intent goes with the record), or doomed
            if intent["deploymentId"] in own.deployments:
                creations.resume(instance_id, intent["deploymentId"], intent["body"], now)
            else:  # its deployment was deleted meanwhile: deleted too, if it lands
                doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
        # No startup grace for this keeper: the grace exists so a restarted bridge reads exo's
        # State before placing, and this tick has just read it; what the last acting bridge had
        # in flight is resumed above, so nothing it placed is placed twice.
        self._new_keeper(now)
        log.info(
            "%s acts: %d creation(s) resumed from the store",
            self.store.name,
            len(creations.pending()),
        )

    def _stand_by(self) -> None:
        log.warning("%s stands by: it no longer holds the leader key", self.store.name)
        self._creations().forget_all()
        self._doomed().clear()
        self._doomed_in_store = set()

    def _merge_doomed(self) -> None:
        """Instances to delete that another bridge recorded (a command it took, or the last
        acting bridge's), deleted from here on."""
        now = self._monotonic()
        doomed = self._doomed()
        for instance_id in self.store.read_prefix("doomed/"):
            self._doomed_in_store.add(instance_id)
            if instance_id not in doomed:
                doomed.add(instance_id, now)

    def trim_excess(self, exo: ExoState) -> None:
        """Doom what a deployment runs beyond its replicas (module doc): the creations in flight
        first, then the newest recorded instances exo shows (one exo lost is being replaced, not
        one too many); never while a drain moves instances (a move holds one more on purpose)."""
        own = self._own()
        if own.drains:
            return
        now = self._monotonic()
        creations, doomed = self._creations(), self._doomed()
        pending = creations.pending()
        for deployment_id, deployment in sorted(own.deployments.items()):
            flying = [i for i, c in pending.items() if c.deployment_id == deployment_id]
            placed = [
                i
                for i in deployment.placed_instance_ids
                if i in exo.state.instances and i not in doomed
            ]
            excess = len(flying) + len(placed) - deployment.replicas
            for instance_id in (flying + list(reversed(placed)))[: max(0, excess)]:
                log.info(
                    "deployment %s keeps %d replica(s): instance %s is one too many",
                    deployment_id,
                    deployment.replicas,
                    instance_id,
                )
                if creations.drop(instance_id):
                    doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
                else:
                    doomed.add(instance_id, now)

    # --- kept in the store as they change ------------------------------------------------------

    def persist_doomed(self, ids: list[str]) -> None:
        """The instances to delete, written to the store (fenced) whenever they change."""
        if not self.was_acting:
            return
        current = set(ids)
        gone = self._doomed_in_store - current
        new = current - self._doomed_in_store
        if (gone or new) and self.store.fence(
            {f"doomed/{instance_id}": "" for instance_id in new},
            [f"doomed/{instance_id}" for instance_id in gone],
        ):
            self._doomed_in_store = current

    def forget_settled_intents(self) -> None:
        """Drop the recorded creations no longer in flight (shown by exo, refused, given up)."""
        settled = self._intents_in_store - set(self._creations().pending())
        if settled and self.store.fence({}, [f"intent/{instance_id}" for instance_id in settled]):
            self._intents_in_store -= settled

    # --- fences: written first, and the call goes out only if they were ---------------------

    def fence_creation(self, instance_id: str, creation: Creation) -> bool:
        intent = json.dumps({"deploymentId": creation.deployment_id, "body": creation.body})
        if self.store.fence({f"intent/{instance_id}": intent}):
            self._intents_in_store.add(instance_id)
            return True
        return False

    def fence_delete(self, instance_id: str) -> bool:
        if self.store.fence({f"doomed/{instance_id}": ""}):
            self._doomed_in_store.add(instance_id)
            return True
        return False

    def fence_call(self, what: str) -> bool:
        return self.store.fence({"fence": f"{self.store.name}: {what}"})
