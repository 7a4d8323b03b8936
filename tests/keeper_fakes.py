"""What a test's stand-in keeper does about cordons and drains: nothing (``KeeperLike``)."""

from __future__ import annotations

from keeper.model.events import AnyEvent
from keeper.model.state import State


class NoDrains:
    def cordon(self, name: str, state: State) -> list[AnyEvent]:
        return []

    def uncordon(self, name: str, state: State) -> list[AnyEvent]:
        return []

    def drain(self, name: str, force: bool, when: str, state: State) -> list[AnyEvent]:
        return []

    def drain_note(self, name: str) -> str | None:
        return None
