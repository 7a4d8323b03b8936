"""What the app and its screens agree on, so that no screen imports the app.

Textual's rule, attributes down and messages up: the app hands each screen what it reads (a
``ClusterSource`` for the model and the clock, a ``DashboardView`` for the view state the app
owns) and a screen asks for anything that changes the cluster or the app by posting one of the
messages below, which bubble to the app. The app's ``view`` reactive is bound to the dashboard's
(``data_bind``), so pausing is one value in one place that the screen only reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from textual.message import Message
from textual.screen import Screen

from exo_deploy_tui.model.cluster import ClusterModel
from exo_deploy_tui.view.edits import Setting
from keeper.model.api_models import CreateDeploymentRequest, ModelListEntry, ServiceHealthView


class ClusterSource(Protocol):
    """Where a screen reads the cluster: the app's model, the app's clock, the catalog."""

    @property
    def model(self) -> ClusterModel: ...

    def now(self) -> float: ...

    async def models(self) -> list[ModelListEntry]:
        """The master's model catalog; ``ApiError`` if it cannot be read."""
        ...


@dataclass(frozen=True)
class DashboardView:
    """The app's view state: what it was started with, and whether the screen is frozen."""

    url: str = ""
    readonly: bool = False
    demo: bool = False
    paused: bool = False
    # What the service's /healthz says of itself (a bridge's name and role), None until read
    # or when it says nothing of the kind.
    service: ServiceHealthView | None = None


class ModelScreen(Screen[None]):
    """A screen drawn from the model: the app calls ``render_model`` after every frame while
    the screen is on the stack (a dialog over it shows it), and every second for the
    countdowns."""

    def __init__(self, source: ClusterSource) -> None:
        super().__init__()
        self.source = source

    def render_model(self) -> None:
        raise NotImplementedError


# -- messages up ---------------------------------------------------------------------------


class CreateRequested(Message):
    """Create this deployment; ``answer`` gets None once the master accepted it, else the
    reason it was refused (the form stays open to fix it)."""

    def __init__(self, request: CreateDeploymentRequest, answer: Callable[[str | None], None]):
        super().__init__()
        self.request = request
        self.answer = answer


class DeleteRequested(Message):
    """Delete this deployment (the operator has confirmed)."""

    def __init__(self, deployment_id: str, model_id: str) -> None:
        super().__init__()
        self.deployment_id = deployment_id
        self.model_id = model_id


class ScaleRequested(Message):
    """Keep ``replicas`` instances of this deployment; ``answer`` gets None once the master
    accepted, else the reason it was refused (the form stays open to fix it)."""

    def __init__(
        self,
        deployment_id: str,
        model_id: str,
        replicas: int,
        answer: Callable[[str | None], None],
    ) -> None:
        super().__init__()
        self.deployment_id = deployment_id
        self.model_id = model_id
        self.replicas = replicas
        self.answer = answer


class EditRequested(Message):
    """Change these settings of this deployment (``PATCH /deployments/{id}``, only what
    changed); ``answer`` gets None once the service accepted, else its refusal (the form
    stays open and shows it beside the fields it names)."""

    def __init__(
        self,
        deployment_id: str,
        model_id: str,
        changes: dict[str, Setting],
        answer: Callable[[str | None], None],
    ) -> None:
        super().__init__()
        self.deployment_id = deployment_id
        self.model_id = model_id
        self.changes = changes
        self.answer = answer


class InstanceDeleteRequested(Message):
    """Delete this instance (the operator has confirmed); a deployment of its model places
    another by the keeper's rules."""

    def __init__(self, instance_id: str, model_id: str) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.model_id = model_id


class CordonRequested(Message):
    """Cordon the node the master calls ``node`` (``cordon``), or uncordon it, which ends its
    drain too."""

    def __init__(self, node: str, *, cordon: bool) -> None:
        super().__init__()
        self.node = node
        self.cordon = cordon


class DrainRequested(Message):
    """Drain the node the master calls ``node`` (the operator has confirmed): cordon it and
    move the keeper's instances off it, each replacement ready before the old one goes; with
    ``force``, also delete what cannot be moved and what the keeper did not place."""

    def __init__(self, node: str, *, force: bool = False) -> None:
        super().__init__()
        self.node = node
        self.force = force


class WhatIfRequested(Message):
    """Ask the master what losing the node it calls ``node`` now would do, and show its answer
    (a read: it changes nothing, so read-only allows it)."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node


class PauseToggled(Message):
    """Freeze the screen, or let it move again; the data keeps arriving either way."""


class FaultRequested(Message):
    """Inject a demo fault. With no ``node`` for a fault that needs one, the operator picks
    it, ``preferred`` (the selected deployment's first node) first."""

    def __init__(
        self,
        kind: str,
        node: str | None = None,
        seconds: float | None = None,
        *,
        preferred: str | None = None,
        needs_node: bool = True,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.node = node
        self.seconds = seconds
        self.preferred = preferred
        self.needs_node = needs_node
