"""The simulation exo-deploy is demonstrated and tested with, apart from the product.

A real operator runs the bridge beside a stock exo (``keeper.bridge``), the CLI and the
dashboard. To show and test that without a cluster of Macs, this package holds our own master
with its keeper (``master``), simulated nodes (``node``) and the link between them (``link``),
local clusters of them and the demo (``cluster``), a stand-in for a stock exo's API served over
our master (``exo_standin``) and the fault soak (``soak``). The product never imports it; only
the CLI's commands that start it do (``tests/pure/test_layering.py``, docs/design.md §2.1).
"""
