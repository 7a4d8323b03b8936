"""Clients of the APIs we serve, for the programs that drive them from outside: the CLI and the
TUI. They import only the data model and HTTP, never a service.
"""
