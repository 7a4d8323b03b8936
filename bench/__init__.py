"""Benchmarks: speed figures for the parts with targets, printed and never asserted.

`make bench` runs ``python -m bench``, which runs each section's ``run()`` in turn (see
``bench.__main__``). Unit tests stay free of timing assertions; the figures live here, where a
slow machine produces a slow number instead of a failing build.
"""

# (section name, module): the order `python -m bench` runs them in. A module that does not
# exist yet is skipped with a note, so sections can land independently.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("keeper", "bench.keeper_bench"),
    ("placement", "bench.placement_bench"),
    ("master", "bench.master_bench"),
    ("recovery", "bench.recovery_bench"),
    ("tui", "bench.tui_bench"),
    ("store", "bench.store_bench"),
    ("history", "bench.history_bench"),
    ("staging", "bench.staging_bench"),
    ("whatif", "bench.whatif_bench"),
    ("metrics", "bench.metrics_bench"),
    ("takeover", "bench.takeover_bench"),
    ("failover", "bench.failover_bench"),
    ("bridgefail", "bench.bridge_failover_bench"),
    ("masterfail", "bench.master_failover_bench"),
    ("requests", "bench.requests_bench"),
)
