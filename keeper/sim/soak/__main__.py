"""``python -m keeper.sim.soak ARGS`` is ``exo-deploy soak ARGS``; ``python -m keeper.sim.soak sim
ARGS``
is ``exo-deploy soak-sim ARGS``."""

import sys

from keeper.sim.soak.main import soak_main, soak_sim_main

if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["sim"]:
        sys.exit(soak_sim_main(arguments[1:]))
    sys.exit(soak_main(arguments))
