"""A master and its simulated nodes on one machine: in one process over memory channels (virtual
time), or as real processes behind partitioning proxies. It sits above both the master and the
nodes, which know nothing of each other.
"""
