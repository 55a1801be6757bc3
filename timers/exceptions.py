"""Every error timers raises.

Hierarchy::

    TimersError                      root: catch this to catch anything from timers
    ├── InvalidTimer (ValueError)    bad input to schedule/cancel/…: the message names it
    │   ├── InvalidTask              task path is not a dotted Python name
    │   ├── InvalidArgs              args not a list/dict/None, not JSON, or too large
    │   ├── InvalidDueTime           in_/at missing, both given, naive, not finite
    │   └── InvalidTimerId           id empty, not a string, too long, or of the
    │                                reserved occurrence form ``<recurrence>@<ms>``
    ├── MalformedTimerKey (ValueError)  a key or record that does not decode
    ├── TaskRefused                  the listener will not run this task (not allowed,
    │                                not found, not a function)
    ├── TasksUnavailable             the listener's tasks package cannot be imported: it
    │                                refuses to start
    ├── PermissionMissing            the Redis user may not do what a listener cannot work
    │                                without (run scripts): it refuses to start
    ├── ServerUnavailable (ConnectionError)  Redis cannot be reached: refused, lost, or
    │   │                                    it refused the credentials
    │   ├── PoolExhausted                    no free connection in the pool in time
    │   └── ServerTimeout (TimeoutError)     Redis accepted but did not answer in time
    ├── ServerError                  Redis answered a command with an error
    │   ├── ServerOutOfMemory        Redis refused a write: it is at its ``maxmemory``
    │   └── KeysNotDeclared          Redis Cluster: a script asked for a key outside its
    │                                shard's slot, or (the cause of a redis-py
    │                                TryAgainError) kept asking for keys it was not given
    ├── EvictionUnsafe               the server may evict pending timers (``allkeys-*``):
    │                                a strict producer, or a listener, refuses it
    ├── UnknownFormat                the prefix's keys are in a data format newer than
    │                                this release knows: a producer, or a listener,
    │                                refuses to work on them (nothing written)
    ├── NotReplicated                a write done on the primary, not confirmed on the
    │                                replicas asked for (``replicas=``) in time
    ├── TimerAlreadyPending          a failed timer's id is pending again: not retried
    ├── WrongEventLoop (RuntimeError)  an AsyncTimers used from an event loop other than
    │                                the one that first used it (nothing was sent)
    ├── NotInTimer                   timers.current() called outside a timer's task
    ├── ServerNotFound               no Redis/Valkey server binary for an embedded server
    ├── BadShardCount (ValueError)   a shard count (``shards=``, ``$TIMERS_SHARDS``) not 1-1024
    ├── ShardLayoutMismatch (ValueError)  a shard count other than the prefix's, or garbled
    ├── CannotConnect                ``timers listen``: the server did not answer a PING
    ├── MemoryLimitTooLow            ``--max-memory-per-child`` below the listener's own size
    ├── StillDue                     [`timers.testing`][timers.testing]: timers kept coming due
    ├── UserError                    the CLI: a problem to report in one line
    ├── FlowKeyError                 a task's ``key=``/``rate_key=`` function failed
    ├── JournalUnavailable           the listener cannot keep its endings journal (it runs
    │                                without one, and says so)
    └── the runner's signals, raised and caught inside the listener (never seen outside):
        ├── Overran                  a plain function ran past its timeout in its thread
        └── Stale                    a run's lease was not known to hold at its start

Every exception class of the package is defined here (a test checks it).
"""

from __future__ import annotations

import sys
import warnings

