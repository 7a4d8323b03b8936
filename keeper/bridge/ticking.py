"""The bridge's tick: read exo's State and act on it, once a second (docs/bridge.md).

The order is the rule, so it reads top to bottom in ``tick``: read exo's State (through the
follower, which says whether it may be acted on); with a shared store, stop unless this bridge
acts; then, under the log's lock that the commands also take, tell the creations in flight and
the deletion record when exo's master changed (``keeper.model.master_change``, seen once here
for both), settle the creations exo answered, record what exo deleted
(``keeper.bridge.vanished``) and what serving became (``keeper.model.history``), delete the
doomed instances and, at the same time (a loaded exo answers each call in up to a second),
resend what exo may have lost, ask exo where it would place what the step will try
(``keeper.bridge.placing``), step the keeper on those answers, and turn its events into exo
calls and the bridge's own records (``_act``). A step that raises is retried the next second and
never stops the bridge (``keeper.bridge.health``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from keeper.bridge.acting import SharedActing
from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.etcd_store import EtcdUnavailableError, NotActingError, StoreError
from keeper.bridge.exo_client import ExoRefusedError, ExoState, ExoUnavailableError
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.following import ExoFollower
from keeper.bridge.health import StepFailures
from keeper.bridge.node_liveness import BridgeLiveness
from keeper.bridge.own_log import OwnLog
from keeper.bridge.placing import PlacementAnswers, StepPlacement, ask_exo, due_for_placement
from keeper.bridge.staging_calls import StagingCalls
from keeper.bridge.vanished import VanishedInstances
from keeper.bridge.views import BridgeView
from keeper.core.failover import instances_on_dead_nodes
from keeper.model.events import (
    AnyEvent,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DownloadDeletionRequested,
    DownloadRequested,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.history import serving_changes
from keeper.model.master_change import master_changed
from keeper.model.state import State
from keeper.runtime.clock import Clock
from keeper.runtime.event_store import LogNotWritableError
from keeper.runtime.hosted_keeper import ReportsHealth, Started
from keeper.runtime.side_by_side import side_by_side

log = logging.getLogger(__name__)

# A tick for a threshold starts this long after it, so the check falls after it and not a float's
# width before (which would only ask for another tick at once).
THRESHOLD_MARGIN_S = 0.02


class BridgeTicks:
    """The bridge's ticks (module doc)."""

    def __init__(
        self,
        *,
        log: OwnLog,
        view: BridgeView,
        started: Started,
        follow: ExoFollower,
        cards: ExoCards,
        acting: SharedActing | None,
        creations: Creations,
        vanished: VanishedInstances,
        doomed: DoomedInstances,
        placement: StepPlacement,
        staging: StagingCalls,
        steps: StepFailures,
        poll_interval_s: float,
        liveness: BridgeLiveness,
    ) -> None:
        self._log = log
        self._view = view
        self._started = started
        self._follow = follow
        self._cards = cards
        self._acting = acting
        self._creations = creations
        self._vanished = vanished
        self._doomed = doomed
        self._placement = placement
        self._staging = staging
        self._steps = steps
        self._liveness = liveness
        self._poll_interval_s = poll_interval_s
        self._served: State | None = None  # the merged State serving was last judged on
        # exo's State the last acting tick read: its master changing shows only between two.
        self._acted_on: State | None = None
        self._woken = anyio.Event()  # set by ``wake``: the next tick is due at once

    async def run(self, clock: Clock) -> None:
        """Tick every ``poll_interval_s`` until cancelled, whatever a tick raises; sooner when
        woken (``wake``) or when a node's silence reaches a threshold of the liveness rule
        before the next poll."""
        while True:
            started = clock.monotonic()
            try:
                await self.tick()
            except Exception as exc:  # a bug must not stop the deployments being kept
                self._step_failed(exc)
            else:
                self._steps.succeeded()
            wait_s = self._poll_interval_s - (clock.monotonic() - started)
            due_s = self._liveness.next_check_in(clock.monotonic())
            if due_s is not None:
                # A node's silence reaches a threshold before the next poll: the tick then
                # reaches the verdict then, not up to a poll later (docs/design.md §5.18).
                wait_s = min(wait_s, due_s + THRESHOLD_MARGIN_S)
            await self._pause(clock, wait_s)

    def wake(self) -> None:
        """Tick now rather than at the next poll: a node's own API refused the connection,
        a verdict the next tick acts on (its instances deleted, replacements placed), and
        waiting out the poll would add up to a second to a kill's failover (§5.18)."""
        self._woken.set()

    async def _pause(self, clock: Clock, seconds: float) -> None:
        """Until the next tick: ``seconds``, or until woken, whichever comes first (a wake
        during the tick just ended counts: the next one starts at once)."""
        async with anyio.create_task_group() as group:

            async def sleep_out() -> None:
                await clock.sleep(max(0.0, seconds))
                group.cancel_scope.cancel()

            group.start_soon(sleep_out)
            await self._woken.wait()
            group.cancel_scope.cancel()
        self._woken = anyio.Event()

    async def tick(self) -> None:
        """Read exo's State; if it answered, settle, delete what is doomed and step the keeper."""
        exo = await self._follow.read()
        if exo is None:
            return
        self._follow.available(exo)
        self._cards.saw_all(exo.cards)
        clock = self._started.clock
        self._liveness.observe(exo.state, exo.raw, clock.monotonic(), clock.wall().timestamp())
        together = self._liveness.silent_together
        if together is not None:
            self._follow.stale_here(together)  # another node's copy may hear them (§8.3)
        else:
            self._follow.fresh_here()
        if self._acting is not None:
            try:
                if not self._acting.may_act(exo):
                    return
                await self._acting_tick(exo)
                self._acting.forget_settled_intents()
            except (NotActingError, StoreError) as exc:
                log.warning("step stopped: %s", exc)
            except EtcdUnavailableError as exc:
                # Not a failing step: the store's outage, which every deployment already names.
                self._acting.store.unreachable(str(exc), refused=exc.refused)
            return
        await self._acting_tick(exo)

    async def _acting_tick(self, exo: ExoState) -> None:
        async with self._log.lock:
            now = self._started.clock.monotonic()
            before, self._acted_on = self._acted_on, exo.state
            if master_changed(before, exo.state) is not None:
                self._creations.master_changed()  # sent again at once (in_flight rule 6)
                self._vanished.master_changed()  # a new log: its indices start at 0
            self._creations.settle(exo, now)
            self._record_vanished(exo, now)
            self._record_serving()
            self._doom_dead(now)
            deletions = self._fence_deletions(exo, now)
            # The deletions go beside the step's placements, not before them: a dead node's
            # instance and its replacement are independent calls, and a loaded exo answers
            # each in up to a second (docs/design.md §5.18).
            await side_by_side(
                lambda: self._send_deletions(deletions, now), lambda: self._place(exo, now)
            )

    async def _place(self, exo: ExoState, now: float) -> None:
        """Resend what exo may have lost, ask exo where it would place what the step will try,
        step the keeper on those answers and act on its events."""
        await self._creations.resend(exo, now)
        # The step's plan: what it will try to place, exo's answers for exactly those, then
        # the step placing from those answers only (keeper.bridge.placing).
        state = self._view.acting_state  # without what exo's unread parts concern
        keeper = self._started.keeper
        repair = keeper.repair_kind(state, now) if isinstance(keeper, ReportsHealth) else None
        due = due_for_placement(state, keeper.timers(state, now), repair)
        try:
            answers = await ask_exo(self._follow.exo, self._cards, state, due)
        except ExoUnavailableError as exc:
            self._follow.unavailable(str(exc))
            return
        if self._follow.outage is not None:
            return  # exo stopped answering meanwhile (here or a DELETE): the State may be stale
        events = self._placement.step(keeper, answers, state, now)
        await self._act(events, answers, now)

    def _step_failed(self, exc: Exception) -> None:
        # /healthz and every deployment say so until a step goes through; each distinct error
        # is logged once, with its traceback, not once a second.
        if self._steps.failed(exc, self._started.clock.wall()):
            log.error(
                "a step of the bridge failed (every deployment says so); retrying every poll",
                exc_info=exc,
            )

    def _record_vanished(self, exo: ExoState, now: float) -> None:
        """InstanceDeleted in the bridge's log for each recorded instance exo deleted (only
        believed from a readable State, and once it lasts: ``keeper.bridge.vanished``)."""
        deployments = sorted(self._log.state.deployments.items())
        recorded = [
            instance_id
            for _, deployment in deployments
            for instance_id in deployment.placed_instance_ids
        ]
        # A repair's broken instance too (one placed by hand is in no record): gone from exo,
        # its deletion ends the repair (docs/design.md §5.19).
        recorded += [d.repairing.old_instance_id for _, d in deployments if d.repairing is not None]
        # One exo runs but that did not read is there all the same (docs/design.md §8.2).
        unread = exo.unreadable_instances
        gone = self._vanished.gone([i for i in recorded if i not in unread], exo.state, now)
        if gone:
            log.info("exo no longer runs instance(s) %s: recorded as deleted", ", ".join(gone))
            self._log.record([InstanceDeleted(instance_id=instance_id) for instance_id in gone])
            self._vanished.forget(gone)

    def _record_serving(self) -> None:
        """The serving records exo's new State calls for (``keeper.model.history``), in the
        bridge's log: its own State holds only the deployments, so it judges serving on the
        merged one, read only from a State exo answered in full. A record the log refuses is not
        lost: the next poll finds the same difference and records it then."""
        state = self._view.acting_state  # what exo's unread parts concern waits for a read
        changes = serving_changes(self._served, state, self._started.clock.wall().timestamp())
        if changes:
            try:
                self._log.record(changes)
            except LogNotWritableError:
                return
        self._served = state

    def _doom_dead(self, now: float) -> None:
        """The instances on nodes confirmed dead go, through exo's ``DELETE /instance/{id}``
        (fenced like every exo call), so exo stops sending chats to them (§5.18)."""
        for instance_id, nodes in instances_on_dead_nodes(self._view.state).items():
            if instance_id not in self._doomed:
                log.info("instance %s: node(s) %s confirmed dead", instance_id, ", ".join(nodes))
                self._doomed.add(instance_id, now)

    def _fence_deletions(self, exo: ExoState, now: float) -> list[str]:
        """The doomed instances to send ``DELETE`` for now, each announced in the shared store
        first (fenced, like every exo call); the ones after a refused fence are left to the
        next acting bridge."""
        present = frozenset(exo.state.instances) | exo.unreadable_instances
        fenced: list[str] = []
        for instance_id in self._doomed.due(present, now):
            if self._acting is not None and not self._acting.fence_delete(instance_id):
                break  # no longer acting: the next acting bridge deletes it
            fenced.append(instance_id)
        return fenced

    async def _send_deletions(self, instance_ids: Sequence[str], now: float) -> None:
        clock = self._started.clock
        for instance_id in instance_ids:
            sent_at = clock.monotonic()
            try:
                await self._follow.exo.delete_instance(instance_id)
            except ExoUnavailableError as exc:
                self._follow.unavailable(str(exc))
                return
            except ExoRefusedError as exc:
                log.warning("exo refused to delete instance %s: %s", instance_id, exc.message)
            else:
                taken_s = clock.monotonic() - sent_at
                log.info("instance %s: deletion sent to exo, taken in %.2f s", instance_id, taken_s)
            self._doomed.accepted(instance_id, now)

    async def _act(self, events: Sequence[AnyEvent], answers: PlacementAnswers, now: float) -> None:
        """Turn the keeper's events into exo calls and the bridge's own records; an instance
        the keeper placed is posted as exo gave it in the step's ``answers``."""
        placed_for = {
            event.instance_id: event.deployment_id
            for event in events
            if isinstance(event, DeploymentPlaced)
        }
        staged = await self._staging.carry(self._follow.exo, events)
        if staged:
            self._log.record(staged)
        for event in events:
            if isinstance(event, DownloadRequested | DownloadDeletionRequested):
                continue  # carried to exo above, recorded once exo took them
            if isinstance(event, InstanceCreated):
                instance_id = event.instance.instance_id
                deployment_id = placed_for.get(instance_id)
                if deployment_id is not None and not self._creations.held_back(deployment_id):
                    raw = answers.raw(instance_id)
                    await self._creations.create(instance_id, deployment_id, raw, now)
            elif isinstance(event, InstanceDeleted):
                self._doomed.add(event.instance_id, now)
            elif not isinstance(event, DeploymentPlaced):  # recorded once exo shows it
                if isinstance(event, DeploymentPlacementFailed):
                    # our placement's own reason
                    self._creations.forget_refusal(event.deployment_id)
                self._log.record([event])
