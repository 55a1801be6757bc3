"""Due times: ``in_``/``at`` arguments and human durations such as ``90s`` or ``1h30m``."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timedelta
from typing import Literal

from timers.exceptions import InvalidDueTime

MAX_DUE_MS = 253_402_300_799_999
"""The last millisecond of the year 9999: later due times are refused."""
MAX_DELAY_MS = 100 * 366 * 86_400_000
"""A hundred years: longer delays are refused."""

DueSpec = tuple[Literal["in", "at"], int]
"""("in", ms from now on the Redis clock) or ("at", epoch ms)."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def seconds(value: float | timedelta, name: str = "in_") -> float:
    """A finite number of seconds from an int, float or timedelta."""
    if type(value) is float or type(value) is int:  # (most delays: no more to check)
        if math.isfinite(value):
            return float(value)
    elif isinstance(value, timedelta):
        return value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDueTime(
            f"{name} must be seconds (int or float) or a timedelta, got {type(value).__name__}"
        )
    if not math.isfinite(value):
        raise InvalidDueTime(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def due_spec(in_: float | timedelta | None, at: datetime | None) -> DueSpec:
    """Turn exactly one of ``in_`` / ``at`` into what the schedule script takes.

    ``in_`` is relative to the Redis clock (the script adds it to ``TIME``), so producers
    with skewed clocks still agree; ``at`` is an absolute instant. A time in the past is
    allowed and means "as soon as possible"; ``at`` before 1970 is refused (``in_`` that
    far back counts as 1970, as soon as possible too).
    """
    if (in_ is None) == (at is None):
        raise InvalidDueTime("give exactly one of in_ (seconds or timedelta) or at (datetime)")
    if at is not None:
        if not isinstance(at, datetime):
            raise InvalidDueTime(f"at must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidDueTime(
                "at must be timezone-aware, e.g. datetime(..., tzinfo=timezone.utc)"
            )
        ms = round(at.timestamp() * 1000)
        if ms < 0:
            raise InvalidDueTime(f"at {at.isoformat()} is before 1970; give a time from "
                                 f"1970-01-01 on (a time in the past fires at once)")
        if ms > min(MAX_DUE_MS, round(time.time() * 1000) + MAX_DELAY_MS):
            # the producer's clock: a bound this wide needs no agreement with Redis's
            raise InvalidDueTime(f"at {at.isoformat()} is more than a hundred years away")
        return ("at", ms)
    assert in_ is not None
    ms = round(seconds(in_) * 1000)
    if abs(ms) > MAX_DELAY_MS:
        raise InvalidDueTime(f"in_ of {ms / 1000:g} s is more than a hundred years "
                             f"{'ago' if ms < 0 else 'away'}")
    return ("in", ms)


def parse_duration(text: str) -> float:
    """Seconds in ``30``, ``30s``, ``250ms``, ``5m``, ``2h``, ``1d``, ``1h30m``, ``1.5h``."""
    cleaned = text.strip().lower().replace(" ", "")
    try:
        value = float(cleaned)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
    if cleaned and _PART_RE.sub("", cleaned) == "":
        return sum(float(n) * _UNITS[unit] for n, unit in _PART_RE.findall(cleaned))
    raise InvalidDueTime(
        f"cannot read duration {text!r}: use a number of seconds or e.g. 250ms, 30s, 5m, "
        f"2h, 1d, 1h30m"
    )


def parse_delay(text: str) -> float:
    """Like :func:`parse_duration`, and a leading ``-`` (a delay in the past: due now),
    as ``in_`` accepts a negative number of seconds."""
    cleaned = text.strip()
    if cleaned.startswith("-"):
        return -parse_duration(cleaned[1:])
    return parse_duration(cleaned)


def format_duration(seconds_: float) -> str:
    """A short human reading of a duration, e.g. ``2h 5m`` or ``-3.2s`` (overdue)."""
    sign = "-" if seconds_ < 0 else ""
    s = abs(seconds_)
    if s < 1:
        return f"{sign}{s * 1000:.0f}ms"
    if s < 60:
        return f"{sign}{s:.1f}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            count = int(s // size)
            s -= count * size
            parts.append(f"{count}{unit}")
        if len(parts) == 2:
            break
    return sign + " ".join(parts)


def interval_words(seconds: float) -> str:
    """``5s``, ``1m 30s``, ``2h``, ``1d 6h``: a recurrence's interval, exact (a fraction of
    a second as :func:`format_duration` gives it)."""
    if seconds != int(seconds) or seconds < 1:
        return format_duration(seconds)
    left, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts)
