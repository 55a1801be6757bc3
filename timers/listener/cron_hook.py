"""The listener's side of recurrences: around a run of an occurrence, schedule the next.

The next occurrence is scheduled when the current one runs, by the listener that claimed
it (:meth:`RecurrenceHook.before_run`), in one script call that schedules it only if the
state still names this occurrence as the latest (``last == due``) under the same version.
A rerun after a crash, a second listener or a racing change therefore never schedules the
same occurrence twice, and no listener needs to be a leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from timers.listener.retrying import RETRYABLE, ReconnectDelays
from timers.model.cron.definition import (
    RECURRENCE_OPTION,
    VERSION_OPTION,
    Recurrence,
    name_from_option,
    occurrence_due,
)
from timers.model.cron.planner import plan
from timers.model.cron.schedule import from_ms
from timers.model.cron.state import State
from timers.model.encoding import Record, as_text, escape_id
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.runs import Outcome, Run
from timers.model.wire import Option
from timers.store.scripts import Scripts

log = logging.getLogger("timers.cron")



@dataclass(frozen=True)
class _Step:
    """One call of ``cron_next.lua`` for an occurrence of ``name`` due at ``due``.

    ``successor``/``record``: the next occurrence to schedule (if ``last == due``); with
    ``defer`` only if this run does not go ahead (another run holds the slot): else
    :meth:`RecurrenceHook.after_run` schedules it. ``take``/``release``: a run token that
    takes or releases the overlap slot; ``group``: where the runs' leases are.
    """

    name: str
    version: int
    due: int
    successor: int | None = None
    record: str = ""
    defer: bool = False
    take: str = ""
    release: str = ""
    group: str = DEFAULT_GROUP
    """The running occurrence's group: its runs hold their leases in its running set."""


def _skipped(reason: str) -> Outcome:
    return Outcome("skipped", "Skipped", reason)


class RecurrenceHook:
    """What a listener does around a run of an occurrence of a recurring timer.

    ``before_run`` is awaited after the claim and before the task runs: it schedules the
    next occurrence and may return an :class:`Outcome` (e.g. skipped) instead of running.
    ``after_run`` is awaited once the run has ended, before its ending is written.
    """

    AFTER_ATTEMPTS = 5

    def __init__(self, redis: Any, keys: Keyspace, scripts: Scripts | None = None) -> None:
        """``scripts``: the listener's, so ``cron_next`` is registered once."""
        self.redis = redis
        self.keys = keys
        self.scripts = scripts or Scripts(redis, keys)
        self._after: dict[str, _Step] = {}  # run token -> what after_run still has to do

    async def before_run(self, run: Run, record: Record, started_ms: float) -> Outcome | None:
        name = name_from_option(record.options[RECURRENCE_OPTION])
        field = escape_id(name)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(self.keys.recurrences, field)
            pipe.hget(self.keys.recurrence_states, field)
            definition, raw_state = await pipe.execute()
        if definition is None or raw_state is None:
            return _skipped(f"recurrence {name!r} was removed")
        current = Recurrence.from_redis(name, definition, raw_state)
        state = State.decode(raw_state)
        if state.paused:
            return _skipped(f"recurrence {name!r} is paused")
        version = _int(record.options.get(VERSION_OPTION))
        if version != state.version:
            # Claimed before a change that has scheduled the next occurrence already:
            # it was due under the definition it was made for, so it runs.
            return None
        due = occurrence_due(run.timer_id) or run.waited_from_ms
        now = int(started_ms)
        plan_ = plan(current.schedule(from_ms(state.anchor)), current.catch_up,
                     current.max_lateness, due, now,
                     rerun=run.reruns > 0 or Option.ATTEMPTS in record.options,
                     lateness_ms=now - run.waited_from_ms)
        _, successor_record = current.occurrence(version, plan_.successor, 1 << 62)
        step = _Step(name, version, due, plan_.successor, successor_record, plan_.defer,
                     take=run.token if plan_.run and not current.overlap else "",
                     group=record.options.get(Option.GROUP) or DEFAULT_GROUP)
        status, holder = await self._call(step)
        if status != "ok":
            return None if status == "stale" else _skipped(f"recurrence {name!r} was {status}")
        if not plan_.run:
            return _skipped(plan_.reason)
        if holder:
            return _skipped(f"the previous run of {name!r} (run {holder}) is still running "
                            f"and overlap is off")
        if step.take or step.defer:
            self._after[run.token] = replace(
                step, successor=step.successor if step.defer else None, defer=False,
                take="", release=step.take)
        return None

    async def after_run(self, run: Run, record: Record, outcome: Outcome) -> None:
        step = self._after.pop(run.token, None)
        if step is None:
            return
        delays = ReconnectDelays()
        for attempt in range(self.AFTER_ATTEMPTS):
            try:
                await self._call(step)
                return
            except RETRYABLE as exc:
                if attempt + 1 == self.AFTER_ATTEMPTS:
                    if step.successor is None:
                        # the overlap slot frees itself once the run's lease is gone
                        log.warning("could not release the overlap slot of %s: %s",
                                    step.name, exc)
                        return
                    raise  # the listener hands the run back: its rerun schedules the next
                await asyncio.sleep(delays.next())

    async def _call(self, step: _Step) -> tuple[str, str]:
        reply = await self.scripts.cron_next(
            name_field=escape_id(step.name), version=step.version, due_ms=step.due,
            successor_ms=step.successor, record=step.record, defer=step.defer,
            take=step.take, release=step.release, group=step.group)
        return as_text(reply[0]), as_text(reply[1])


def _int(value: str | None) -> int:
    with contextlib.suppress(TypeError, ValueError):
        return int(value)  # type: ignore[arg-type]
    return -1
