"""Instances the bridge must delete in exo, kept until exo shows them gone.

Deleting a deployment deletes the keeper's instance of it, but exo may not be reachable at that
moment, may not show the instance yet (the keeper placed it a second ago: exo accepted the
command and has not applied it), or may accept the DELETE and lose it (its master moving). So a
deletion is not a single call: the instance id is *doomed*, and every poll of exo's State sends
``DELETE /instance/{id}`` again while the State still shows it (at most every
``RESEND_DELETE_S``), until the State no longer shows it after a DELETE was accepted, or it never
appeared within ``PLACEMENT_TIMEOUT`` (exo never applied its creation), or longer for an instance
whose creation exo may still apply (``keeper.bridge.in_flight``).

The ids are written to ``DATA_DIR/doomed-instances.json`` (temp file + rename) whenever the set
changes, so a bridge restarted in between still deletes them; with no data dir they live in
memory only, like the deployments.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from keeper.model.constants import PLACEMENT_TIMEOUT

log = logging.getLogger(__name__)

DOOMED_FILE = "doomed-instances.json"
# exo applies an accepted command within a second; a DELETE still not applied after this long was
# lost (its master moved) and is sent again.
RESEND_DELETE_S = 5.0


@dataclass
class _Doom:
    watch_until: float  # give up waiting for an instance exo never showed, after this
    accepted_at: float | None = None  # when exo last accepted its DELETE


class DoomedInstances:
    def __init__(
        self, data_dir: Path | None, persist: Callable[[list[str]], None] | None = None
    ) -> None:
        self._path = data_dir / DOOMED_FILE if data_dir is not None else None
        # Where the ids go instead of the file (a shared store), called whenever they change.
        self._persist = persist
        self._doomed: dict[str, _Doom] = {}

    def load(self, now: float) -> None:
        """Read the ids a previous run left (each watched anew from ``now``)."""
        if self._path is None or not self._path.exists():
            return
        try:
            payload: Any = json.loads(self._path.read_text())
            ids = cast(list[Any], payload["instanceIds"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s (%s)", self._path, exc)
            return
        for instance_id in ids:
            if isinstance(instance_id, str):
                self._doomed[instance_id] = _Doom(now + PLACEMENT_TIMEOUT)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._doomed

    def __len__(self) -> int:
        return len(self._doomed)

    def ids(self) -> list[str]:
        return sorted(self._doomed)

    def add(self, instance_id: str, now: float, watch_s: float = PLACEMENT_TIMEOUT) -> None:
        """Doom it; if exo's State never shows it, forget it after ``watch_s``."""
        doom = self._doomed.get(instance_id)
        if doom is None:
            self._doomed[instance_id] = _Doom(now + watch_s)
            self._save()
        elif doom.watch_until < now + watch_s:
            doom.watch_until = now + watch_s

    def due(self, shown: set[str] | frozenset[str], now: float) -> list[str]:
        """Forget the doomed instances that are settled; the ids to send DELETE for now."""
        settled = [
            instance_id
            for instance_id, doom in self._doomed.items()
            if instance_id not in shown
            and (doom.accepted_at is not None or now >= doom.watch_until)
        ]
        for instance_id in settled:
            del self._doomed[instance_id]
        if settled:
            self._save()
        return [
            instance_id
            for instance_id, doom in sorted(self._doomed.items())
            if instance_id in shown
            and (doom.accepted_at is None or now - doom.accepted_at >= RESEND_DELETE_S)
        ]

    def accepted(self, instance_id: str, now: float) -> None:
        """exo accepted the DELETE (or no longer knew the instance)."""
        doom = self._doomed.get(instance_id)
        if doom is not None:
            doom.accepted_at = now

    def clear(self) -> None:
        """Forget every id here (not in the store): this bridge stops acting."""
        self._doomed.clear()

    def save(self) -> None:
        """Write the ids again (a shared store that refused the last write)."""
        self._save()

    def _save(self) -> None:
        if self._persist is not None:
            self._persist(sorted(self._doomed))
            return
        if self._path is None:
            return
        temp = self._path.with_suffix(".tmp")
        temp.write_text(json.dumps({"instanceIds": sorted(self._doomed)}) + "\n")
        with temp.open("rb") as file:
            os.fsync(file.fileno())
        os.replace(temp, self._path)
