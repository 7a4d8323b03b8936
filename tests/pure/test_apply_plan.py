"""``exo-deploy apply``'s plan (``keeper.client.apply_plan``) and its file
(``keeper.client.deployment_file``), as pure functions: carrying a plan out gives what the file
asks, a file planned against itself changes nothing, an export reads back as itself, and every
kind of bad file is named with its line. The command against a real master is
tests/processes/test_cli_apply.py's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keeper_harness import card

from keeper.cli.apply import WIDTH, format_plan, refusal_report
from keeper.client.apply_plan import (
    SETTINGS,
    Change,
    Create,
    Delete,
    FieldChange,
    Plan,
    Unchanged,
    Unlisted,
    outcome,
    plan_deployments,
    settings_of,
)
from keeper.client.deployment_file import (
    DeploymentFileError,
    export_text,
    parse_deployment_file,
)
from keeper.client.deployments import ApiError
from keeper.model.api_models import MAX_MIN_NODES, CreateDeploymentRequest
from keeper.model.state import (
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_STANDBY,
    MIN_PRIORITY,
    Deployment,
    InstanceMeta,
    Sharding,
)

MODELS = (
    "mlx-community/Qwen3-30B-A3B-4bit",
    "mlx-community/Llama-3.2-1B-Instruct-4bit",
    "mlx-community/Meta-Llama-3.1-70B-Instruct-with-a-long-name-4bit",
    "m/x",
)


def requests_of(model_ids: st.SearchStrategy[str]) -> st.SearchStrategy[CreateDeploymentRequest]:
    return st.builds(
        CreateDeploymentRequest,
        model_id=model_ids,
        sharding=st.sampled_from(Sharding),
        instance_meta=st.sampled_from(InstanceMeta),
        min_nodes=st.integers(1, MAX_MIN_NODES),
        replicas=st.integers(1, MAX_REPLICAS),
        standby=st.integers(0, MAX_STANDBY),
        priority=st.integers(MIN_PRIORITY, MAX_PRIORITY),
        preempt=st.booleans(),
    )


# A file: one entry per model, in any order.
desired_lists = st.lists(
    requests_of(st.sampled_from(MODELS)), max_size=len(MODELS), unique_by=lambda r: r.model_id
)


def deployment(request: CreateDeploymentRequest, deployment_id: str) -> Deployment:
    return Deployment(
        deployment_id=deployment_id,
        model_card=card(request.model_id),
        sharding=request.sharding,
        instance_meta=request.instance_meta,
        min_nodes=request.min_nodes,
        replicas=request.replicas,
        standby=request.standby,
        priority=request.priority,
        preempt=request.preempt,
    )


@st.composite
def current_lists(draw: st.DrawFn) -> list[Deployment]:
    """A service's deployments: one per model, as the services keep them."""
    requests = draw(desired_lists)
    return [deployment(request, f"d{index}") for index, request in enumerate(requests)]


def by_model(requests: list[CreateDeploymentRequest]) -> dict[str, CreateDeploymentRequest]:
    return {request.model_id: request for request in requests}


def carried_out(plan: Plan, current: list[Deployment]) -> dict[str, CreateDeploymentRequest]:
    after = outcome(plan, {d.deployment_id: settings_of(d) for d in current})
    return by_model(list(after.values()))


@settings(max_examples=300)
@given(desired=desired_lists, current=current_lists())
def test_carrying_out_the_plan_with_prune_gives_the_file(
    desired: list[CreateDeploymentRequest], current: list[Deployment]
) -> None:
    plan = plan_deployments(desired, current, prune=True)
    assert carried_out(plan, current) == by_model(desired)
    assert plan.count(Unlisted) == 0


@settings(max_examples=300)
@given(desired=desired_lists, current=current_lists())
def test_without_prune_the_unlisted_are_left_as_they_are(
    desired: list[CreateDeploymentRequest], current: list[Deployment]
) -> None:
    plan = plan_deployments(desired, current, prune=False)
    listed = {request.model_id for request in desired}
    expected = {d.model_card.model_id: settings_of(d) for d in current} | by_model(desired)
    assert carried_out(plan, current) == expected
    assert plan.count(Delete) == 0
    assert plan.count(Unlisted) == sum(d.model_card.model_id not in listed for d in current)


