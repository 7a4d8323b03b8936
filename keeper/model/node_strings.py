"""Every string a node gives, capped before it reaches the State, the log or a webhook
(docs/design.md §6.7, "Bounds").

A node's frame is at most 1 MiB (§6.4), but within it a friendly name, an interface's name or a
runner's error could be nearly all of that: copied into the State, every event log line, every
``/state`` answer, every dashboard frame, the log and each webhook's notice text. So the master
cuts each node-given string to a length that holds every real value, the cut marked with
``CUT_MARK`` so a reader sees it was cut rather than taking it as the value. A pure function of
the message, in the data model's floor, so the master's membership
(``keeper.sim.master.membership``)
calls it and the tests hold it to its rule without a socket.

Chat text is not capped here: it is the model's answer, bounded by the frame, and goes only to
the client that asked.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from pydantic import BaseModel

# The longest string a node may give: the longest model id the API takes (a node reports the
# models it downloads) fits, and so does any interface name, address, chip or OS version.
MAX_NODE_STRING = 512
# A friendly name is shown in every table, log line and notice: 64 characters is a host name's
# longest label (RFC 1035: 63) and fits the TUI's node column with room to spare.
MAX_FRIENDLY_NAME = 64
# Ends a cut string, inside its cap: one character that no real value ends with.
CUT_MARK = "…"

M = TypeVar("M", bound=BaseModel)


def cut(text: str, limit: int) -> str:
    """``text``, or its first characters and ``CUT_MARK``, ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    return text[: limit - len(CUT_MARK)] + CUT_MARK


def _capped(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return cut(value, limit) if len(value) > limit else value
    if isinstance(value, BaseModel):
        return capped(value, limit)
    if isinstance(value, list):
        items = cast(list[Any], value)
        return [_capped(item, limit) for item in items]
    if isinstance(value, dict):
        pairs = cast(dict[Any, Any], value)
        return {_capped(key, limit): _capped(item, limit) for key, item in pairs.items()}
    return value


def capped(model: M, limit: int = MAX_NODE_STRING) -> M:
    """``model`` with each string in it (fields, lists, mappings, nested models) cut to
    ``limit`` characters, and a ``friendly_name`` to ``MAX_FRIENDLY_NAME``; the model itself
    when nothing is that long."""
    update: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        own = MAX_FRIENDLY_NAME if name == "friendly_name" else limit
        new = _capped(value, own)
        if new is not value and new != value:
            update[name] = new
    return model.model_copy(update=update) if update else model
