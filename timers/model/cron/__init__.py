"""Recurring timers: cron expressions in a time zone, or fixed intervals.

One module per concern:

- :mod:`timers.model.cron.definition`: names, :class:`Recurrence`, validation, its stored JSON;
- :mod:`timers.model.cron.state`: the state codec ``v|last|prev|paused|run|anchor`` (shared with
  the Lua prelude);
- :mod:`timers.model.cron.planner` and :mod:`timers.model.cron.schedule`: pure maths (what to
  do with a claimed occurrence; cron in a time zone, through clock changes).

The listener's I/O around a run, :class:`~timers.listener.cron_hook.RecurrenceHook`, is in the
worker layer (:mod:`timers.listener.cron_hook`): this package is pure and light for producers.
"""

from __future__ import annotations

from timers.model.cron.definition import (
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
from timers.model.cron.planner import CATCH_UP_VALUES, NONE_GRACE, CatchUp, Step, plan
from timers.model.cron.state import State, read_state

__all__ = [
    "CATCH_UP_VALUES", "MAX_NAME_LENGTH", "NONE_GRACE", "RECURRENCE_OPTION", "VERSION_OPTION",
    "CatchUp", "Recurrence", "State", "Step", "check_name",
    "decode_recurrences", "name_from_option", "name_option", "occurrence_due", "occurrence_id",
    "plan", "read_state", "recurrence",
]

