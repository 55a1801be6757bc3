"""The stored vocabulary: the words that travel between Python, Lua and Redis.

Every letter of a record option, kind of run ending, claim source and stats counter is
named here once, and a dead timer's failure record is a typed :class:`FailureRecord`.
The Lua scripts spell the same words (``timers/store/lua/*.lua``); the tests in
``tests/unit/test_wire.py`` keep both sides in step.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
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
NEAR_INTERVAL = 5.0
"""Seconds between a listener's calls of ``near.lua`` (each keys the timers that came
within the horizon since the last one)."""


# -- run history and per-task series (timers/store/lua/finish.lua, cancel.lua) -------------------


class TimerState(StrEnum):
    """Where a timer is, as ``status`` reports it."""

    PENDING = "pending"
    """Waiting for its due time."""
    WAITING = "waiting"
    """Due (or held back) but not started: on a concurrency key, a rate limit, a group no
    live listener serves, or a retry's backoff (``waiting_on``)."""
    RUNNING = "running"
    COMPLETED = "completed"
    SKIPPED = "skipped"
    DEAD = "dead"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    """Never existed, or ended longer ago than the history keeps."""


class EndKind(StrEnum):
    """How a timer ended, as its history record says (one letter stored)."""

    COMPLETED = "completed"
    """Its task returned."""
    SKIPPED = "skipped"
    """A recurrence's occurrence skipped on purpose (overlap or catch-up policy)."""
    DEAD = "dead"
    """Failed for good (retries spent, missed, refused, crashed too often …)."""
    CANCELLED = "cancelled"
    """Cancelled while pending."""

    @property
    def letter(self) -> str:
        return self.value[:2]


_END_OF_LETTER = {kind.letter: kind for kind in EndKind}
HISTORY_ERROR_CHARS = 200
"""Characters of a dead run's error summary kept in its history record."""


@dataclass(frozen=True)
class HistoryRecord:
    """One ended timer, as kept for the history's retention (newest end of each id).

    ``ended`` is a Redis time in epoch seconds; ``duration_ms`` and ``lateness_ms`` are None
    for a timer that never ran (cancelled, skipped). ``listener`` is the id
    (``host:pid:…``) of the listener that ended it, or for a cancel the ``host:pid`` of
    the process that cancelled it. ``error`` (``ErrorType: message``, clipped to
    :data:`HISTORY_ERROR_CHARS`) is empty unless it died.
    """

    id: str
    task: str
    outcome: EndKind
    ended: float
    listener: str = ""
    duration_ms: int | None = None
    attempts: int = 0
    lateness_ms: int | None = None
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome is EndKind.DEAD

    @property
    def host(self) -> str:
        """The host of :attr:`listener` (``host:pid:…``)."""
        return self.listener.split(":", 1)[0]

    @property
    def pid(self) -> int | None:
        """The process id of :attr:`listener`, None when it names none."""
        part = self.listener.split(":")[1:2]
        return int(part[0]) if part and part[0].isdigit() else None

    def encode(self) -> str:
        """The stored text: ``ki|ended ms|duration|attempts|lateness|listener|task|error``
        (an absent number is empty); the escaped id is the field it is stored under."""
        return "|".join((
            self.outcome.letter, str(round(self.ended * 1000)), _num(self.duration_ms),
            str(self.attempts), _num(self.lateness_ms), self.listener.replace("|", "_"),
            self.task, self.error[:HISTORY_ERROR_CHARS].replace("\n", " ")))

    @classmethod
    def decode(cls, timer_id: str, text: str) -> HistoryRecord | None:
        """A stored record back; None when it does not read."""
        parts = text.split("|", 7)
        if len(parts) != 8 or parts[0] not in _END_OF_LETTER:
            return None
        letter, ended, duration, attempts, late, listener, task, error = parts
        try:
            return cls(timer_id, task, _END_OF_LETTER[letter], int(ended) / 1000, listener,
                       _int_or_none(duration), int(attempts or 0), _int_or_none(late), error)
        except ValueError:
            return None


HISTORY_BATCH_START = ":"
"""How a history batch id starts (``:<n>``); no escaped timer id holds ``:``."""


@dataclass(frozen=True)
class StoredHistory:
    """A ``P|histrec`` value: ``<batch id>|`` and the :class:`HistoryRecord` text, as
    ``timers/store/lua/history.lua`` writes it; the previous release's value, the record
    text alone, reads with ``batch`` None (it is indexed by its escaped id instead)."""

    batch: str | None
    record: HistoryRecord | None
    """None when the record text does not read."""

    def encode(self) -> str:
        """The stored text (the record must be there)."""
        assert self.record is not None
        text = self.record.encode()
        return text if self.batch is None else f"{self.batch}|{text}"

    @classmethod
    def decode(cls, timer_id: str, text: str) -> StoredHistory:
        """A stored value back, for timer ``timer_id``."""
        batch: str | None = None
        if text.startswith(HISTORY_BATCH_START):
            batch, _, text = text.partition("|")
        return cls(batch, HistoryRecord.decode(timer_id, text))

    def of(self, member: str) -> HistoryRecord | None:
        """The record when this value is the one index member ``member`` wrote (a batch id,
        or for the previous release's index, the escaped id itself), else None: a newer
        end rewrote it (the record is listed under its own batch)."""
        if member.startswith(HISTORY_BATCH_START):
            return self.record if self.batch == member else None
        return self.record if self.batch is None else None


