"""A stand-in for a *stock* exo master (``exo-deploy master --exo-compat``): exo's own HTTP API,
shapes and refusals, served over our master's engine with its keeper off.

It imitates the system the bridge talks to, not our master, so it lives apart from
``keeper.sim.master``: it sits above the master (it runs one) and nothing but the CLI, the local
cluster and tests import it. Recordings of the real exo are its contract (docs/bridge.md).
"""
