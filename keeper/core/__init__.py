"""The pure core: the ``Keeper`` (``keeper.core.keeper``), its memory of each deployment
(``memo``), what it reads of the cluster (``view``) and placement (``placement``).

Pure functions of the State and ``now``: no clock, no I/O, no asyncio. It imports only the data
model, so hours of simulated faults run in seconds and every rule is mutation-checked
(docs/design.md §5).
"""