__all__ = [
    "BadShardCount",
    "CannotConnect",
    "EvictionUnsafe",
    "FlowKeyError",
    "InvalidArgs",
    "InvalidDueTime",
    "InvalidTask",
    "InvalidTimer",
    "InvalidTimerId",
    "JournalUnavailable",
    "KeysNotDeclared",
    "Late",
    "MalformedTimerKey",
    "MemoryLimitTooLow",
    "NotInTimer",
    "NotReplicated",
    "Overran",
    "PermissionMissing",
    "PoolExhausted",
    "ServerError",
    "ServerNotFound",
    "ServerOutOfMemory",
    "ServerTimeout",
    "ServerUnavailable",
    "ShardLayoutMismatch",
    "Stale",
    "StillDue",
    "TaskRefused",
    "TasksUnavailable",
    "TimerAlreadyPending",
    "TimersError",
    "UnknownFormat",
    "UserError",
    "WrongEventLoop",
]


class TimersError(Exception):
    """Root of every error raised by timers."""


class InvalidTimer(TimersError, ValueError):
    """A timer cannot be scheduled as asked; the message says what is wrong."""


class InvalidTask(InvalidTimer):
    """The task path is not a dotted Python name such as ``reminders.sms``."""


class InvalidArgs(InvalidTimer):
    """Args are not a list, dict or None, are not JSON-serialisable, or are too large."""


class InvalidDueTime(InvalidTimer):
    """The due time is missing, ambiguous, naive or not a finite number."""


class InvalidTimerId(InvalidTimer):
    """The timer id is empty, not a string, too long, or has the form ``<name>@<digits>``
    that the occurrences of recurrences use (scheduling it would replace one)."""


class MalformedTimerKey(TimersError, ValueError):
    """A key name or stored record does not decode as a timer."""


class TaskRefused(TimersError):
    """The listener refuses to run a task: outside the tasks package, missing, or not callable."""


class TasksUnavailable(TimersError):
    """The tasks package cannot be imported, so the listener refuses to start (and claims
    nothing it could not run)."""


class ServerNotFound(TimersError):
    """No redis-server or valkey-server binary could be found to start an embedded server."""


class ServerUnavailable(TimersError, ConnectionError):
    """Redis cannot be reached: the connection was refused or lost, or the server refused
    the credentials. The redis-py error is the ``__cause__``; still a builtin
    `ConnectionError` for code that catches that."""


class PoolExhausted(ServerUnavailable):
    """Every connection of the client's pool stayed in use for the pool's wait timeout:
    too many calls at once for ``max_connections``. Nothing of the call was sent."""


class ServerTimeout(ServerUnavailable, TimeoutError):
    """Redis accepted the connection but did not answer within the client's socket
    timeout. The redis-py error is the ``__cause__``."""


class ServerError(TimersError):
    """Redis answered a command with an error (a missing permission, a wrong server
    setting …); the message carries Redis's words, the redis-py error is the ``__cause__``."""


class ServerOutOfMemory(ServerError):
    """Redis is at its ``maxmemory`` and refused a write that needs memory (schedule, …).

    Nothing of the refused call was written, except the ids in `written` (only
    ``schedule_many`` fills it, and only in the rare case it needed a second round trip
    for generated ids that collided). The redis-py error is the ``__cause__``.
    """

    def __init__(self, message: str, written: list[str] | None = None) -> None:
        super().__init__(message)
        self.written: list[str] = list(written or [])


class KeysNotDeclared(ServerError):
    """A script call on Redis Cluster asked for a key outside its shard's slot; or, as the
    ``__cause__`` of a redis-py ``TryAgainError`` (retried as a cluster's own
    ``-TRYAGAIN``), it kept asking for keys it was not given (each call named more: the
    shard's state kept changing between calls). Nothing of the refused calls was written:
    a script asks before its first write (``timers/store/declare.py``)."""


class NotReplicated(TimersError):
    """A write asked to be replicated (``replicas=n``) was done on the primary, but fewer
    than ``n`` replicas confirmed it (``WAIT``, and ``WAITAOF`` when asked for) within the
    timeout.

    The write is not undone: a scheduled timer exists on the primary under its id and
    fires as usual unless a failover loses it first. `timer_ids` lists the ids the
    call wrote whose replication was not confirmed; `replicas` is how many replicas
    were asked for, `acked` how many had the write in memory, `fsynced` how
    many had it in their AOF on disk (None: not asked, or the server has no ``WAITAOF``).
    """

    def __init__(self, message: str, timer_ids: list[str] | None = None, replicas: int = 0,
                 acked: int = 0, fsynced: int | None = None) -> None:
        super().__init__(message)
        self.timer_ids: list[str] = list(timer_ids or [])
        self.replicas = replicas
        self.acked = acked
        self.fsynced = fsynced