@settings(max_examples=300)
@given(desired=desired_lists, current=current_lists(), prune=st.booleans())
def test_the_plan_is_ordered_and_changes_carry_only_what_differs(
    desired: list[CreateDeploymentRequest], current: list[Deployment], prune: bool
) -> None:
    plan = plan_deployments(desired, current, prune=prune)
    order = [Create, Change, Delete, Unchanged, Unlisted]
    ranks = [order.index(type(step)) for step in plan.steps]
    assert ranks == sorted(ranks)
    # Every deployment of the file and of the service is in the plan once.
    assert sorted(step.model_id for step in plan.steps) == sorted(
        {r.model_id for r in desired} | {d.model_card.model_id for d in current}
    )
    wanted = by_model(desired)
    for step in plan.steps:
        if isinstance(step, Change):
            new = wanted[step.model_id].model_dump(mode="json")
            assert step.changes
            assert all(change.new == new[change.name] != change.old for change in step.changes)
            assert set(step.patch_body()) <= set(SETTINGS)


@settings(max_examples=200)
@given(desired=desired_lists, prune=st.booleans())
def test_a_file_planned_against_itself_is_all_unchanged(
    desired: list[CreateDeploymentRequest], prune: bool
) -> None:
    current = [deployment(request, f"d{i}") for i, request in enumerate(desired)]
    plan = plan_deployments(desired, current, prune=prune)
    assert plan.actions == ()
    assert plan.count(Unchanged) == len(desired)


@settings(max_examples=200)
@given(desired=desired_lists)
def test_export_then_parse_is_the_same(desired: list[CreateDeploymentRequest]) -> None:
    assert parse_deployment_file(export_text(desired), "export") == desired


@settings(max_examples=200)
@given(desired=desired_lists, current=current_lists(), prune=st.booleans())
def test_the_printed_plan_fits_80_columns_and_names_each_deployment(
    desired: list[CreateDeploymentRequest], current: list[Deployment], prune: bool
) -> None:
    plan = plan_deployments(desired, current, prune=prune)
    text = format_plan(plan)
    assert all(len(line) <= WIDTH for line in text.splitlines())
    starts = [line.split()[0] for line in text.splitlines()[1:-1] if not line.startswith(" ")]
    assert starts == [type(step).__name__.lower() for step in plan.steps]
    assert text.splitlines()[-1].startswith(f"plan: {plan.count(Create)} to create")


def test_a_field_left_out_is_its_default() -> None:
    """Removing ``replicas: 3`` from the file means replicas back to 1."""
    (was,) = parse_deployment_file("deployments:\n  - model: m/x\n    replicas: 3\n", "f")
    (now,) = parse_deployment_file("deployments:\n  - model: m/x\n", "f")
    plan = plan_deployments([now], [deployment(was, "d1")], prune=False)
    assert plan.steps == (Change("d1", "m/x", (FieldChange("replicas", 3, 1),)),)


def test_a_model_kept_twice_matches_the_first_and_prunes_the_other() -> None:
    request = CreateDeploymentRequest(model_id="m/x")
    current = [deployment(request, "first"), deployment(request, "second")]
    plan = plan_deployments([request], current, prune=True)
    assert plan.steps == (Delete("second", "m/x"), Unchanged("first", "m/x"))


def test_the_plan_as_printed() -> None:
    current = [
        deployment(CreateDeploymentRequest(model_id=MODELS[0], replicas=3), "aaaaaaaa-1111"),
        deployment(CreateDeploymentRequest(model_id=MODELS[2]), "bbbbbbbb-2222"),
        deployment(CreateDeploymentRequest(model_id="m/x"), "cccccccc-3333"),
    ]
    desired = [
        CreateDeploymentRequest(model_id=MODELS[0], sharding=Sharding.TENSOR, priority=900),
        CreateDeploymentRequest(model_id=MODELS[1], replicas=2),
        CreateDeploymentRequest(model_id="m/x"),
    ]
    text = format_plan(plan_deployments(desired, current, prune=True))
    assert text.splitlines() == [
        "ACTION     MODEL                                     WHAT",
        "create     mlx-community/Llama-3.2-1B-Instruct-4bit  replicas 2",
        "change     mlx-community/Qwen3-30B-A3B-4bit          sharding Pipeline ->",
        "           Tensor, replicas 3 -> 1, priority 500 -> 900",
        "delete     mlx-community/Meta-Llama-3.1-70B-Inst...  not in the file: deleted",
        "           (bbbbbbbb)",
        "unchanged  m/x                                       as the file asks",
        "plan: 1 to create, 1 to change, 1 to delete, 1 unchanged",
    ]


