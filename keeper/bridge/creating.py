"""Creations in flight: the keeper's ``InstanceCreated`` posted to exo, and followed until settled.

The keeper's ``InstanceCreated`` becomes ``POST {exo}/instance`` with exo's JSON of that instance
as exo gave it, its id included, so the id the keeper remembers is the one exo's State will show
and the in-flight rules work unchanged. Its ``DeploymentPlaced`` is held back and recorded only
when exo's State shows the instance (``settle``): in our master both arrive in the State
together, and the keeper reads "named by the deployment but not in the State" as "placed and
already lost".

exo refusing the instance anyway (400 "Insufficient memory ...": the cluster changed between the
two calls) becomes the deployment's placement error; the keeper's placement timeout then paces
the next try, and the deployment shows it waits to retry (``was_refused``).

Elections (``keeper.bridge.in_flight``): exo holds commands while its nodes elect a master, so a
``POST /instance`` without an answer is not a failure. It stays in flight, is resent with the
same instance id (exo keys instances by id, so that is idempotent) and no other instance is sent
for its deployment until exo's State shows it or exo, answering again, has clearly dropped it
(``held_back``); one given up is doomed, so if it lands late after all, the extra is deleted.

``Creations`` owns the creations in flight and the last refusal per deployment; it reaches the
rest of the bridge only through what it is handed: the exo API in use, the bridge's deployments,
its log (``record``, ``fail``), the doomed instances and exo's cards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from keeper.bridge import in_flight
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.exo_client import ExoApi, ExoRefusedError, ExoState, ExoUnavailableError
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.in_flight import LATE_LANDING_WATCH_S, Creation
from keeper.model.events import AnyEvent, DeploymentPlaced
from keeper.model.state import Deployment
from keeper.model.wire import JsonObject

log = logging.getLogger(__name__)


class Creations:
    """The instances sent to exo that its State does not show yet (module doc)."""

    def __init__(
        self,
        *,
        exo: Callable[[], ExoApi],
        deployments: Callable[[], Mapping[str, Deployment]],
        record: Callable[[Sequence[AnyEvent]], None],
        fail: Callable[[Deployment, str], None],
        doomed: DoomedInstances,
        cards: ExoCards,
        monotonic: Callable[[], float],
        guard: Callable[[str, Creation], bool] | None = None,
    ) -> None:
        self._exo = exo  # the exo API in use
        self._deployments = deployments  # the bridge's own, from its log
        self._record = record
        self._fail = fail
        self._doomed = doomed
        self._cards = cards
        self._monotonic = monotonic
        # Asked before each POST, with the instance id and its creation: whether the call may go
        # out (with a shared store: the intent recorded while this bridge still acts).
        self._guard = guard if guard is not None else _always
        self._pending: dict[str, Creation] = {}  # instance id -> its creation, in flight
        self._refused: dict[str, str] = {}  # deployment id -> the instance exo refused last

    # --- asked by the bridge ---------------------------------------------------------------

    def was_refused(self, deployment_id: str) -> bool:
        return deployment_id in self._refused

    def forget_refusal(self, deployment_id: str) -> None:
        self._refused.pop(deployment_id, None)

    def detail(self, deployment_id: str, now: float) -> str | None:
        """What the deployment's creation in flight waits for, if it has one."""
        for instance_id, creation in self._pending.items():
            if creation.deployment_id == deployment_id:
                return in_flight.detail(instance_id, creation, now)
        return None

    def held_back(self, deployment_id: str) -> bool:
        """Whether an instance sent for the deployment may still land: then no other is sent."""
        for instance_id, creation in self._pending.items():
            if creation.deployment_id == deployment_id:
                log.warning(
                    "not sending another instance for deployment %s: instance %s may still land",
                    deployment_id,
                    instance_id,
                )
                return True
        return False

    def pending(self) -> dict[str, Creation]:
        """The creations in flight, by instance id (a copy)."""
        return dict(self._pending)

    def resume(
        self, instance_id: str, deployment_id: str, body: Mapping[str, Any], now: float
    ) -> None:
        """A creation another bridge recorded before it stopped acting: in flight here, as one
        exo has not answered (so it is resent with the same id, never given up unanswered, and
        no other instance is sent for its deployment meanwhile)."""
        if instance_id not in self._pending:
            started = in_flight.first_send(deployment_id, body, now - in_flight.RESEND_S)
            self._pending[instance_id] = in_flight.unanswered(started)

    def forget_all(self) -> None:
        """This bridge stops acting: what is in flight is the acting bridge's to follow (it
        reads the recorded intents); nothing is doomed here."""
        self._pending.clear()
        self._refused.clear()

    # --- giving up on them -----------------------------------------------------------------

    def drop_deployment(self, deployment_id: str, now: float) -> None:
        """The deployment is deleted: what was sent for it that exo may still apply is deleted
        too, whenever it lands (an unanswered POST may be applied after an election)."""
        for instance_id, creation in list(self._pending.items()):
            if creation.deployment_id == deployment_id:
                self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
                del self._pending[instance_id]
        self._refused.pop(deployment_id, None)

    def drop(self, instance_id: str) -> bool:
        """Stop following the instance; True if it was in flight (it may still land)."""
        return self._pending.pop(instance_id, None) is not None

    def drop_all(self, now: float) -> None:
        """The bridge stops: what exo may still apply is not followed after this; if it lands it
        is deleted (the next run, after its grace, places again if need be)."""
        for instance_id in list(self._pending):
            self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
        self._pending.clear()

    # --- each tick -------------------------------------------------------------------------

    def master_changed(self) -> None:
        """exo's master changed (``keeper.model.master_change``, seen by the tick): what is in
        flight is sent again at the next ``resend`` (``in_flight`` rule 6)."""
        if self._pending:
            log.info(
                "exo's master changed: sending again at once %s",
                ", ".join(sorted(self._pending)),
            )
            self._pending = {i: in_flight.master_changed(c) for i, c in self._pending.items()}

    def settle(self, exo: ExoState, now: float) -> None:
        """Record DeploymentPlaced for instances exo now shows; give up on ones it dropped."""
        for instance_id, creation in list(self._pending.items()):
            deployment = self._deployments().get(creation.deployment_id)
            if deployment is None:
                del self._pending[instance_id]
                self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
            elif instance_id in exo.state.instances or instance_id in exo.unreadable_instances:
                del self._pending[instance_id]
                if deployment.instance_id != instance_id:
                    self._record(
                        [
                            DeploymentPlaced(
                                deployment_id=creation.deployment_id, instance_id=instance_id
                            )
                        ]
                    )
            elif in_flight.given_up(creation, now):
                del self._pending[instance_id]
                # Should it land after all (after the keeper placed another), it is deleted.
                self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
                log.warning(
                    "exo never showed instance %s of deployment %s (sent %d time(s)); "
                    "the keeper places again",
                    instance_id,
                    creation.deployment_id,
                    creation.sends,
                )

    async def resend(self, exo: ExoState, now: float) -> None:
        """POST again, same body, each creation exo has not shown for a while (in_flight)."""
        for instance_id, creation in list(self._pending.items()):
            shown = instance_id in exo.state.instances or instance_id in exo.unreadable_instances
            if not shown and in_flight.resend_due(creation, now):
                self._pending[instance_id] = in_flight.resent(creation, now)
                await self._post(instance_id)

    async def create(
        self, instance_id: str, deployment_id: str, raw: JsonObject | None, now: float
    ) -> None:
        """Send the instance the keeper placed for the deployment, as exo's JSON ``raw``."""
        if self._deployments().get(deployment_id) is None or raw is None:
            return
        # In flight before the call: if the answer is lost, exo may still have taken it. The body
        # is exo's own placement, exactly as exo gave it (docs/bridge.md, "Placement").
        self._pending[instance_id] = in_flight.first_send(deployment_id, {"instance": raw}, now)
        await self._post(instance_id)

    async def _post(self, instance_id: str) -> None:
        """POST one creation in flight and file exo's answer, or its silence, on it."""
        creation = self._pending[instance_id]
        deployment = self._deployments().get(creation.deployment_id)
        model_id = deployment.model_card.model_id if deployment is not None else "?"
        if not self._guard(instance_id, creation):
            log.warning(
                "instance %s of %s not sent: this bridge no longer acts", instance_id, model_id
            )
            return
        exo = self._exo()
        sent_at = self._monotonic()
        try:
            answer = await exo.create_instance(dict(creation.body))
        except ExoRefusedError as exc:
            if creation.sends == 1:  # exo said no to the only POST: nothing of it can land
                del self._pending[instance_id]
                self._refused[creation.deployment_id] = instance_id
                log.warning("exo refused instance %s of %s: %s", instance_id, model_id, exc.message)
                if deployment is not None:
                    self._fail(deployment, exc.message)
                return
            # An earlier POST of it may still be applied: it stays in flight.
            self._settled_answer(instance_id)
            log.warning("exo refused instance %s again: %s", instance_id, exc.message)
        except ExoUnavailableError as exc:
            # Not a failure: exo may be holding it through an election, and apply it after.
            current = self._pending.get(instance_id)
            if current is not None:
                self._pending[instance_id] = in_flight.unanswered(current)
            log.warning(
                "instance %s of %s: no answer to POST /instance (%s); it stays in flight and "
                "is sent again",
                instance_id,
                model_id,
                exc,
            )
        else:
            self._settled_answer(instance_id)
            self._refused.pop(creation.deployment_id, None)
            card: Any = answer.get("model_card")  # exo's full card of the model it took
            if isinstance(card, dict) and cast(JsonObject, card).get("modelId") == model_id:
                self._cards.saw(model_id, cast(JsonObject, card))
            log.info(
                "placing %s (deployment %s): instance %s sent to exo at %s%s, taken in %.2f s",
                model_id,
                creation.deployment_id,
                instance_id,
                exo.url,
                f" (time {creation.sends})" if creation.sends > 1 else "",
                self._monotonic() - sent_at,
            )

    def _settled_answer(self, instance_id: str) -> None:
        current = self._pending.get(instance_id)
        if current is not None:
            self._pending[instance_id] = in_flight.answered(current, self._monotonic())


def _always(instance_id: str, creation: Creation) -> bool:
    del instance_id, creation
    return True
