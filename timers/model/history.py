"""The run history's and the per-task series' stored words: what ``finish.lua`` and
``cancel.lua`` write of each ended timer (``timers/store/lua/history.lua``) and of each
task's minute, and how Python reads them back (``status``, ``timers history``, the
dashboard's charts). ``tests/unit/test_history.py`` keeps both sides in step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


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
    `HISTORY_ERROR_CHARS`) is empty unless it died.
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
        """The host of `listener` (``host:pid:…``)."""
        return self.listener.split(":", 1)[0]

    @property
    def pid(self) -> int | None:
        """The process id of `listener`, None when it names none."""
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
HISTORY_INDEXED = "::"
"""How the id of a batch whose records are in the indexes starts (``::<n>``, every batch
written since the indexes exist): the index upkeep passes those over by name."""


@dataclass(frozen=True)
class StoredHistory:
    """A ``P|histrec`` value: ``<batch id>|`` and the :class:`HistoryRecord` text, as
    ``timers/store/lua/history.lua`` writes it."""

    batch: str
    record: HistoryRecord | None
    """None when the record text does not read."""

    def encode(self) -> str:
        """The stored text (the record must be there)."""
        assert self.record is not None
        return f"{self.batch}|{self.record.encode()}"

    @classmethod
    def decode(cls, timer_id: str, text: str) -> StoredHistory:
        """A stored value back, for timer ``timer_id`` (``record`` None when it does not
        read)."""
        batch, _, text = text.partition("|")
        if not batch.startswith(HISTORY_BATCH_START):
            return cls(batch, None)
        return cls(batch, HistoryRecord.decode(timer_id, text))

    def of(self, member: str) -> HistoryRecord | None:
        """The record when this value is the one batch ``member`` wrote, else None: a newer
        end rewrote it (the record is listed under its own batch)."""
        return self.record if self.batch == member else None


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
    `HISTOGRAM_BOUNDS_MS`."""

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
