"""Simulated exo nodes and the harnesses that run them: over a WebSocket as separate processes
(``exo-deploy node`` / ``exo-deploy cluster``) or in-process against a master in virtual time."""
