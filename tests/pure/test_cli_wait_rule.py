"""``--wait``'s rule (keeper.cli.waiting.judge): done only when serving with every replica ready
and no rolling change; cannot be done when cant_place or gone; otherwise what it is doing."""

from __future__ import annotations

from model_ids import QWEN

from keeper.cli.exits import EXIT_NOT_DONE, EXIT_OK
from keeper.cli.waiting import Outcome, judge
from keeper.model.api_models import DeploymentView, UpdateView
from keeper.model.catalog import catalog_by_id
from keeper.model.state import Deployment

CARD = catalog_by_id()[QWEN]


def view(status: str, ready: int, replicas: int = 1, **more: object) -> DeploymentView:
    deployment = Deployment(deployment_id="d1", model_card=CARD, replicas=replicas)
    if "placement_error" in more:
        deployment = deployment.model_copy(update={"placement_error": more.pop("placement_error")})
    return DeploymentView.model_validate(
        {"deployment": deployment, "status": status, "replicas": replicas,
         "readyReplicas": ready, **more}
    )  # fmt: skip


def test_serving_with_every_replica_and_no_rolling_change_is_done() -> None:
    assert judge("d1", view("serving", 2, 2), "") == Outcome(
        EXIT_OK, "deployment d1 is serving (2/2 ready)"
    )


def test_serving_short_of_a_replica_or_mid_change_is_still_under_way() -> None:
    assert judge("d1", view("serving", 1, 2), "") == Outcome(None, "serving, 1/2 ready")
    changing = view("serving", 1, updating=UpdateView(replaced=0, replicas=1))
    assert judge("d1", changing, "updating 0/1") == Outcome(
        None, "serving, 1/1 ready: updating 0/1"
    )
    assert judge("d1", view("starting", 0), "") == Outcome(None, "starting, 0/1 ready")


def test_cant_place_and_gone_end_it_with_why() -> None:
    stuck = view("cant_place", 0, placement_error="No cycles found with sufficient memory")
    assert judge("d1", stuck, "ignored") == Outcome(
        EXIT_NOT_DONE, "deployment d1 cannot be placed: No cycles found with sufficient memory"
    )
    assert judge("d1", None, "") == Outcome(EXIT_NOT_DONE, "deployment d1 is gone (deleted)")
