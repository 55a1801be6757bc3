"""The recurrence state codec: ``v|last|prev|paused|run|anchor``, one per recurrence.

The same format is read and written by the Lua prelude (``state_read``/``state_write`` in
``timers/store/lua/prelude.lua``); Python only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import as_text


@dataclass(frozen=True)
class State:
    """What the scripts keep per recurrence: ``v|last|prev|paused|run|anchor``.

    ``last`` is the due ms of the latest occurrence scheduled (pending while its timer is),
    ``prev`` the one before it; ``run`` the token of the run holding the overlap slot;
    ``anchor`` the start of an interval. Times are epoch ms, 0 for none.
    """

    version: int = 0
    last: int = 0
    prev: int = 0
    paused: bool = False
    run: str = ""
    anchor: int = 0

    @classmethod
    def decode(cls, raw: bytes | str) -> State:
        """Only the scripts write a state; Python reads it."""
        parts = as_text(raw).split("|")
        try:
            version, last, prev, paused, run, anchor = parts
            return cls(int(version), int(last), int(prev), paused == "1", run, int(anchor))
        except ValueError:
            raise MalformedTimerKey(f"unreadable recurrence state {as_text(raw)[:80]!r}") \
                from None


def read_state(raw: bytes | str | None) -> State:
    """The state as stored; a missing or unreadable one reads as a new recurrence's."""
    if raw is None:
        return State()
    try:
        return State.decode(raw)
    except MalformedTimerKey:
        return State()
