"""The soak: faults under load, proving that no request is lost, no model ever has two
instances, and every model comes back by itself.

Two ways to run the same soak (``keeper.sim.soak.run``): against a master and node processes on this
machine (``soak_main``, ``exo-deploy soak``) and against an in-process cluster in virtual time
(``soak_sim_main``, ``exo-deploy soak-sim``). It sits above ``keeper.sim.node``; only the CLI
imports it.
"""

from keeper.sim.soak.main import soak_main, soak_sim_main

__all__ = ["soak_main", "soak_sim_main"]
