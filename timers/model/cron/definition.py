"""Recurring timers: what a recurrence is, its validation and its stored JSON.

A recurrence ``name`` lives in two hashes (see :mod:`timers.model.keys`): its *definition*
(``P|cron``, JSON written only by producers: task, args, schedule, policies) and its *state*
(``P|cronstate``, ``v|last|prev|paused|run|anchor``, kept by the Lua scripts; see
:mod:`timers.model.cron.state`). Each of its occurrences is an ordinary timer with id
``<name>@<due ms>`` and the record options ``r=<name>`` and ``v=<version>``. At most one
occurrence is pending: ``<name>@<last>``.

Producers import this module; it loads neither the listener nor asyncio.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from timers.exceptions import InvalidTimer, MalformedTimerKey
from timers.model.cron.planner import CATCH_UP_VALUES, CatchUp
from timers.model.cron.schedule import (
    MS,
    CronSchedule,
    IntervalSchedule,
    Schedule,
    from_ms,
    upcoming,
)
from timers.model.cron.state import State
from timers.model.due import interval_words, seconds
from timers.model.encoding import (
    DEFAULT_MAX_ARGS_BYTES,
    Args,
    Record,
    as_text,
    check_task,
    encode_args,
    escape_id,
    unescape_id,
)
from timers.model.wire import Option

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo  # (imported where used: a command with no cron reads none)

log = logging.getLogger("timers.cron")

RECURRENCE_OPTION: str = Option.RECURRENCE.value
"""Record option that marks a timer as an occurrence of a recurrence (value: its name)."""
VERSION_OPTION: str = Option.VERSION.value
"""Record option: the version of the definition an occurrence was scheduled under."""
MAX_NAME_LENGTH = 100
DEFAULT_GROUP = "default"
"""``timers.model.flow.names.DEFAULT_GROUP``: the flow helpers are imported where they are used,
as they load redis-py (and asyncio) and a producer's recurrence needs them only with a
group, key or priority."""

_RANDOM_FIELD = re.compile(r"(?<![A-Za-z])R(?![A-Za-z])")


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
    """A recurring timer as declared by [`Timers.every`][timers.producer.client.Timers.every], with
    what Redis holds about it.

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
    group: str = DEFAULT_GROUP
    """The group of its occurrences: only listeners serving it run them."""
    key: str | None = None
    """The concurrency key of its occurrences (the task's limit then holds per key)."""
    priority: int = 0
    """Its occurrences' priority among timers waiting for the same slot."""
    paused: bool = False
    version: int = 0
    next_due: datetime | None = None
    anchor: datetime | None = None

    @property
    def zone(self) -> ZoneInfo:
        from zoneinfo import ZoneInfo

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
        return f"every {interval_words(self.interval.total_seconds())}"

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
        if self.group != DEFAULT_GROUP:  # absent when default: older definitions read alike
            data["group"] = self.group
        if self.key is not None:
            data["key"] = self.key
        if self.priority:
            data["priority"] = self.priority
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)

    @classmethod
    def from_redis(cls, name: str, definition: bytes | str, state: bytes | str | None,
                   pending: bool = False) -> Recurrence:
        """Read a stored definition and state
        ([`MalformedTimerKey`][timers.exceptions.MalformedTimerKey] if unreadable)."""
        try:
            data = json.loads(as_text(definition))
            every_ms, late_ms = data.get("every_ms"), data.get("max_lateness_ms")
            recurrence = cls(
                name=name, task=data["task"], args=data.get("args"), cron=data.get("cron"),
                interval=None if every_ms is None else timedelta(milliseconds=every_ms),
                tz=data.get("tz", "UTC"), catch_up=data.get("catch_up", "latest"),
                max_lateness=None if late_ms is None else timedelta(milliseconds=late_ms),
                overlap=bool(data.get("overlap", True)),
                group=data.get("group", DEFAULT_GROUP), key=data.get("key"),
                priority=data.get("priority", 0),
            )
            _check_flow(recurrence.group, recurrence.key, recurrence.priority)
        except (InvalidTimer, ValueError, KeyError, TypeError, AttributeError) as exc:
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
        options = {RECURRENCE_OPTION: name_option(self.name), VERSION_OPTION: str(version),
                   **_check_flow(self.group, self.key, self.priority)}
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
    group: str = DEFAULT_GROUP,
    key: str | None = None,
    priority: int = 0,
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
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidTimer(f"unknown time zone {tz!r} (use an IANA name such as "
                           f"'Europe/Berlin' or 'UTC')") from None
    catch_up, late = _check_policies(catch_up, overlap, max_lateness)
    if (cron is None) == (interval is None):
        raise InvalidTimer("give exactly one of cron (an expression) or interval")
    every: timedelta | None = None
    if interval is not None:
        every = timedelta(milliseconds=round(seconds(interval, "interval") * 1000))
        if every < timedelta(milliseconds=10):
            raise InvalidTimer("interval must be at least 10 ms")
    else:
        cron = _check_cron(cron, tz, name)
    _check_flow(group, key, priority)  # each checked as a timer's is
    return Recurrence(name, task, args, cron, every, tz, catch_up, late, overlap, group, key,
                      priority)


def _check_policies(catch_up: str, overlap: object, max_lateness: float | timedelta | None
                    ) -> tuple[CatchUp, timedelta | None]:
    """catch_up checked, overlap checked, and max_lateness as a timedelta (or None)."""
    if catch_up not in CATCH_UP_VALUES:
        raise InvalidTimer(f"catch_up must be one of {', '.join(CATCH_UP_VALUES)}, "
                           f"got {catch_up!r}")
    if not isinstance(overlap, bool):
        raise InvalidTimer(f"overlap must be True or False, got {overlap!r}")
    if max_lateness is None:
        return catch_up, None
    late = timedelta(seconds=seconds(max_lateness, "max_lateness"))
    if late < timedelta(0):
        raise InvalidTimer("max_lateness must be 0 or more seconds")
    return catch_up, late


def _check_flow(group: object, key: object, priority: object) -> dict[str, str]:
    """The occurrences' flow options (:class:`InvalidTimer` if one is bad)."""
    if group == DEFAULT_GROUP and key is None and priority == 0:
        return {}
    from timers.model.flow.options import flow_options  # here: see DEFAULT_GROUP

    return flow_options(group, key, priority)


def _check_cron(expression: object, tz: str, name: str) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidTimer(f"cron must be an expression such as '0 9 * * mon-fri', "
                           f"got {expression!r}")
    expression = " ".join(expression.split())
    if _RANDOM_FIELD.search(expression):
        raise InvalidTimer(f"cron {expression!r}: random fields (R) are refused: every "
                           f"process would pick different times")
    from croniter import CroniterError, croniter  # (here: loaded by a cron's check only)

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
