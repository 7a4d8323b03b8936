"""Clusters the TUI's tests build, shared by the pure model tests and the app tests."""

from __future__ import annotations

from exo_deploy_tui.testing import ClusterBuilder


def three_nodes() -> ClusterBuilder:
    return (
        ClusterBuilder()
        .node("studio", ram_gb=96, free_gb=60)
        .node("mini-a", ram_gb=24, free_gb=20)
        .node("mini-b", ram_gb=24, free_gb=14)
        .link_all()
    )
