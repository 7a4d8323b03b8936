"""``exo-deploy bridge``: deployments for a stock exo cluster, through exo's own HTTP API.

A stock exo master has no keeper. The bridge runs ours beside it: it follows exo's State by
polling ``GET /state``, keeps the deployments itself (durably, in the master's event log format),
steps the unchanged ``Keeper`` on exo's State with its deployments merged in, and acts only
through exo's public API: it asks exo where to place (``GET /instance/placement``), creates
exactly that instance (``POST /instance``) and deletes with ``DELETE /instance/{id}``. It serves
the deployments API (docs/design.md §7.2), so the TUI and the CLI work against it as against our
master.

- ``exo_wire``: exo's JSON formats (instances, model cards, the model list) read and written
  without losing what exo's cards carry beyond ours (pure);
- ``placement_choice``: exo's placement and preview answers read and chosen from (pure);
- ``exo_bounds``: how much of an answer of exo's is read, and how deeply nested it may be
  (pure);
- ``exo_client``: the HTTP calls to exo, each with a deadline and one error type per outcome
  (exo's State read strictly by ``keeper.model.exo_state``), each answer read within bounds;
- ``service``: the loop, the deployments and what the keeper's events become;
- ``health``: ``GET /healthz``'s body, and whether the steps are failing;
- ``in_flight``: instances sent to exo and not shown yet: resent as themselves, given up only
  when exo clearly dropped them (pure);
- ``doomed``: instances to delete in exo until exo's State shows them gone;
- ``api`` / ``server``: the HTTP API and running it.
"""
