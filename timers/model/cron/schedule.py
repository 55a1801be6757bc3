"""When a recurrence runs: pure functions of time, for cron expressions and intervals.

Time zones. Cron fields are matched against local wall time (croniter on naive datetimes,
which does no zone arithmetic) and mapped to instants here, because croniter on aware
datetimes runs a daily 02:30 job twice on the night clocks fall back. The rules:

- A wall time that does not exist (clocks spring forward over it) runs once, at the end
  of the gap: a daily 02:30 job in Europe/Berlin runs at 03:00 CEST on that day.
- A wall time that exists twice (clocks fall back) runs once, at its first pass (fold=0)…
- …unless the hour field is ``*`` (the job runs every hour): then, like Vixie cron, it
  follows real time: it runs in both passes of the repeated hour and skips the hour that
  does not exist, so ``*/15 * * * *`` runs every 15 minutes straight through both changes.

Intervals are fixed lengths of real time from an anchor (when the interval was declared)
and ignore time zones.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)
_DAY = timedelta(days=1)
_LONGEST_GAP = timedelta(days=366 * 30)


def to_ms(when: datetime) -> int:
    """Epoch milliseconds of an aware datetime, exactly."""
    return (when - EPOCH) // MS


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


class Schedule(Protocol):
    def next_after(self, after: datetime) -> datetime:
        """The first occurrence strictly after ``after`` (an aware datetime), in UTC."""
        ...

    def latest_at_or_before(self, at: datetime) -> datetime | None:
        """The last occurrence at or before ``at``; None if there is none."""
        ...


def upcoming(schedule: Schedule, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` occurrences after ``after``."""
    out: list[datetime] = []
    for _ in range(count):
        after = schedule.next_after(after)
        out.append(after)
    return out


def _offset(tz: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(tz).utcoffset()
    assert offset is not None
    return offset


def _first_change(tz: ZoneInfo, start: datetime, end: datetime, offset: timedelta) -> (
        datetime | None):
    """The first instant in ``(start, end]`` whose UTC offset in ``tz`` is not ``offset``.

    Steps a day at a time, then bisects to the second (zones change offset on whole
    seconds). Two changes within one day that cancel out are not seen; no zone has any.
    """
    low = start
    while low < end:
        high = min(low + _DAY, end)
        if _offset(tz, high) != offset:
            lo, hi = math.floor(low.timestamp()), math.ceil(high.timestamp())
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(tz, datetime.fromtimestamp(mid, UTC)) != offset:
                    hi = mid
                else:
                    lo = mid
            return datetime.fromtimestamp(hi, UTC)
        low = high
    return None


class CronSchedule:
    """A cron expression (croniter syntax) read in local wall time of ``tz``.

    ``hash_id`` seeds croniter's ``H`` fields, so every process derives the same times.
    """

    def __init__(self, expression: str, tz: str | ZoneInfo = "UTC", hash_id: str = "") -> None:
        self.expression = expression
        from zoneinfo import ZoneInfo  # (here: a command with no cron reads no zone)

        self.tz = tz if isinstance(tz, ZoneInfo) else ZoneInfo(tz)
        self.hash_id = hash_id.encode("utf-8") if hash_id else None
        from croniter import croniter  # (here: a command that reads no cron loads none)

        hours = croniter(expression, hash_id=self.hash_id).expanded[1]
        self.hourly = hours == ["*"] or set(hours) == set(range(24))
        """The hour field matches every hour: follow real time through clock changes."""

    def _match(self, wall: datetime, inclusive: bool) -> datetime:
        start = wall - timedelta(microseconds=1) if inclusive else wall
        from croniter import croniter

        found: datetime = croniter(self.expression, start, hash_id=self.hash_id).get_next(
            datetime)
        return found

    def next_after(self, after: datetime) -> datetime:
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("after must be timezone-aware")
        t = after.astimezone(UTC)
        offset = _offset(self.tz, t)
        start, inclusive = (t + offset).replace(tzinfo=None), False
        # Walk spans of constant UTC offset: inside one, wall time and real time move
        # together, so a wall time croniter finds is one instant.
        for _ in range(1000):
            wall = self._match(start, inclusive)
            candidate = (wall - offset).replace(tzinfo=UTC)
            change = _first_change(self.tz, t, candidate, offset)
            if change is None:
                first_pass = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
                if self.hourly or first_pass == candidate:
                    return candidate
                start, inclusive = wall, False  # the second pass of a repeated wall time
                continue
            new_offset = _offset(self.tz, change)
            skipped_to = (change + new_offset).replace(tzinfo=None)
            if not self.hourly and new_offset > offset and wall < skipped_to:
                return change  # the wall time does not exist that day: run as the gap ends
            t, offset, start, inclusive = change, new_offset, skipped_to, True
        raise RuntimeError(f"no next time found for {self.expression!r} after {after}")

    def latest_at_or_before(self, at: datetime) -> datetime | None:
        # Widen a window back from ``at`` until it holds an occurrence, then walk forward:
        # about two steps for a regular schedule, whatever its period.
        width = _SECOND
        while width <= _LONGEST_GAP:
            found = self.next_after(at - width)
            if found <= at:
                while (following := self.next_after(found)) <= at:
                    found = following
                return found
            width *= 2
        return None


class IntervalSchedule:
    """Every ``interval`` of real time: ``anchor + k * interval`` for k = 1, 2, …"""

    def __init__(self, interval: timedelta, anchor: datetime) -> None:
        if interval <= timedelta(0):
            raise ValueError("interval must be positive")
        self.interval = interval
        self.anchor = anchor.astimezone(UTC)  # aware arithmetic in a zone is wall time

    def next_after(self, after: datetime) -> datetime:
        steps = max(1, (after - self.anchor) // self.interval + 1)
        return self.anchor + steps * self.interval

    def latest_at_or_before(self, at: datetime) -> datetime | None:
        steps = (at - self.anchor) // self.interval
        return self.anchor + steps * self.interval if steps >= 1 else None
