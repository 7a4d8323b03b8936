"""What a front door asks of a service's deployments (docs/design.md §8.6): is there a
deployment of this model, does it serve, and how is it in words.

Written once for both services that mount the front door (``keeper.runtime.front_door``): the
bridge and our master. Each builds its deployments' views its own way (the bridge from exo's
State and its log, the master from its own State); what the door reads of them is the same rule
over those views, so a chat is held, sent or refused alike on either. Apart from
``keeper.runtime.deployments`` (the deployments API's rules) because it speaks the door's shape,
and that module need not know the door.
"""

from __future__ import annotations

from collections.abc import Iterable

from keeper.model.api_models import DeploymentView
from keeper.model.readiness import chat_homes
from keeper.model.state import State
from keeper.runtime.front_door import ModelDeployment


def model_deployment(
    views: Iterable[DeploymentView], model_id: str, state: State
) -> ModelDeployment | None:
    """The deployment of ``model_id`` among ``views`` (built on ``state``) as the front door
    asks: its id, whether it serves (any instance of its model ready, docs/design.md §3.4), its
    status in words (with the service's detail, when there is one), and the instances a chat
    in flight may be on (``chat_homes``); None when the model has none."""
    for view in views:
        if view.deployment.model_card.model_id == model_id:
            words = view.status + (f": {view.detail}" if view.detail else "")
            return ModelDeployment(
                view.deployment.deployment_id,
                view.status == "serving",
                words,
                chat_homes(state, model_id),
            )
    return None
