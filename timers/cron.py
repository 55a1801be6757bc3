"""Recurring timers (cron expressions and intervals). Placeholder: being built."""

from __future__ import annotations

from typing import Any

from timers.encoding import Record
from timers.keys import Keyspace
from timers.runs import Outcome, Run

RECURRENCE_OPTION = "r"
"""Record option that marks a timer as an occurrence of a recurrence (value: its name)."""


class RecurrenceHook:
    """What a listener does around a run of an occurrence of a recurring timer.

    ``before_run`` is awaited after the claim and before the task runs: it schedules the
    next occurrence and may return an :class:`Outcome` (e.g. skipped) instead of running.
    ``after_run`` is awaited once the run has ended, before its ending is written.
    """

    def __init__(self, redis: Any, keys: Keyspace) -> None:
        self.redis = redis
        self.keys = keys

    async def before_run(self, run: Run, record: Record, started_ms: float) -> Outcome | None:
        return None

    async def after_run(self, run: Run, record: Record, outcome: Outcome) -> None:
        return None
