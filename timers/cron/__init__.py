"""Recurring timers: cron expressions in a time zone, or fixed intervals.

One module per concern:

- :mod:`timers.cron.definition`: names, :class:`Recurrence`, validation, its stored JSON;
- :mod:`timers.cron.state`: the state codec ``v|last|prev|paused|run|anchor`` (shared with
  the Lua prelude);
- :mod:`timers.cron.planner` and :mod:`timers.cron.schedule`: pure maths (what to do with a
  claimed occurrence; cron in a time zone, through clock changes);
- :mod:`timers.cron.hook`: :class:`RecurrenceHook`, the listener's I/O around a run.

Importing this package stays light for producers: the hook (and asyncio with it) is only
loaded when ``RecurrenceHook`` is first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from timers.cron.definition import (
    MAX_NAME_LENGTH,
    RECURRENCE_OPTION,
    VERSION_OPTION,
    Recurrence,
    check_name,
    decode_recurrences,
    name_from_option,
    name_option,
    occurrence_due,
    occurrence_id,
    recurrence,
)
from timers.cron.planner import CATCH_UP_VALUES, NONE_GRACE, CatchUp, Step, plan
from timers.cron.state import State, read_state

if TYPE_CHECKING:
    from timers.cron.hook import RecurrenceHook

__all__ = [
    "CATCH_UP_VALUES", "MAX_NAME_LENGTH", "NONE_GRACE", "RECURRENCE_OPTION", "VERSION_OPTION",
    "CatchUp", "Recurrence", "RecurrenceHook", "State", "Step", "check_name",
    "decode_recurrences", "name_from_option", "name_option", "occurrence_due", "occurrence_id",
    "plan", "read_state", "recurrence",
]


def __getattr__(name: str) -> Any:
    if name == "RecurrenceHook":
        from timers.cron.hook import RecurrenceHook

        return RecurrenceHook
    raise AttributeError(f"module 'timers.cron' has no attribute {name!r}")
