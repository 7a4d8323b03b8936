"""What ``exo-deploy node`` and ``exo-deploy cluster`` offer a simulated node before one runs:
the defaults their flags show and the faults ``--fault`` names.

Apart from ``sim_node`` so that the command's parser reads them without importing the node
itself (docs/design.md §10, "Start-up"); ``sim_node`` takes them from here.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["DEFAULT_DISK_GB", "DEFAULT_DOWNLOAD_MB_PER_S", "SIM_FAULTS", "SimFault"]

# A simulated node's disk unless told otherwise: room for every catalog model at once, DeepSeek
# V3.1 (378 GiB) and Llama 3.3 70B included, with room to spare, so only a test that asks for a
# small disk ever sees one fill.
DEFAULT_DISK_GB = 1000.0
# How fast a simulated node downloads unless told otherwise, in MB/s (MiB, as GB are GiB here).
# A real node fetches from Hugging Face at about 100 MB/s; at that rate every test and demo
# would wait minutes for models. At 2000 MB/s a download takes about as long as the default
# load at 2 GB/s: the small models most tests and the demo place arrive in a fraction of a
# second, and the largest a test places (Qwen3-30B, 16.4 GiB) in about 8 s.
DEFAULT_DOWNLOAD_MB_PER_S = 2000.0
# The ways a simulated node can be told to misbehave (``exo-deploy node --fault``, docs/design.md
# §6.5), each one of the broken instances of §5.19: its runners stop in RunnerWarmingUp for good
# (a stalled start), reach Ready and then die with the instance still registered (hollow), or
# read Ready but fail every chat (failing chats).
SimFault = Literal["stall-warmup", "lose-runner", "fail-chats"]
SIM_FAULTS: tuple[SimFault, ...] = ("stall-warmup", "lose-runner", "fail-chats")