def _num(value: int | None) -> str:
    return "" if value is None else str(value)


def _int_or_none(text: str) -> int | None:
    return int(text) if text else None


HISTOGRAM_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000,
                       30_000, 60_000, 300_000, 3_600_000)
"""Upper bounds (ms, inclusive) of the buckets of a series' lateness and duration
histograms; one more bucket holds what is above the last. Percentiles read from them are
bucket bounds interpolated by rank (:func:`histogram_percentile`); a percentile in the
last bucket reads as its lower bound, 1 h ("an hour or more")."""
SERIES_MINUTES = 1440
"""Minute slots per task in the series ring: the last 24 h."""


def bucket_of(ms: float) -> int:
    """The histogram bucket of a value in ms."""
    return bisect_left(HISTOGRAM_BOUNDS_MS, ms)


def histogram_percentile(counts: Mapping[int, int], p: float) -> float:
    """The ``p``-th percentile (0 to 100) of a bucket histogram (bucket -> count), in ms:
    the rank's place within its bucket, linearly between the bucket's bounds (the last
    bucket reads as its lower bound). 0.0 for an empty histogram."""
    total = sum(counts.values())
    if total <= 0:
        return 0.0
    rank = max(1.0, p / 100 * total)
    seen = 0
    for index in sorted(counts):
        count = counts[index]
        if count <= 0:
            continue
        if seen + count >= rank:
            low = 0 if index == 0 else HISTOGRAM_BOUNDS_MS[index - 1]
            if index >= len(HISTOGRAM_BOUNDS_MS):
                return float(low)
            high = HISTOGRAM_BOUNDS_MS[index]
            return low + (high - low) * (rank - seen) / count
        seen += count
    return float(HISTOGRAM_BOUNDS_MS[-1])


@dataclass
class MinuteSlot:
    """One task's figures for one minute, as the series ring stores them:
    ``minute runs failures l<bucket>=<n>,… d<bucket>=<n>,…`` (the lateness and duration
    histograms, non-empty buckets only). ``minute`` is the epoch minute (seconds // 60)."""

    minute: int
    runs: int = 0
    failures: int = 0
    lateness: dict[int, int] = field(default_factory=dict)
    duration: dict[int, int] = field(default_factory=dict)

    def add(self, other: MinuteSlot) -> None:
        self.runs += other.runs
        self.failures += other.failures
        for mine, theirs in ((self.lateness, other.lateness), (self.duration, other.duration)):
            for index, count in theirs.items():
                mine[index] = mine.get(index, 0) + count

    def encode(self) -> str:
        late = ",".join(f"{i}={n}" for i, n in sorted(self.lateness.items()))
        took = ",".join(f"{i}={n}" for i, n in sorted(self.duration.items()))
        return f"{self.minute} {self.runs} {self.failures} l{late} d{took}"

    @classmethod
    def decode(cls, text: str) -> MinuteSlot | None:
        parts = text.split(" ")
        if len(parts) != 5 or not parts[3].startswith("l") or not parts[4].startswith("d"):
            return None
        try:
            return cls(int(parts[0]), int(parts[1]), int(parts[2]),
                       _buckets(parts[3][1:]), _buckets(parts[4][1:]))
        except ValueError:
            return None

    def stats(self) -> MinuteStats:
        return MinuteStats(
            self.minute * 60, self.runs, self.failures,
            histogram_percentile(self.lateness, 50), histogram_percentile(self.lateness, 99),
            histogram_percentile(self.duration, 50), histogram_percentile(self.duration, 99))


def _buckets(text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for item in filter(None, text.split(",")):
        index, _, count = item.partition("=")
        out[int(index)] = out.get(int(index), 0) + int(count)
    return out


@dataclass(frozen=True)
class MinuteStats:
    """One minute of a task's runs (or of every task's, summed): ``minute`` is the epoch
    seconds of its start; ``runs`` counts attempts that ended (completed or failed, a
    failure that will retry included), ``failures`` those that failed; the percentiles
    (ms, 0.0 for a minute without runs) come from the fixed histograms of
    :data:`HISTOGRAM_BOUNDS_MS`."""

    minute: int
    runs: int = 0
    failures: int = 0
    lateness_p50_ms: float = 0.0
    lateness_p99_ms: float = 0.0
    duration_p50_ms: float = 0.0
    duration_p99_ms: float = 0.0


DEFAULT_HISTORY_AGE = 7 * 86400.0
"""Seconds an ended timer's history record is kept by default."""
DEFAULT_HISTORY_COUNT = 100_000
"""History records kept per shard by default (the oldest go first)."""
