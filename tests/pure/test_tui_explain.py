"""The placement error explained in numbers (exo_deploy_tui.model.explain), from built States."""

from __future__ import annotations

from model_ids import QWEN

from exo_deploy_tui.model.explain import LINK, explain_placement
from exo_deploy_tui.testing import ClusterBuilder, node_id_for
from keeper.model.state import Backend, Deployment, InstanceMeta, NodeId, RDMAConnection, State

DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"
NO_MEMORY = "No cycles found with sufficient memory"
NO_RDMA = "Requested RDMA (MlxJaccl) but no RDMA-connected cycles available"


def three_nodes(
    *, linked: bool = True, mini_b: tuple[Backend, ...] = (Backend.MLX_METAL,)
) -> ClusterBuilder:
    builder = (
        ClusterBuilder()
        .node("studio", ram_gb=128, free_gb=96)
        .node("mini-a", ram_gb=32, free_gb=24)
        .node("mini-b", ram_gb=32, free_gb=24, backends=mini_b)
    )
    return builder.link_all() if linked else builder


def names(state: State) -> dict[NodeId, str]:
    return {n: i.friendly_name for n, i in state.node_identities.items()}


def explain(builder: ClusterBuilder, model: str, error: str, **options: object) -> str | None:
    builder.deployment(model, error=error)
    state = builder.state
    deployment = next(d for d in state.deployments.values() if d.model_card.model_id == model)
    deployment = deployment.model_copy(update=options)
    return explain_placement(deployment, state, names(state))


def test_memory_says_what_is_needed_and_the_most_a_connected_group_offers() -> None:
    why = explain(three_nodes(), DEEPSEEK, NO_MEMORY)
    assert why is not None
    assert why.startswith("needs 3")  # DeepSeek-V3.1 4-bit: hundreds of GB
    assert why.endswith(
        "the most any connected group offers is 144 GB (studio 96, mini-a 24, mini-b 24)"
    )


def test_memory_counts_only_nodes_that_reach_each_other() -> None:
    # No links: every node is a group of its own, so the best is the studio alone.
    why = explain(three_nodes(linked=False), DEEPSEEK, NO_MEMORY)
    assert why is not None and why.endswith("offers is 96 GB (studio 96)")


def test_memory_with_min_nodes_beyond_any_group_says_how_large_the_largest_is() -> None:
    why = explain(three_nodes(linked=False), QWEN, NO_MEMORY, min_nodes=2)
    assert why is not None
    assert "on at least 2 nodes" in why and why.endswith("the largest connected group has 1 node")


def test_rdma_names_the_socket_links_and_nodes_with_rdma_off() -> None:
    builder = three_nodes()
    studio, mini_a = node_id_for("studio"), node_id_for("mini-a")
    connections = {k: dict(v) for k, v in builder.state.topology.connections.items()}
    rdma = RDMAConnection(source_rdma_iface="rdma_en2", sink_rdma_iface="rdma_en2")
    connections[studio][mini_a] = [rdma]
    connections[mini_a][studio] = [rdma]
    topology = builder.state.topology.model_copy(update={"connections": connections})
    builder.state = builder.state.model_copy(update={"topology": topology})
    why = explain(builder, QWEN, NO_RDMA, instance_meta=InstanceMeta.MLX_JACCL)
    assert why == f"no RDMA links: mini-a{LINK}mini-b, mini-b{LINK}studio are socket links"


def test_backend_names_the_node_lacking_it() -> None:
    builder = three_nodes(mini_b=(Backend.MLX_CPU,))
    error = "No cycle where every node supports a backend in ['MlxMetal'] for m"
    why = explain(builder, QWEN, error, instance_meta=InstanceMeta.MLX_JACCL)
    assert why == "mini-b reports no MlxMetal (has MlxCpu)"


def test_apart_from_the_serving_nodes_leaves_them_out() -> None:
    builder = three_nodes().instance(DEEPSEEK, on=["studio"])
    error = f"no placement apart from the nodes serving {DEEPSEEK} (studio): {NO_MEMORY}"
    why = explain(builder, DEEPSEEK, error)
    assert why is not None
    assert why.startswith("without studio: needs ")
    assert why.endswith("offers is 48 GB (mini-a 24, mini-b 24)")


def test_an_error_it_does_not_know_or_none_gives_none() -> None:
    assert explain(three_nodes(), QWEN, "runner failed") is None
    state = three_nodes().state
    card = three_nodes().deployment(QWEN).state.deployments["dep-qwen3-0.6b-4bit"].model_card
    assert explain_placement(Deployment(deployment_id="d", model_card=card), state, {}) is None


def test_tensor_split_says_which_counts_divide_against_the_group_sizes() -> None:
    builder = three_nodes()
    builder.deployment(QWEN)
    card = builder.state.deployments["dep-qwen3-0.6b-4bit"].model_card
    odd = card.model_copy(update={"hidden_size": 1025, "num_key_value_heads": None})
    error = "No tensor sharding found for model with hidden_size 1025 candidate cycles"
    deployment = Deployment(deployment_id="d", model_card=odd, placement_error=error)
    why = explain_placement(deployment, builder.state, names(builder.state))
    assert why == "hidden_size 1025 splits no further; the connected groups have 3 node(s)"
    even = odd.model_copy(update={"hidden_size": 1024, "num_key_value_heads": 8})
    deployment = deployment.model_copy(update={"model_card": even})
    why = explain_placement(deployment, builder.state, names(builder.state))
    assert (
        why
        == "hidden_size 1024, 8 kv heads splits over 2 nodes; the connected groups have 3 node(s)"
    )


def test_the_nodes_the_keeper_left_out_as_suspect_or_dead_are_left_out_of_the_figure() -> None:
    """The keeper placed on the State without the nodes with a verdict and says so; the figure
    beside its words leaves out the same nodes (studio, dead, offered 96 of the 144 GB)."""
    builder = three_nodes().suspect("studio", phase="dead")
    error = f"{NO_MEMORY} for 300 GB (suspect or dead, left out: studio)"
    why = explain(builder, DEEPSEEK, error)
    assert why is not None
    assert why.startswith("without studio: needs ")
    assert why.endswith("offers is 48 GB (mini-a 24, mini-b 24)")


def test_the_serving_cordoned_and_suspect_nodes_the_keeper_left_out_are_left_out_too() -> None:
    builder = (
        three_nodes()
        .node("mini-c", ram_gb=32, free_gb=16)
        .link_all()
        .instance(DEEPSEEK, on=["mini-b"])
        .cordon("studio")
        .suspect("mini-a")
    )
    error = (
        f"no placement apart from the nodes serving {DEEPSEEK} (mini-b): {NO_MEMORY}"
        " (cordoned, left out: studio) (suspect or dead, left out: mini-a)"
    )
    why = explain(builder, DEEPSEEK, error)
    assert why is not None
    assert why.startswith("without mini-a, mini-b, studio: needs ")
    assert why.endswith("offers is 16 GB (mini-c 16)")
