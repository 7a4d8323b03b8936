"""The shell runtime every service shares: time, the durable event log, the hosted keeper, the
deployments commands, the command-line argument types and the blocking process entry (the
refusals a service answers with are the data model's, ``keeper.model.refusals``).

The master, the bridge and the simulated nodes are siblings built on this package; keeping it out
of ``keeper.sim.master`` is what lets the bridge and the nodes import nothing from the master.
"""
