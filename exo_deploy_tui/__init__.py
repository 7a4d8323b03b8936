"""exo-deploy-tui: the operator dashboard for deployments on an exo cluster."""
