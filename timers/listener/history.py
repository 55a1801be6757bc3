"""What a listener keeps of the runs it ends: history records and per-task series.

Both ride in the batched ``finish.lua`` call that writes the endings (no round trip of
their own): each ending that ends its timer carries its :class:`timers.model.history.HistoryRecord`
text, and the batch's runs are summed here per task and minute into one
:class:`timers.model.history.MinuteSlot` each, which the script adds to the task's ring
(``timers/store/lua/history.lua``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from timers.model.history import (
    DEFAULT_HISTORY_AGE,
    DEFAULT_HISTORY_COUNT,
    HISTORY_ERROR_CHARS,
    EndKind,
    MinuteSlot,
    bucket_of,
)
from timers.model.runs import RunFacts
from timers.model.wire import EndingKind


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


ENDS = {EndingKind.OK: EndKind.COMPLETED.letter, EndingKind.SKIP: EndKind.SKIPPED.letter,
        EndingKind.FAIL: EndKind.DEAD.letter}
"""The endings that end their timer, and the letters their history records say it with."""


def history_text(facts: RunFacts, kind: EndingKind, listener: str) -> str:
    """The ending's history record (:meth:`timers.model.history.HistoryRecord.encode`'s text, made
    in one step: it is made per run)."""
    error = facts.error
    if error:
        error = error[:HISTORY_ERROR_CHARS].replace("\n", " ")
    duration, late = facts.duration_ms, facts.lateness_ms
    return (f"{ENDS[kind]}|{facts.ended_ms}|{'' if duration is None else duration}|"
            f"{facts.attempts}|{'' if late is None else late}|{listener}|{facts.task}|{error}")


def series_of(*facts: Sequence[RunFacts]) -> list[tuple[str, str]]:
    """The runs summed per (task, minute), as ``finish.lua``'s series entries."""
    slots: dict[tuple[str, int], MinuteSlot] = {}
    for run in (run for part in facts for run in part):
        if not run.ran:
            continue
        key = (run.task, run.ended_ms // 60_000)
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = MinuteSlot(key[1])
        slot.runs += 1
        if run.failed:
            slot.failures += 1
        if run.lateness_ms is not None:
            late = bucket_of(run.lateness_ms)
            slot.lateness[late] = slot.lateness.get(late, 0) + 1
        if run.duration_ms is not None:
            took = bucket_of(run.duration_ms)
            slot.duration[took] = slot.duration.get(took, 0) + 1
    return [(task, slot.encode()) for (task, _), slot in slots.items()]
