"""The master service: event log, router, keeper loop, membership and the HTTP API."""