def test_a_refusal_says_what_was_applied_and_what_was_not() -> None:
    current = [deployment(CreateDeploymentRequest(model_id=MODELS[0]), "d0")]
    desired = [
        CreateDeploymentRequest(model_id=MODELS[0], sharding=Sharding.TENSOR),
        CreateDeploymentRequest(model_id=MODELS[1]),
    ]
    plan = plan_deployments(desired, current, prune=False)
    create, change = plan.actions
    error = ApiError("sharding: Extra inputs are not permitted", 422)
    assert refusal_report(plan, [create], change, error).splitlines() == [
        f"change of {MODELS[0]} (deployment d0) (sharding Pipeline -> Tensor) refused: "
        "sharding: Extra inputs are not permitted",
        "this service cannot change sharding in place (an older exo-deploy): delete the "
        "deployment and apply again to recreate it",
        f"applied before it: create of {MODELS[1]}",
    ]
    assert refusal_report(plan, [], create, ApiError("full", 422)).splitlines() == [
        f"create of {MODELS[1]} refused: full",
        "applied before it: nothing",
        f"not applied: change of {MODELS[0]} (deployment d0)",
    ]
    # A refusal of the value, not of the key, is the service's message alone.
    tensor = ApiError(f"{MODELS[0]} does not support tensor sharding; use Pipeline", 400)
    assert len(refusal_report(plan, [create], change, tensor).splitlines()) == 2
    # No answer: the step may have been done, so it is not said to be refused.
    unanswered = ApiError("cannot reach the master", kind="unreachable")
    assert refusal_report(plan, [], create, unanswered).splitlines()[0] == (
        f"create of {MODELS[1]} failed: cannot reach the master"
    )


# --- bad files: each names what is wrong and where ------------------------------------------


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        pytest.param(
            "deployments:\n  - model: m/x\n    replicas: [\n",
            [
                "f.yaml:4:1: YAML syntax error: expected the node content, but found '<stream end>'"
                " (while parsing a flow node)"
            ],
            id="syntax",
        ),
        pytest.param(
            "deployments:\n  - model: 'm/x\n",
            [
                "f.yaml:3:1: YAML syntax error: found unexpected end of stream (while scanning a "
                "quoted scalar begun at line 2, column 12)"
            ],
            id="unclosed-quote",
        ),
        pytest.param(
            "deployments:\n  - model: m/x\n    replica: 2\n",
            [
                "f.yaml:3:5: unknown key 'replica' in deployment 1 (known: model, sharding, "
                "instance_meta, min_nodes, replicas, standby, priority, preempt, repair)"
            ],
            id="unknown-key",
        ),
        pytest.param(
            "deployment:\n  - model: m/x\n",
            ["f.yaml:1:1: unknown key 'deployment' at the top (known: version, deployments)"],
            id="unknown-top-key",
        ),
        pytest.param(
            "deployments:\n  - model: m/x\n    replicas: 17\n    preempt: yes please\n",
            [
                "f.yaml:3:15: replicas: Input should be less than or equal to 16 (got 17)",
                "f.yaml:4:14: preempt: Input should be a valid boolean (got 'yes please')",
            ],
            id="bad-values",
        ),
        pytest.param(
            "deployments:\n  - model: m/x\n    sharding: Tensr\n",
            ["f.yaml:3:15: sharding: Input should be 'Pipeline' or 'Tensor' (got 'Tensr')"],
            id="bad-enum",
        ),
        pytest.param(
            "deployments:\n  - model: m/x\n  - model: m/y\n  - model: m/x\n    replicas: 2\n",
            ["f.yaml:4:5: model m/x is listed twice (first at line 2): a model has one deployment"],
            id="duplicate-model",
        ),
        pytest.param(
            "deployments:\n  - replicas: 2\n",
            ["f.yaml:2:5: model: required in deployment 1 (the model to deploy)"],
            id="no-model",
        ),
        pytest.param(
            "deployments:\n  - model: m/x\n    replicas: 2\n    replicas: 3\n",
            ["f.yaml:4:5: 'replicas' given twice in deployment 1 (first at line 3)"],
            id="repeated-key",
        ),
        pytest.param(
            "- model: m/x\n",
            [
                "f.yaml:1:1: expected a mapping with 'deployments:', a list of {model: ...} "
                "(and 'version: 1'), got a list"
            ],
            id="top-is-a-list",
        ),
        pytest.param(
            "deployments:\n  model: m/x\n",
            ["f.yaml:2:3: deployments: should be a list, got a mapping"],
            id="deployments-not-a-list",
        ),
        pytest.param(
            "deployments:\n  - m/x\n",
            ["f.yaml:2:5: deployment 1 should be a mapping (model: ...), got the value 'm/x'"],
            id="entry-not-a-mapping",
        ),
        pytest.param(
            "version: 2\ndeployments: []\n",
            ["f.yaml:1:10: version: this exo-deploy reads version 1, got 2"],
            id="version",
        ),
        pytest.param(
            "",
            [
                "f.yaml: the file is empty: expected a mapping with 'deployments:', a list of "
                "{model: ...} (and 'version: 1')"
            ],
            id="empty",
        ),
        pytest.param(
            "version: 1\n",
            ["f.yaml:1:1: no 'deployments:' list (write 'deployments: []' for none)"],
            id="no-deployments",
        ),
        pytest.param(
            "deployments:\n  - model: m/x\n    repair: sometimes\n",
            ["f.yaml:3:13: repair: Input should be 'auto' or 'report' (got 'sometimes')"],
            id="repair-neither-auto-nor-report",
        ),
    ],
)
def test_a_bad_file_names_each_problem_with_its_line(text: str, problems: list[str]) -> None:
    with pytest.raises(DeploymentFileError) as raised:
        parse_deployment_file(text, "f.yaml")
    assert raised.value.lines() == problems


