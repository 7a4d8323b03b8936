"""The shell runtime every service shares: time, the durable event log, the hosted keeper, the
refusals a service answers with, the deployments commands and the blocking process entry.

The master, the bridge and the simulated nodes are siblings built on this package; keeping it out
of ``keeper.master`` is what lets the bridge and the nodes import nothing from the master.
"""
