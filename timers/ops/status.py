"""Where one timer is, in any state: ``status`` (running, pending or waiting and on what,
how it ended, or unknown), from the running runs, the pending indexes, the run history and
the failure records."""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Record, as_text, check_id, escape_id, unescape_id
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.history import EndKind, HistoryRecord, StoredHistory, TimerState
from timers.model.keys import Keyspace
from timers.model.wire import Option
from timers.ops import flow_views as views
from timers.ops.base import Call, Operation, live_heartbeats, ms_to_datetime, pairs
from timers.ops.failures import Failure
from timers.ops.history import redis_ms
from timers.ops.pending import PendingTimer, pending_of


@dataclass(frozen=True)
class TimerStatus:
    """Where one timer is: ``state``, and what that state knows.

    - pending / waiting: ``timer`` (its due time, args …); waiting says ``waiting_on``:
      ``key``, ``rate``, ``group`` (due, and no live listener serves its group, or the
      releases disagree on it) or ``retry`` (a failed attempt's backoff);
    - running: ``listener`` (its id, ``host:pid:…``) and ``since`` (the due time of the
      run: it started at or after it; the start itself is not stored), ``attempt``;
    - completed, skipped, dead, cancelled: ``ended`` (its history record); a dead timer
      past the history's retention whose failure record is kept: ``failure``;
    - unknown: never existed, or ended longer ago than the history and failure records
      keep.
    ``detail`` says it in one line.
    """

    id: str
    state: TimerState
    detail: str = ""
    waiting_on: str | None = None
    timer: PendingTimer | None = None
    listener: str | None = None
    since: datetime | None = None
    attempt: int | None = None
    ended: HistoryRecord | None = None
    failure: Failure | None = None


class StatusOperations:
    """The ``status`` read of :class:`timers.ops.operations.Operations` (a mixin)."""

    keys: Keyspace

    @abstractmethod
    def get_failures(self, timer_id: str) -> Operation[list[Failure]]:
        """Every failure record of a timer id (:class:`timers.ops.failures.FailureOperations`)."""

    def status(self, timer_id: str) -> Operation[TimerStatus]:
        """Where the timer is (see :class:`TimerStatus`): running, pending or waiting,
        else how it ended, else unknown. Three to six round trips; the running runs are
        read whole (``P|runrec``: as many as the fleet runs at once), the rest by id (an
        ended timer's expiry by the batch its history record names)."""
        escaped = escape_id(check_id(timer_id))
        now, runs, ended, beats, infos = yield [
            Call(command=("TIME",)),
            Call(command=("HGETALL", self.keys.running_records)),
            Call(command=("HGET", self.keys.history_records, escaped)),
            Call(command=("ZRANGE", self.keys.listeners, 0, -1, "WITHSCORES")),
            Call(command=("HGETALL", self.keys.listener_info)),
        ]
        stored = None if ended is None else StoredHistory.decode(unescape_id(escaped),
                                                                 as_text(ended))
        expiry = None
        if stored is not None and stored.record is not None:
            (expiry,) = yield [Call(command=("ZSCORE", self.keys.history_expiry, stored.batch))]
        if expiry is not None and float(expiry) <= redis_ms(now):
            stored = None  # past its retention: listeners trim it within about a second
        running = _running_of(runs, escaped)
        if running is not None:
            listener, due_ms, attempt = running
            since = ms_to_datetime(due_ms)
            return TimerStatus(timer_id, TimerState.RUNNING,
                               f"running on {listener} (due {views.utc_text(since)}, attempt "
                               f"{attempt})", listener=listener, since=since, attempt=attempt)
        found = yield from views.find_many(self.keys, [escaped])
        if found:
            served = {g for _, beat, _ in live_heartbeats(redis_ms(now), beats, infos)
                      for g in _groups(beat) if isinstance(g, str)}
            return _pending_status(timer_id, pending_of(found[0]), redis_ms(now), served)
        record = None if stored is None else stored.record
        if record is not None:
            return TimerStatus(timer_id, TimerState(record.outcome.value),
                               _ended_detail(record), ended=record)
        failures = yield from self.get_failures(timer_id)
        dead = [f for f in failures if f.record.kind != "rejected"]
        if dead:
            return TimerStatus(timer_id, TimerState.DEAD,
                               f"dead ({dead[0].record.error_type}: "
                               f"{dead[0].record.message[:200]}); its history record is "
                               "past retention, its failure record is kept", failure=dead[0])
        return TimerStatus(timer_id, TimerState.UNKNOWN,
                           "unknown: never existed, or ended longer ago than the history "
                           "keeps")


def _groups(beat: dict[str, Any]) -> list[Any]:
    """The groups a heartbeat names (a listener of no groups serves the default one); a
    heartbeat some other writer mangled names none."""
    groups = beat.get("groups") or [DEFAULT_GROUP]
    return groups if isinstance(groups, list) else []


def _running_of(runs: Any, escaped: str) -> tuple[str, int, int] | None:
    """(listener, due ms, attempt) of a run of the timer in ``HGETALL P|runrec``."""
    for _, value in pairs(runs):
        text = as_text(value)
        head, _, entry = text.partition("|")
        due, _, rest = entry.partition("|")
        if not rest.startswith(escaped + ":"):
            continue
        reruns, _, listener = head.partition("@")
        record = rest[len(escaped) + 1:]
        attempts = 0
        with contextlib.suppress(MalformedTimerKey, ValueError):
            attempts = int(Record.decode(record).options.get(Option.ATTEMPTS, "0"))
        try:
            return listener, int(due), attempts + int(reruns or 0) + 1
        except ValueError:
            continue
    return None


def _pending_status(timer_id: str, timer: PendingTimer, now_ms: int,
                    served: set[str]) -> TimerStatus:
    wait = timer.wait
    if wait is not None:
        return TimerStatus(timer_id, TimerState.WAITING, wait.describe(),
                           waiting_on=wait.kind, timer=timer)
    due_ms = timer.due.timestamp() * 1000
    if due_ms <= now_ms and timer.group not in served:
        return TimerStatus(timer_id, TimerState.WAITING,
                           f"waiting for a listener of group {timer.group} (due "
                           f"{views.utc_text(timer.due)}; no live listener serves it)",
                           waiting_on="group", timer=timer)
    if timer.attempts:
        return TimerStatus(timer_id, TimerState.WAITING,
                           f"waiting to retry: attempt {timer.attempts + 1} due "
                           f"{views.utc_text(timer.due)} ({timer.attempts} failed)",
                           waiting_on="retry", timer=timer)
    return TimerStatus(timer_id, TimerState.PENDING, f"pending, due {views.utc_text(timer.due)}",
                       timer=timer)


def _ended_detail(record: HistoryRecord) -> str:
    when = views.utc_text(ms_to_datetime(record.ended * 1000))
    if record.outcome is EndKind.CANCELLED:
        return f"cancelled {when} by {record.listener or '?'}"
    took = "" if record.duration_ms is None else f", ran {record.duration_ms} ms"
    late = "" if record.lateness_ms is None else f", started {record.lateness_ms} ms late"
    error = f": {record.error}" if record.error else ""
    return (f"{record.outcome.value} {when} on {record.listener or '?'} (attempt "
            f"{record.attempts}{took}{late}){error}")
