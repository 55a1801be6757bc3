"""Rate limits: ``"100/m"`` is at most 100 starts a minute, spread evenly.

A rate of ``count`` per ``period`` lets one start through every :attr:`Rate.interval_ms`
(``period / count``, rounded up), fleet-wide; ``burst`` starts may go through back to back
after a quiet spell. A timer over the limit waits for its next slot: never dropped, never
run early.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RATE_RE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts per ``period_ms``, spread evenly; up to ``burst`` at once."""

    count: int
    period_ms: int
    burst: int = 1

    def __post_init__(self) -> None:
        for name in ("count", "period_ms", "burst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"rate {name} must be an integer of 1 or more, got {value!r}")

    @property
    def interval_ms(self) -> int:
        """The spacing between two starts: ``period_ms / count`` rounded up, at least 1."""
        return max(1, -(-self.period_ms // self.count))

    @classmethod
    def parse(cls, text: str, burst: int = 1) -> Rate:
        """``"100/m"``, ``"5/s"``, ``"100/h"``, ``"1000/d"``, or with a multiplier of the
        unit, ``"10/30s"``, ``"3/5m"``."""
        if not isinstance(text, str):
            raise ValueError(f"rate must be a string such as '100/m', got {type(text).__name__}")
        match = _RATE_RE.fullmatch(text)
        if match is None:
            raise ValueError(
                f"rate {text!r} must look like '100/m' (per s, m, h or d; e.g. '10/30s')"
            )
        count, times, unit = int(match[1]), int(match[2] or "1"), match[3]
        if count < 1:
            raise ValueError(f"rate {text!r} must allow at least 1 start per period")
        if times < 1:
            raise ValueError(f"rate {text!r} needs a period of at least 1{unit}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be an integer of 1 or more, got {burst!r}")
        return cls(count, times * UNIT_MS[unit], burst)

    def __str__(self) -> str:
        text = f"{self.count}/{_period_text(self.period_ms)}"
        return text if self.burst == 1 else f"{text} (burst {self.burst})"


def _period_text(period_ms: int) -> str:
    """``m`` for a minute, ``30s`` for 30 seconds, ``1500ms`` for what no unit divides."""
    for unit in ("d", "h", "m", "s"):
        size = UNIT_MS[unit]
        if period_ms % size == 0:
            times = period_ms // size
            return unit if times == 1 else f"{times}{unit}"
    return f"{period_ms}ms"