@settings(max_examples=500)
@given(
    st.one_of(
        st.text(),
        # YAML-shaped: the file's keys and values, tags and indentation run together.
        st.lists(
            st.sampled_from(
                [
                    "deployments:",
                    "version: 1",
                    "  - ",
                    "model: m/x",
                    "replicas: 2",
                    "    ",
                    "\n",
                    "[",
                    "]",
                    "{",
                    "}",
                    "!!int ",
                    "!!bool ",
                    "!!timestamp ",
                    "!!binary ",
                    "!!set ",
                    "%YAML 1.1\n",
                    "\x00",
                    "!!python/object:x ",
                    "!foo ",
                    "*a",
                    "&a ",
                    "<<: ",
                    "'",
                    '"',
                    "- ",
                    ": ",
                    "---",
                    "\t",
                    "~",
                    "2.5",
                    "true",
                ]
            ),
            max_size=30,
        ).map("".join),
    )
)
def test_any_text_is_read_or_refused_with_problems_never_a_crash(text: str) -> None:
    try:
        requests = parse_deployment_file(text, "f")
    except DeploymentFileError as exc:
        assert exc.lines()
        assert all(line.startswith("f:") for line in exc.lines())
    else:
        assert all(isinstance(request, CreateDeploymentRequest) for request in requests)


def test_a_value_yaml_will_not_make_is_named() -> None:
    with pytest.raises(DeploymentFileError) as raised:
        parse_deployment_file(
            "version: !!int abc\ndeployments:\n  - model: !!python/object:os.system x\n"
            "    replicas: 99\n",
            "f",
        )
    assert raised.value.lines() == [
        "f:1:10: cannot read this value: not a valid !!int: 'abc'",
        "f:3:12: cannot read this value: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object:os.system'",
        "f:4:15: replicas: Input should be less than or equal to 16 (got 99)",
    ]


def test_the_file_takes_what_the_api_takes() -> None:
    text = (
        "version: 1\n"
        "deployments:\n"
        "  - model: m/x\n"
        "    min_nodes: 2.0\n"  # a whole number, as the API reads JSON's 2.0
        "    sharding: Tensor\n"
        "    instance_meta: MlxJaccl\n"
        "    standby: 0\n"
        "    priority: 1000\n"
        "    preempt: true\n"
        "  - model: m/y\n"
    )
    assert parse_deployment_file(text, "f") == [
        CreateDeploymentRequest(
            model_id="m/x",
            min_nodes=2,
            sharding=Sharding.TENSOR,
            instance_meta=InstanceMeta.MLX_JACCL,
            standby=0,
            priority=1000,
            preempt=True,
        ),
        CreateDeploymentRequest(model_id="m/y"),
    ]
    assert parse_deployment_file("deployments: []\n", "f") == []