class TimerAlreadyPending(TimersError):
    """A failed timer was not retried: a timer with its id is pending again (a retry
    would overwrite it). Retry with ``replace=True`` to overwrite it anyway."""

    def __init__(self, message: str, timer_id: str) -> None:
        super().__init__(message)
        self.timer_id = timer_id


class NotInTimer(TimersError):
    """[`timers.current`][timers.listener.calling.context.current] was called where no
    timer's task is running."""


class WrongEventLoop(TimersError, RuntimeError):
    """An [`AsyncTimers`][timers.producer.async_client.AsyncTimers] was used from an event loop
    other than the one that first used it: its connections belong to that loop. Raised before
    anything is sent. Make one per loop (in the app's lifespan) or use
    [`timers.aio`][asyncio-timersaio], which keeps one client per loop."""


class EvictionUnsafe(TimersError):
    """The server's ``maxmemory-policy`` is ``allkeys-*``: it may evict the due index and
    the timer records themselves. A ``Timers(strict=True)`` producer refuses to write
    (nothing was written), and a listener to start; the message says what to change."""


class UnknownFormat(TimersError):
    """The prefix's ``P|format`` key names a data format newer than this release knows (or
    holds no format at all): a newer release of timers wrote the prefix, and this one would
    misread it. A listener refuses to start, a producer to write (on that write and every
    later one of the client); nothing was written. `stored` is the value found, `known`
    the newest format this release knows (see `timers.model.data_format`)."""

    def __init__(self, message: str, stored: str = "", known: int = 0) -> None:
        super().__init__(message)
        self.stored = stored
        self.known = known


class PermissionMissing(TimersError):
    """The Redis user may not do what a listener cannot work without (run scripts)."""


class BadShardCount(TimersError, ValueError):
    """A shard count (``shards=``, ``$TIMERS_SHARDS``) that is not 1 to 1024."""


class ShardLayoutMismatch(TimersError, ValueError):
    """A client asked for a shard count other than the one the prefix has, or the stored
    count is garbled."""


class CannotConnect(TimersError):
    """The listener's server did not answer a PING."""


class MemoryLimitTooLow(TimersError):
    """The listener holds more memory at start than ``--max-memory-per-child``: every
    child would be replaced after its first run."""


class StillDue(TimersError):
    """Timers kept coming due while [`TimersTest.run_due`][timers.testing.TimersTest.run_due] or
    ``run_all`` ran them: a task that schedules a timer due at once, every time it runs?"""


class UserError(TimersError):
    """A problem to report in one line (the command line's)."""


class FlowKeyError(TimersError):
    """A task's ``key=`` or ``rate_key=`` function failed or returned no usable key."""


class JournalUnavailable(TimersError):
    """The endings journal's directory is not private to this user, or its file cannot be
    made (`timers.listener.endings.journal`)."""


class Overran(TimersError):
    """A plain function ran past its timeout in its thread (the runner's, internal)."""


class Stale(TimersError):
    """A run's lease was not known to hold when a thread was about to call its function
    (the process stalled): the function was not called (the runner's, internal)."""


class Late(TimersError):
    """A rate's run reached its call past its start window (the process was busy): the
    function was not called, and the run gives its slot back (the runner's, internal)."""


def warn_at_callers_line(message: Warning | str, category: type[Warning] | None = None) -> None:
    """Warn, naming the line that called into the package (the first frame outside
    ``timers``), however deep inside it the warning is decided."""
    frame = sys._getframe(1)
    level = 2  # (1: this function's own frame)
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "timers":
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level)
