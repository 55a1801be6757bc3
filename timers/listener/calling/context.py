"""The running timer's context, for a task to read: :func:`timers.current`.

    import timers

    def sms(user_id: int) -> None:
        timer = timers.current()
        send_once(key=timer.id, to=user_id)   # the same id on every attempt

The listener sets it around each run (a :class:`contextvars.ContextVar`): an ``async def``
task reads it on the event loop, a plain function in its worker thread, a quarantined run
in its child process. Outside a run, :func:`current` raises :class:`NotInTimer`: a task
that relies on its context and is called some other way (directly, from a test) is told
so at once rather than handed a None to trip on later. A test that calls a task directly
can give it a context with :func:`timers.testing.timer_context`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from timers.exceptions import NotInTimer
from timers.model.cron.definition import name_from_option
from timers.model.wire import Option

if TYPE_CHECKING:
    from timers.model.encoding import Record
    from timers.model.runs import Run

__all__ = ["NotInTimer", "TimerContext", "current"]


@dataclass(frozen=True)
class TimerContext:
    """What a running task knows of its timer."""

    id: str
    """The timer id: the same on every attempt (a key for idempotency)."""
    task: str
    """The task's dotted path, as scheduled (``reminders.sms``)."""
    attempt: int
    """1 on the first run, 2 on the first retry (or rerun after a crash), …"""
    due: datetime
    """When this attempt was due (UTC, Redis clock); a retry's is its backoff's end."""
    original_due: datetime
    """When the timer itself was due (UTC): the first attempt's due time."""
    lateness: float
    """Seconds between [`due`][timers.listener.calling.context.TimerContext.due] and the
    start of this run."""
    recurrence: str | None = None
    """The name of the recurrence this run is an occurrence of, or None."""
    fencing_token: int = 0
    """A number that grows with every claim of a timer (a rerun after a lapsed lease, a
    retry, the next timer of a concurrency key all get a larger one): a device or an
    external system that remembers the largest it has seen can refuse a command carrying a
    smaller one, sent late by a listener that was paused past its lease. It never goes
    back, not even when the server loses its last writes (a restart, a failover): a token
    is never below the Redis clock in microseconds. 0 outside a listener's run (a test's
    [`timers.testing.timer_context`][timers.testing.timer_context])."""
    lease_check: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    def still_held(self) -> bool:
        """Whether this run's lease is still known to be this listener's (a local check, no
        round trip): False once the listener stalled past what its renewals allow for (a
        pause, a swap storm), when another listener may have taken the run over, or once
        it learnt the run was taken over. A task that drives a device can check it before
        each step that must not be done twice. The same in a quarantine child process,
        which reads its listener's lease of the run; always True in a test's context."""
        return self.lease_check is None or self.lease_check()


class _OfRun:
    """A run's context, built on first read: most tasks never ask, and building it (dates,
    the recurrence name) on every fire is a cost the listener's throughput feels."""

    __slots__ = ("_built", "lease_check", "record", "run", "started_ms")

    def __init__(self, run: Run, record: Record, started_ms: float,
                 lease_check: Callable[[], bool] | None) -> None:
        self.run, self.record, self.started_ms = run, record, started_ms
        self.lease_check = lease_check
        self._built: TimerContext | None = None

    def get(self) -> TimerContext:
        if self._built is None:
            self._built = of_run(self.run, self.record, self.started_ms, self.lease_check)
        return self._built


_current: ContextVar[TimerContext | _OfRun | None] = ContextVar("timers_current", default=None)


def current() -> TimerContext:
    """The context of the timer whose task is running; [`NotInTimer`][timers.exceptions.NotInTimer]
    outside one."""
    context = current_or_none()
    if context is None:
        raise NotInTimer(
            "timers.current() was called outside a timer's task: it only answers while "
            "the listener runs a task (in a test, wrap a direct call in "
            "timers.testing.timer_context())"
        )
    return context


def current_or_none() -> TimerContext | None:
    """The running timer's context, or None (for the listener's own use)."""
    context = _current.get()
    return context.get() if isinstance(context, _OfRun) else context


def enter_run(run: Run, record: Record, started_ms: float,
              lease_check: Callable[[], bool] | None = None) -> None:
    """Make ``run``'s context current for the rest of this task (built when first read);
    ``lease_check`` answers :meth:`TimerContext.still_held`."""
    _current.set(_OfRun(run, record, started_ms, lease_check))


def enter(context: TimerContext | None) -> None:
    """Make ``context`` the current one for the rest of this task, thread or child."""
    _current.set(context)


@contextlib.contextmanager
def entered(context: TimerContext) -> Iterator[TimerContext]:
    """``context`` is current inside the block, and the previous one after."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def _utc(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def of_run(run: Run, record: Record, started_ms: float,
           lease_check: Callable[[], bool] | None = None) -> TimerContext:
    """The context of ``run`` (its decoded ``record``), started at ``started_ms`` (Redis)."""
    recurrence = record.options.get(Option.RECURRENCE)
    return TimerContext(
        id=run.timer_id, task=record.task, attempt=run.attempt, due=_utc(run.waited_from_ms),
        original_due=_utc(run.original_due_ms),
        lateness=round(max(started_ms - run.waited_from_ms, 0.0) / 1000, 3),
        recurrence=name_from_option(recurrence) if recurrence is not None else None,
        fencing_token=int(run.token) if run.token.isdigit() else 0, lease_check=lease_check,
    )
