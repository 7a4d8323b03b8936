"""The edit form's rules and the header's bridge role, without a terminal: what ``PATCH`` gets
(only what changed), what is judged before sending (in the service's words, each naming its
field), which refusal goes beside which field, and the header's words for a bridge's role."""

from __future__ import annotations

from dataclasses import replace

import pytest
from model_ids import LLAMA, QWEN

from exo_deploy_tui.view.cells import service_text
from exo_deploy_tui.view.edits import (
    NOT_IN_PLACE,
    current_values,
    edit_changes,
    refusal_notes,
    rolling,
)
from keeper.model.api_models import RequestProblem, ServiceHealthView
from keeper.model.catalog import catalog_by_id
from keeper.model.state import Deployment, InstanceMeta, Sharding


def deployment(model_id: str = LLAMA, **settings: object) -> Deployment:
    return Deployment.model_validate(
        {"deployment_id": "dep-1", "model_card": catalog_by_id()[model_id], **settings}
    )


def test_the_form_is_filled_with_the_deployments_settings_and_unchanged_sends_nothing() -> None:
    kept = deployment(replicas=2, standby=0, priority=700, preempt=True, min_nodes=2)
    values = current_values(kept)
    assert (values.replicas, values.standby, values.priority, values.min_nodes) == (
        "2",
        "0",
        "700",
        "2",
    )
    assert values.preempt is True and values.sharding == "Pipeline"
    assert edit_changes(kept, values) == {}
    # Typed with spaces or a leading plus, still the same number: still nothing to send.
    assert edit_changes(kept, replace(values, replicas=" +2 ")) == {}


def test_only_what_changed_is_sent_in_the_forms_order() -> None:
    kept = deployment()
    values = replace(
        current_values(kept),
        min_nodes="2",
        preempt=True,
        replicas="3",
        instance_meta=InstanceMeta.MLX_JACCL.value,
    )
    changes = edit_changes(kept, values)
    assert changes == {"replicas": 3, "preempt": True, "instance_meta": "MlxJaccl", "min_nodes": 2}
    assert isinstance(changes, dict)
    assert list(changes) == ["replicas", "preempt", "instance_meta", "min_nodes"]
    assert rolling(changes)
    assert not rolling({"replicas": 3, "preempt": True, "standby": 2, "priority": 1})


@pytest.mark.parametrize(
    ("field", "typed", "problem"),
    [
        ("replicas", "17", "replicas: Input should be less than or equal to 16"),
        ("replicas", "0", "replicas: Input should be greater than or equal to 1"),
        ("standby", "5", "standby: Input should be less than or equal to 4"),
        ("priority", "-1", "priority: Input should be greater than or equal to 0"),
        ("priority", "high", "priority: Input should be a valid integer"),
        ("min_nodes", "", "min_nodes: Input should be a valid integer"),
        ("min_nodes", "17", "min_nodes 17 is more than mlx-community/Llama-3.2-1B"),
    ],
)
def test_a_bad_field_is_named_in_the_services_words(field: str, typed: str, problem: str) -> None:
    kept = deployment()
    result = edit_changes(kept, replace(current_values(kept), **{field: typed}))
    assert isinstance(result, list)
    assert [p.field for p in result] == [field]
    assert result[0].message.startswith(problem), result[0].message


def test_tensor_on_a_model_without_it_is_refused_before_sending() -> None:
    kept = deployment(QWEN)
    result = edit_changes(kept, replace(current_values(kept), sharding=Sharding.TENSOR.value))
    assert result == [
        RequestProblem("sharding", f"{QWEN} does not support tensor sharding; use Pipeline")
    ]


def test_a_refusal_goes_beside_each_field_it_names() -> None:
    message = (
        "sharding: Extra inputs are not permitted; min_nodes: Extra inputs are not permitted; "
        "replicas: Input should be less than or equal to 16"
    )
    notes = refusal_notes(message)
    assert notes == {
        "sharding": f"{NOT_IN_PLACE} (Extra inputs are not permitted)",
        "min_nodes": f"{NOT_IN_PLACE} (Extra inputs are not permitted)",
        "replicas": "Input should be less than or equal to 16",
    }
    # A refusal naming no field of the form (a 404, a bare reason) goes beside none.
    assert refusal_notes("no deployment dep-1") == {}
    assert refusal_notes("body.color: Extra inputs are not permitted") == {}


@pytest.mark.parametrize(
    ("health", "shown"),
    [
        (ServiceHealthView(name="b1", role="acting", leader="b1"), "bridge b1 · acting"),
        (
            ServiceHealthView(name="b2", role="standby", leader="b1"),
            "bridge b2 · standby (acting: b1)",
        ),
        (ServiceHealthView(role="standby"), "bridge · standby"),
        (ServiceHealthView(name="b2", role="standby"), "bridge b2 · standby"),
        (ServiceHealthView(name="b1"), None),  # a name alone: nothing new
        (None, None),
    ],
)
def test_the_headers_words_for_a_bridges_role(
    health: ServiceHealthView | None, shown: str | None
) -> None:
    text = service_text(health)
    assert (text.plain if text is not None else None) == shown
