"""Recurring timers: cron expressions in a time zone, or fixed intervals.

A recurrence ``name`` lives in two hashes (see :mod:`timers.keys`): its *definition*
(``P|cron``, JSON written only by producers: task, args, schedule, policies) and its *state*
(``P|cronstate``, ``v|last|prev|paused|run|anchor``, kept by the Lua scripts). Each of its
occurrences is an ordinary timer with id ``<name>@<due ms>`` and the record options
``r=<name>`` and ``v=<version>``. At most one occurrence is pending: ``<name>@<last>``.

The next occurrence is scheduled when the current one runs, by the listener that claimed
it (:meth:`RecurrenceHook.before_run`), in one script call that schedules it only if the
state still names this occurrence as the latest (``last == due``) under the same version.
A rerun after a crash, a second listener or a racing change therefore never schedules the
same occurrence twice, and no listener needs to be a leader.

The time maths (cron in a time zone, through clock changes) is in
:mod:`timers.cron_schedule`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args
from urllib.parse import quote, unquote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from redis.exceptions import RedisError

from timers.cron_schedule import (
    MS,
    CronSchedule,
    IntervalSchedule,
    Schedule,
    from_ms,
    to_ms,
    upcoming,
)
from timers.due import format_duration, seconds
from timers.encoding import (
    DEFAULT_MAX_ARGS_BYTES,
    Args,
    Record,
    as_text,
    check_task,
    encode_args,
    entry_text,
    escape_id,
    unescape_id,
)
from timers.exceptions import InvalidTimer, MalformedTimerKey
from timers.keys import Keyspace
from timers.runs import Outcome, Run
from timers.scripts import register

log = logging.getLogger("timers.cron")

RECURRENCE_OPTION = "r"
"""Record option that marks a timer as an occurrence of a recurrence (value: its name)."""
VERSION_OPTION = "v"
"""Record option: the version of the definition an occurrence was scheduled under."""

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_VALUES: tuple[CatchUp, ...] = get_args(CatchUp)
NONE_GRACE = timedelta(seconds=60)
"""With ``catch_up="none"`` and no ``max_lateness``: how late an occurrence may still start
(like Quartz's misfire threshold); later, it counts as missed and is skipped."""
MAX_NAME_LENGTH = 100

_RANDOM_FIELD = re.compile(r"(?<![A-Za-z])R(?![A-Za-z])")
_TRANSIENT = (RedisError, ConnectionError, TimeoutError, OSError)


# -- names ------------------------------------------------------------------------------


def check_name(name: object) -> str:
    """Validate a recurrence name: 1 to 100 characters of text, no control characters."""
    if not isinstance(name, str) or not name:
        raise InvalidTimer("a recurrence name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTimer(f"recurrence name is longer than {MAX_NAME_LENGTH} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidTimer(f"recurrence name {name!r} holds control characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTimer(f"recurrence name is not valid unicode text: {exc}") from None
    return name


def name_option(name: str) -> str:
    """The name as a record option value: ``[A-Za-z0-9_.-]`` kept, the rest ``%XX``."""
    return quote(name, safe="").replace("~", "%7E")


def name_from_option(value: str) -> str:
    try:
        return unquote(value, errors="strict")
    except UnicodeDecodeError as exc:
        raise MalformedTimerKey(f"bad recurrence name {value[:80]!r}: {exc}") from None


def occurrence_id(name: str, due_ms: int) -> str:
    """The timer id of the occurrence of ``name`` due at ``due_ms``."""
    return f"{name}@{due_ms}"


def occurrence_due(timer_id: str) -> int | None:
    head, sep, tail = timer_id.rpartition("@")
    return int(tail) if sep and head and tail.isdigit() else None


# -- definitions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Recurrence:
    """A recurring timer as declared by :meth:`Timers.every`, with what Redis holds about it.

    ``next_due`` is the due time of the occurrence waiting in the due index (None while
    paused, or while an occurrence is being run and its successor is not scheduled yet).
    """

    name: str
    task: str
    args: Args = None
    cron: str | None = None
    interval: timedelta | None = None
    tz: str = "UTC"
    catch_up: CatchUp = "latest"
    max_lateness: timedelta | None = None
    overlap: bool = True
    paused: bool = False
    version: int = 0
    next_due: datetime | None = None
    anchor: datetime | None = None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def schedule(self, anchor: datetime | None = None) -> Schedule:
        """The occurrence maths; an interval counts from ``anchor`` (default: its own)."""
        if self.cron is not None:
            return CronSchedule(self.cron, self.tz, hash_id=self.name)
        assert self.interval is not None
        start = anchor or self.anchor
        if start is None:
            raise ValueError(f"interval recurrence {self.name!r} has no anchor yet")
        return IntervalSchedule(self.interval, start)

    def upcoming(self, count: int = 3, after: datetime | None = None) -> list[datetime]:
        """The next ``count`` run times in the recurrence's own time zone: the pending
        occurrence first, then what follows it (from ``after``, default now, if none)."""
        schedule = self.schedule()
        first = [self.next_due] if self.next_due is not None else []
        start = self.next_due or after or datetime.now(UTC)
        times = first + upcoming(schedule, start, count - len(first))
        return [t.astimezone(self.zone) for t in times]

    @property
    def when(self) -> str:
        """The schedule in words, e.g. ``cron 0 9 * * mon-fri`` or ``every 5m``."""
        if self.cron is not None:
            return f"cron {self.cron}"
        assert self.interval is not None
        return f"every {format_duration(self.interval.total_seconds())}"

    def definition(self, max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> str:
        """The canonical JSON stored in ``P|cron``: the same declaration, the same text."""
        data: dict[str, Any] = {
            "task": self.task,
            "args": json.loads(encode_args(self.args, max_args_bytes) or "null"),
            "tz": self.tz,
            "catch_up": self.catch_up,
            "overlap": self.overlap,
        }
        if self.cron is not None:
            data["cron"] = self.cron
        if self.interval is not None:
            data["every_ms"] = self.interval // MS
        if self.max_lateness is not None:
            data["max_lateness_ms"] = self.max_lateness // MS
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)

    @classmethod
    def from_redis(cls, name: str, definition: bytes | str, state: bytes | str | None,
                   pending: bool = False) -> Recurrence:
        """Read a stored definition and state (:class:`MalformedTimerKey` if unreadable)."""
        try:
            data = json.loads(as_text(definition))
            every_ms, late_ms = data.get("every_ms"), data.get("max_lateness_ms")
            recurrence = cls(
                name=name, task=data["task"], args=data.get("args"), cron=data.get("cron"),
                interval=None if every_ms is None else timedelta(milliseconds=every_ms),
                tz=data.get("tz", "UTC"), catch_up=data.get("catch_up", "latest"),
                max_lateness=None if late_ms is None else timedelta(milliseconds=late_ms),
                overlap=bool(data.get("overlap", True)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MalformedTimerKey(f"unreadable definition of recurrence {name!r}: {exc}") \
                from None
        if state is None:
            return recurrence
        st = State.decode(state)
        return replace(
            recurrence, paused=st.paused, version=st.version,
            next_due=from_ms(st.last) if pending and st.last else None,
            anchor=from_ms(st.anchor) if recurrence.interval is not None else None,
        )

    def occurrence(self, version: int, due_ms: int,
                   max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> tuple[str, str]:
        """The escaped timer id and the record of the occurrence due at ``due_ms``."""
        options = {RECURRENCE_OPTION: name_option(self.name), VERSION_OPTION: str(version)}
        record = Record(self.task, self.args, options).encode(max_args_bytes)
        return escape_id(occurrence_id(self.name, due_ms)), record


def recurrence(
    name: str,
    task: str,
    args: Args | tuple[Any, ...] = None,
    *,
    cron: str | None = None,
    interval: float | timedelta | None = None,
    tz: str = "UTC",
    catch_up: str = "latest",
    max_lateness: float | timedelta | None = None,
    overlap: bool = True,
    max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
) -> Recurrence:
    """Validate a declaration and return it; :class:`InvalidTimer` says what is wrong."""
    name = check_name(name)
    check_task(task)
    if isinstance(args, tuple):
        args = list(args)
    encode_args(args, max_args_bytes)
    if len(name_option(name)) > 200:
        raise InvalidTimer(f"recurrence name {name!r} is too long once escaped")
    if not isinstance(tz, str):
        raise InvalidTimer(f"tz must be a zone name such as 'Europe/Berlin', got {tz!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidTimer(f"unknown time zone {tz!r} (use an IANA name such as "
                           f"'Europe/Berlin' or 'UTC')") from None
    if catch_up not in CATCH_UP_VALUES:
        raise InvalidTimer(f"catch_up must be one of {', '.join(CATCH_UP_VALUES)}, "
                           f"got {catch_up!r}")
    if not isinstance(overlap, bool):
        raise InvalidTimer(f"overlap must be True or False, got {overlap!r}")
    late: timedelta | None = None
    if max_lateness is not None:
        late = timedelta(seconds=seconds(max_lateness, "max_lateness"))
        if late < timedelta(0):
            raise InvalidTimer("max_lateness must be 0 or more seconds")
    if (cron is None) == (interval is None):
        raise InvalidTimer("give exactly one of cron (an expression) or interval")
    every: timedelta | None = None
    if interval is not None:
        every = timedelta(milliseconds=round(seconds(interval, "interval") * 1000))
        if every < timedelta(milliseconds=10):
            raise InvalidTimer("interval must be at least 10 ms")
    else:
        cron = _check_cron(cron, tz, name)
    return Recurrence(name, task, args, cron, every, tz, catch_up, late, overlap)


def _check_cron(expression: object, tz: str, name: str) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidTimer(f"cron must be an expression such as '0 9 * * mon-fri', "
                           f"got {expression!r}")
    expression = " ".join(expression.split())
    if _RANDOM_FIELD.search(expression):
        raise InvalidTimer(f"cron {expression!r}: random fields (R) are refused: every "
                           f"process would pick different times")
    try:
        valid = croniter.is_valid(expression, hash_id=name.encode("utf-8"))
        if valid:
            CronSchedule(expression, tz, hash_id=name).next_after(datetime.now(UTC))
    except (CroniterError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise InvalidTimer(f"cron {expression!r} never matches a time: {exc}") from None
    if not valid:
        raise InvalidTimer(f"cron {expression!r} is not a valid expression (5 fields "
                           f"'minute hour day month weekday', optionally seconds last)")
    return expression


# -- state ------------------------------------------------------------------------------


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


# -- what happens to an occurrence: a pure function of the schedule and the clock -------


@dataclass(frozen=True)
class Step:
    """The decision for one claimed occurrence.

    ``run``: run its task (else ``reason`` says why not). ``successor``: due ms of the
    occurrence to schedule next. ``defer``: schedule it only once this run has ended (a
    catch-up run of ``catch_up="all"``, so missed occurrences run one after the other).
    """

    run: bool
    successor: int
    defer: bool = False
    reason: str = ""


def plan(
    schedule: Schedule,
    catch_up: CatchUp,
    max_lateness: timedelta | None,
    due_ms: int,
    now_ms: int,
    *,
    rerun: bool = False,
    lateness_ms: int | None = None,
) -> Step:
    """What to do with the occurrence due at ``due_ms`` when it is claimed at ``now_ms``.

    An occurrence whose successor is due too was *missed*. ``latest`` skips it and
    schedules the latest missed occurrence to run at once (then the chain goes on from
    there); ``all`` runs it and schedules the next one when it ends; ``none`` skips it and
    resumes after now. ``max_lateness`` bounds how late any occurrence may start (with
    ``none`` and no limit: :data:`NONE_GRACE`). A ``rerun`` (after a crash, or a retry of
    a failed task) runs whatever the catch-up policy, within ``max_lateness`` of
    ``lateness_ms`` (its own lateness; default ``now - due``).
    """

    def next_ms(after_ms: int) -> int:
        return to_ms(schedule.next_after(from_ms(after_ms)))

    late = now_ms - due_ms if lateness_ms is None else lateness_ms
    limit_ms = None if max_lateness is None else max_lateness // MS
    following = next_ms(due_ms)
    if following > now_ms:  # this is the latest occurrence due
        step = Step(True, following)
        limit = NONE_GRACE // MS if limit_ms is None and catch_up == "none" else limit_ms
        if limit is not None and late > limit:
            step = Step(False, following, reason=_too_late(late, limit))
    elif catch_up == "all":
        if limit_ms is not None and late > limit_ms:
            first_in_time = next_ms(now_ms - limit_ms - 1)
            step = Step(False, first_in_time, reason=_too_late(late, limit_ms))
        else:
            step = Step(True, following, defer=True)
    elif catch_up == "latest":
        latest_dt = schedule.latest_at_or_before(from_ms(now_ms))
        latest = following if latest_dt is None else max(following, to_ms(latest_dt))
        if limit_ms is not None and now_ms - latest > limit_ms:
            step = Step(False, next_ms(now_ms), reason="missed, and so was every later "
                        "occurrence by more than its max lateness: going on after now")
        else:
            step = Step(False, latest, reason=f"missed: catch_up=latest runs only the "
                        f"latest missed occurrence, due {from_ms(latest).isoformat()}")
    else:
        step = Step(False, next_ms(now_ms), reason="missed: catch_up=none")
    if rerun:
        run = limit_ms is None or late <= limit_ms
        return replace(step, run=run, defer=step.defer and run,
                       reason="" if run else _too_late(late, limit_ms or 0))
    return step


def _too_late(late_ms: int, limit_ms: int) -> str:
    return (f"started {late_ms / 1000:.3f} s after its due time, over its max lateness of "
            f"{limit_ms / 1000:g} s")


# -- the listener's side ----------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One call of ``cron_next.lua`` for an occurrence of ``name`` due at ``due``.

    ``successor``/``record``: the next occurrence to schedule (if ``last == due``); with
    ``defer`` only if this run does not go ahead (another run holds the slot): else
    :meth:`RecurrenceHook.after_run` schedules it. ``take``/``release``: a run token that
    takes or releases the overlap slot.
    """

    name: str
    version: int
    due: int
    successor: int | None = None
    record: str = ""
    defer: bool = False
    take: str = ""
    release: str = ""


def _skipped(reason: str) -> Outcome:
    return Outcome("skipped", "Skipped", reason)


class RecurrenceHook:
    """What a listener does around a run of an occurrence of a recurring timer.

    ``before_run`` is awaited after the claim and before the task runs: it schedules the
    next occurrence and may return an :class:`Outcome` (e.g. skipped) instead of running.
    ``after_run`` is awaited once the run has ended, before its ending is written.
    """

    AFTER_ATTEMPTS = 5

    def __init__(self, redis: Any, keys: Keyspace) -> None:
        self.redis = redis
        self.keys = keys
        self._script = register(redis, "cron_next")
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
        due = occurrence_due(run.timer_id) or run.due_ms
        now = int(started_ms)
        plan_ = plan(current.schedule(from_ms(state.anchor)), current.catch_up,
                     current.max_lateness, due, now,
                     rerun=run.reruns > 0 or "a" in record.options,
                     lateness_ms=now - run.due_ms)
        _, successor_record = current.occurrence(version, plan_.successor, 1 << 62)
        step = _Step(name, version, due, plan_.successor, successor_record, plan_.defer,
                     take=run.token if plan_.run and not current.overlap else "")
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
        for attempt in range(self.AFTER_ATTEMPTS):
            try:
                await self._call(step)
                return
            except _TRANSIENT as exc:
                if attempt + 1 == self.AFTER_ATTEMPTS:
                    if step.successor is None:
                        # the overlap slot frees itself once the run's lease is gone
                        log.warning("could not release the overlap slot of %s: %s",
                                    step.name, exc)
                        return
                    raise  # the listener hands the run back: its rerun schedules the next
                await asyncio.sleep(0.1 * 2 ** attempt)

    async def _call(self, step: _Step) -> tuple[str, str]:
        k = self.keys
        keys = [k.recurrence_states, k.due, k.records, k.running]
        if step.successor is not None:
            keys.append(k.timer_key(entry_text(
                escape_id(occurrence_id(step.name, step.successor)), step.record)))
        reply = await self._script(
            keys=keys,
            args=[k.timer_key_start, k.wake_channel, escape_id(step.name), step.version,
                  step.due, -1 if step.successor is None else step.successor, step.record,
                  int(step.defer), step.take, step.release],
        )
        return as_text(reply[0]), as_text(reply[1])


def _int(value: str | None) -> int:
    with contextlib.suppress(TypeError, ValueError):
        return int(value)  # type: ignore[arg-type]
    return -1


def decode_recurrences(
    defs: Mapping[Any, Any], states: Mapping[Any, Any], pending: Mapping[str, bool]
) -> list[Recurrence]:
    """Recurrences from ``HGETALL`` of both hashes; unreadable ones are left out."""
    out = []
    for raw_field, definition in defs.items():
        field = as_text(raw_field)
        state = states.get(raw_field)
        try:
            out.append(Recurrence.from_redis(unescape_id(field), definition, state,
                                             pending.get(field, False)))
        except MalformedTimerKey as exc:
            log.warning("skipping recurrence %r: %s", field, exc)
    return sorted(out, key=lambda r: r.name)
