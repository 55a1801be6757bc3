"""What a timer's page reads, and the actions the dashboard's forms post.

Each action takes the client and the posted form fields and returns the page to go back to
and a notice of what it did; what it cannot do (a timer no longer pending, a bad delay)
comes back as that notice, never as a half-done change. The notice travels in a signed
cookie (:meth:`timers.web.auth.Guard.note_cookie`), never in the query string, so no link
can put words on a page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from timers.exceptions import TimersError
from timers.model.due import parse_delay
from timers.model.history import TimerState
from timers.model.wire import FailureRecord
from timers.ops.failures import Failure
from timers.ops.pending import PendingTimer
from timers.ops.status import TimerStatus
from timers.producer.client import Timers


@dataclass(frozen=True)
class TimerView:
    """What a timer's page shows: where the timer is (:meth:`timers.Timers.status`: pending
    or waiting with its record, running, or how it ended) and, for a dead timer, its failure
    records (error, traceback, and what a retry schedules again)."""

    id: str
    status: TimerStatus | None
    """None for an id no timer can have."""
    failures: tuple[Failure, ...] = ()

    @property
    def timer(self) -> PendingTimer | None:
        """The pending (or waiting) timer, None once it runs or ended."""
        return None if self.status is None else self.status.timer

    @property
    def known(self) -> bool:
        """Whether timers knows anything of it (pending, running, or its end is kept)."""
        return self.status is not None and self.status.state is not TimerState.UNKNOWN

    @property
    def error(self) -> FailureRecord | None:
        """A dead timer's latest failure record (its error and traceback)."""
        return self.failures[0].record if self.failures else None

    @classmethod
    def read(cls, timers: Timers, timer_id: str) -> TimerView | None:
        """The timer ``timer_id`` (None for an empty id; an unknown one for an id no timer
        can have). A Redis that does not answer is raised, not shown as "unknown"."""
        if not timer_id:
            return None
        try:
            status = timers.status(timer_id)
        except ValueError:  # (InvalidTimerId, MalformedTimerKey)
            return cls(timer_id, None)
        failures: tuple[Failure, ...] = ()
        if status.state is TimerState.DEAD:
            failures = tuple(f for f in timers.get_failures(timer_id)
                             if f.record.kind != "rejected")
        return cls(timer_id, status, failures)


@dataclass(frozen=True)
class Back:
    """Where an action sends the browser (a path with its query) and what it says there."""

    path: str
    said: str


def _back(path: str, said: str, **query: str) -> Back:
    return Back(f"{path}?{urlencode(query)}" if query else path, said)


def _cancel(timers: Timers, fields: dict[str, str]) -> Back:
    done = timers.cancel(fields.get("id", ""))
    return _back("/timer", id=fields.get("id", ""), said="cancelled" if done else
                 "not pending any more: nothing to cancel")


def _reschedule(timers: Timers, fields: dict[str, str]) -> Back:
    timer_id = fields.get("id", "")
    try:
        delay = 0.0 if fields.get("action") == "run_now" else parse_delay(fields.get("in", ""))
    except ValueError as exc:
        return _back("/timer", id=timer_id, said=f"not rescheduled: {exc}")
    done = timers.reschedule(timer_id, in_=delay)
    return _back("/timer", id=timer_id, said="rescheduled" if done else
                 "not pending any more: nothing to reschedule")


def _retry(timers: Timers, fields: dict[str, str]) -> Back:
    """Retry the dead timer's failure record ``failure_id``; back to the Dead page, or to
    the timer's own page when posted from it (``back=timer``)."""
    timer_id = fields.get("id", "")
    on_page = fields.get("back") == "timer"

    def back(said: str, to: str = timer_id) -> Back:
        return _back("/timer", id=to, said=said) if on_page else _back("/dead", said=said)

    chosen = [f for f in timers.get_failures(timer_id)
              if f.failure_id == fields.get("failure_id")]
    if not chosen:
        return back("that dead timer is gone (retried or purged)")
    try:
        new_id = timers.retry_failure(chosen[0])
    except TimersError as exc:
        return back(f"not retried: {exc}")
    return back(f"timer {new_id} scheduled again, due now", new_id)


def _purge(timers: Timers, fields: dict[str, str]) -> Back:
    return _back("/dead", said=f"{timers.purge_failures()} failure record(s) purged")


def _pause(timers: Timers, fields: dict[str, str]) -> Back:
    name = fields.get("name", "")
    done = timers.pause(name) if fields.get("action") == "pause" else timers.resume(name)
    return _back("/recurrences", said=f"{name}: {fields.get('action')}d" if done
                 else f"no recurrence named {name!r}")


ACTIONS: dict[str, Callable[[Timers, dict[str, str]], Back]] = {
    "cancel": _cancel, "reschedule": _reschedule, "run_now": _reschedule, "retry": _retry,
    "purge": _purge, "pause": _pause, "resume": _pause}
