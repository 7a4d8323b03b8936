"""The keeper's timing constants, in seconds: names and values are pinned, and
docs/design.md §5.10 gives their reasons."""

from typing import Final

# A new master waits this long before placing anything, so nodes can reconnect and report the
# instances they already run; placing sooner would duplicate them.
STARTUP_GRACE: Final = 15.0
# How long the keeper waits for its own placement to show up in the state (the state trails the
# events by a round trip through the router) before it may place again.
PLACEMENT_TIMEOUT: Final = 30.0
# How often a deployment that nothing can hold is tried again when the cluster has not changed.
UNPLACEABLE_RETRY: Final = 30.0
# The wait after the first placement lost before it was ready; doubles per failure in a row.
FIRST_BACKOFF: Final = 10.0
# The cap on that doubling, so a flapping deployment is still retried once a minute.
MAX_BACKOFF: Final = 60.0
# The environment variable every service and command reads its bearer token from (the services
# in keeper.runtime.entry, the clients in keeper.client.token_options): one name, here, below both.
TOKEN_ENV: Final = "EXO_DEPLOY_TOKEN"
