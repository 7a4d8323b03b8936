"""The data model: exo's State and events with exo's JSON, ``apply``, the API's wire shapes, and
the rules every reader shares (readiness, history, refusals).

It is the lowest floor: it imports nothing else of ``keeper``, no clock, no I/O, so the keeper
core, every service, the CLI and the TUI can all read it (docs/design.md §2).
"""
