"""``python -m keeper.cli``: the ``exo-deploy`` command, as tests and local clusters start it."""

from keeper.cli import main

main()
