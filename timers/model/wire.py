"""The stored vocabulary: the words that travel between Python, Lua and Redis.

Every letter of a record option, kind of run ending, claim source and stats counter is
named here once, and a dead timer's failure record is a typed :class:`FailureRecord`.
The Lua scripts spell the same words (``timers/store/lua/*.lua``); the tests in
``tests/unit/test_wire.py`` keep both sides in step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any


class Option(StrEnum):
    """Options of a stored record (``task;name=value;…:args``)."""

    ATTEMPTS = "a"
    """Failed attempts so far (a retry's record)."""
    FIRST_FAILURE = "f"
    """Redis time in ms of the first failed attempt (a retry's record)."""
    ORIGINAL_DUE = "d"
    """The timer's own due time in ms, kept by a retry whose due time moved."""
    MAX_LATENESS = "ml"
    """The timer's own max lateness in ms; beats the task's."""
    RECURRENCE = "r"
    """The recurrence this timer is an occurrence of."""
    VERSION = "v"
    """The recurrence definition's version the occurrence was planned from."""
    GROUP = "g"
    """The timer's group (absent: ``default``): only listeners serving it claim it."""
    PRIORITY = "p"
    """The timer's priority, an integer (absent: 0); higher runs first among waiting timers."""
    KEY = "k"
    """The timer's concurrency key, percent-escaped (see :mod:`timers.model.flow.names`)."""
    WAITED_FROM = "w"
    """The due time in ms a timer had before a flow gate (key or rate) held it back:
    written by the scripts, so its lateness counts the wait."""
    GROUP_MOVES = "mv"
    """How many times listeners moved the timer to the group its task declares (absent:
    none). Bounded, so releases that disagree on a task's group cannot bounce it forever
    (:mod:`timers.model.flow.disagreement`)."""
    GROUP_DISAGREEMENT = "gx"
    """Set while the timer waits in its group, unmoved: the group its task declares in the
    release of the listener that left it there (:mod:`timers.model.flow.disagreement`)."""
    HANDED_OVER = "ho"
    """How many times listeners lacking the timer's task handed it back for a live listener
    that has it (absent: never); each hand-back waits longer (:mod:`timers.ops.fleet`)."""
    FROM_SHARD = "sh"
    """The shard a timer moved from, at its first claim, to the shard its task's limit
    lives in (Redis Cluster, :mod:`timers.ops.shards` rule 3): it never moves again."""
    RERUNS = "rc"
    """The reruns of the run a timer came from, while it waits for its key or is handed
    back (absent: 0): its next start is still a rerun (its crash count, quarantine)."""
    TRACE = "tp"
    """The W3C ``traceparent`` of the span that scheduled the timer (with the ``otel``
    extra, :mod:`timers.model.trace`): each run's span links to it. Kept by retries and
    reruns; a listener without the extra, or of an older release, keeps it as it is."""


FLOW_DUE_SPAN = 2**42
"""A flow queue's score is ``(1000 - priority) * FLOW_DUE_SPAN + due ms`` (``flow.lua``)."""


class ScheduleMode(StrEnum):
    """What the schedule script does with a pending timer of the same id."""

    REPLACE = "r"
    """Replace it (schedule and reschedule by a user's id)."""
    KEEP = "k"
    """Leave it and do not write (a failed timer's retry that must not overwrite)."""
    NEW = "n"
    """Refuse it unless it is this very call retried (generated ids must be new)."""


class EndingKind(StrEnum):
    """How a run ended, as the finish script reads it."""

    OK = "ok"
    SKIP = "skip"
    FAIL = "fail"
    REJECT = "reject"
    RETRY = "retry"
    RELEASE = "release"
    MOVE = "move"
    """Pending again in the group its task declares (uncounted as an attempt)."""
    WAIT = "wait"
    """Pending again, unmoved, until a later due time: releases disagree on its task's
    group (uncounted as an attempt)."""


class ClaimSource(StrEnum):
    """How a claimed run was found, as the claim script tags it (``r@<listener>``)."""

    EVENT = "e"
    SWEEP = "s"
    RECOVERED = "r"
    HANDOFF = "h"
    """Handed to the listener whose run freed the concurrency key slot it waited for."""
    NEXT = "n"
    """Handed along with a run that holds a concurrency key slot, as the run next in line
    after it (``n@<its token>``): it starts when that run ends and takes its slot over."""

    @property
    def label(self) -> str:
        return _SOURCE_LABELS[self]

    @classmethod
    def read(cls, tag: str) -> tuple[ClaimSource, str]:
        """A claim's source tag: the source and, for a recovered run, the listener that
        held it and died, for a run next in line, the token of the run it follows (an
        unknown tag reads as a sweep)."""
        found_by, _, died_on = tag.partition("@")
        try:
            return cls(found_by), died_on
        except ValueError:
            return cls.SWEEP, died_on


_SOURCE_LABELS = {ClaimSource.EVENT: "event", ClaimSource.SWEEP: "sweep",
                  ClaimSource.RECOVERED: "recovered", ClaimSource.HANDOFF: "handoff",
                  ClaimSource.NEXT: "next"}


class Counter(StrEnum):
    """The counters of the stats hash (see :mod:`timers.model.keys`)."""

    FIRED = "fired"
    """Runs that ended well."""
    FAILED = "failed"
    """Timers that failed for good (dead-lettered)."""
    SKIPPED = "skipped"
    """Runs a recurrence skipped (overlap or catch-up policy)."""
    RERUNS = "reruns"
    """Runs claimed again after their lease lapsed."""
    REJECTED = "rejected"
    """Expired keys that named no runnable timer."""
    RETRIED = "retried"
    """Failed attempts scheduled again after a backoff."""
    HANDED_BACK = "handed_back"
    """Unfinished runs a stopping listener put back in the due index."""
    LATE_FINISHES = "late_finishes"
    """Endings that came after their lease had lapsed."""
    ROUTED = "routed"
    """Timers moved to the group their task declares."""
    PLACED = "placed"
    """Runs moved, at their first claim, to the shard their task's limit lives in."""
    WAITED = "waited"
    """Times a due timer waited for a slot of its concurrency key."""
    RATE_LIMITED = "rate_limited"
    """Times a due timer waited for its rate limit."""
    HELD_MS = "held_ms"
    """Milliseconds timers spent waiting for keys and rate limits, added as each starts."""


@dataclass(frozen=True)
class FailureRecord:
    """What ``timers failed`` shows about a dead timer or a rejected event key.

    Times are Redis times in ms. A rejected key has ``key`` and no task; a dead timer
    whose record could not be decoded has ``record`` (its raw text) and no task.
    """

    kind: str
    error_type: str
    message: str
    failed_at: int
    id: str | None = None
    task: str | None = None
    args: Any = None
    record: str | None = None
    traceback: str = ""
    attempts: int | None = None
    due_ms: int | None = None
    first_failure: int | None = None
    key: str | None = None
    options: dict[str, str] | None = None
    """A dead timer's group, priority, concurrency key and max lateness, as its record
    held them (:data:`KEPT_OPTIONS`): a retry schedules it with the same ones."""

    def to_json(self) -> str:
        """The stored JSON (a rejected key's record carries only its own fields)."""
        data = asdict(self)
        order = _DEAD_FIELDS if self.key is None else _REJECTED_FIELDS
        return json.dumps({k: data[k] for k in order}, ensure_ascii=False, default=repr)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FailureRecord:
        """Read a stored record back; missing or mistyped fields take their defaults."""
        known = {f.name: f for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("kind", "error_type", "message"):
            if not isinstance(values.get(name), str):
                values[name] = ""
        if not isinstance(values.get("failed_at"), int):
            values["failed_at"] = 0
        for name in ("id", "task", "record", "key"):
            if not isinstance(values.get(name), str):
                values[name] = None
        for name in ("attempts", "due_ms", "first_failure"):
            if not isinstance(values.get(name), int):
                values[name] = None
        if not isinstance(values.get("traceback"), str):
            values["traceback"] = ""
        values["options"] = kept_options(values.get("options"))
        return cls(**values)


_DEAD_FIELDS = ("id", "task", "args", "record", "kind", "error_type", "message", "traceback",
                "attempts", "due_ms", "first_failure", "failed_at", "options")
_REJECTED_FIELDS = ("id", "key", "kind", "error_type", "message", "failed_at")
KEPT_OPTIONS = (Option.GROUP, Option.PRIORITY, Option.KEY, Option.MAX_LATENESS)
"""Record options a dead timer's failure record keeps, so that a retry keeps them."""


def kept_options(options: object) -> dict[str, str] | None:
    """Of a record's options (or a stored failure record's, read from JSON: anything),
    those a retry keeps; None when there are none."""
    if not isinstance(options, Mapping):
        return None
    kept = {str(k): v for k, v in options.items() if k in KEPT_OPTIONS and isinstance(v, str)}
    return kept or None


HEARTBEAT_INTERVAL = 10.0
"""Seconds between a listener's heartbeats; each holds its entry in ``P|listeners`` for
:data:`HEARTBEAT_MISSES` intervals, so a listener counts as alive until it misses them."""
HEARTBEAT_MISSES = 3

NEAR_HORIZON_MS = 3_600_000
"""Only timers due within this long (ms) have their expiring key; the rest wait in their
due index and the records, and listeners write their keys as they come within it
(``lua/near.lua``; ``lua/prelude.lua`` has the same value)."""
NEAR_INTERVAL = 30.0
"""Seconds between a listener's calls of ``near.lua`` (each keys the timers that came
within the horizon since the last one) while there are timers to key: a timer gets its
key between 59.5 and 60 minutes before its due time. Turns that key nothing slow down
to one in 5 minutes (``timers/listener/finding/near_keys.py``), so an idle listener sends its
heartbeats and little else."""
