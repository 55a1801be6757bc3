"""What a listener keeps of the runs it ends: history records and per-task series.

Both ride in the batched ``finish.lua`` call that writes the endings (no round trip of
their own): each ending that ends its timer carries its :class:`timers.wire.HistoryRecord`
text, and the batch's runs are summed here per task and minute into one
:class:`timers.wire.MinuteSlot` each, which the script adds to the task's ring
(``timers/lua/history.lua``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from timers.runs import RunFacts
from timers.wire import (
    DEFAULT_HISTORY_AGE,
    DEFAULT_HISTORY_COUNT,
    EndingKind,
    EndKind,
    HistoryRecord,
    MinuteSlot,
    bucket_of,
)

_ENDS = {EndingKind.OK: EndKind.COMPLETED, EndingKind.SKIP: EndKind.SKIPPED,
         EndingKind.FAIL: EndKind.DEAD}


@dataclass(frozen=True)
class HistoryPolicy:
    """How long a listener keeps ended timers' records (``age`` seconds, at most ``count``
    per shard; either 0: none), and whether it writes the per-task series."""

    age: float = DEFAULT_HISTORY_AGE
    count: int = DEFAULT_HISTORY_COUNT
    series: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.age) and self.age >= 0):
            raise ValueError(f"history age must be 0 or more seconds, got {self.age!r}")
        if self.count < 0:
            raise ValueError(f"history count must be 0 or more, got {self.count!r}")

    @property
    def keeps(self) -> bool:
        return self.age > 0 and self.count > 0

    @property
    def wire(self) -> tuple[int, int]:
        """(age ms, count) as ``finish.lua`` and ``P|histcfg`` take them (0, 0: none)."""
        return (round(self.age * 1000), self.count) if self.keeps else (0, 0)


OFF = HistoryPolicy(0, 0, series=False)
"""Keeps nothing."""


def history_text(facts: RunFacts, kind: EndingKind, listener: str) -> str:
    """The ending's fifth ``finish.lua`` value: ``<escaped id>:<record>``."""
    record = HistoryRecord(
        id="", task=facts.task, outcome=_ENDS[kind], ended_at=facts.ended_ms / 1000,
        listener=listener, duration_ms=facts.duration_ms, attempts=facts.attempts,
        lateness_ms=facts.lateness_ms, error=facts.error)
    return f"{facts.escaped_id}:{record.encode()}"


def series_of(facts: Sequence[RunFacts]) -> list[tuple[str, str]]:
    """The batch's runs summed per (task, minute), as ``finish.lua``'s series entries."""
    slots: dict[tuple[str, int], MinuteSlot] = {}
    for run in facts:
        if not run.ran:
            continue
        minute = run.ended_ms // 60_000
        slot = slots.get((run.task, minute))
        if slot is None:
            slot = slots[(run.task, minute)] = MinuteSlot(minute)
        slot.runs += 1
        slot.failures += run.failed
        if run.lateness_ms is not None:
            late = bucket_of(run.lateness_ms)
            slot.lateness[late] = slot.lateness.get(late, 0) + 1
        if run.duration_ms is not None:
            took = bucket_of(run.duration_ms)
            slot.duration[took] = slot.duration.get(took, 0) + 1
    return [(task, slot.encode()) for (task, _), slot in slots.items()]


def ends(kind: EndingKind) -> bool:
    """Whether an ending of this kind ends its timer (history keeps it)."""
    return kind in _ENDS
