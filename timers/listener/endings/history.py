"""What a listener keeps of the runs it ends: history records and per-task series.

Both ride in the batched ``finish.lua`` call that writes the endings (no round trip of
their own): each ending that ends its timer carries its :class:`timers.model.history.HistoryRecord`
text, and the batch's runs are summed here per task and minute into one
:class:`timers.model.history.MinuteSlot` each, which the script adds to the task's ring
(``timers/store/lua/history.lua``). The history's bounds are kept by
:class:`HistoryTrimmer`, a loop of its own, idle or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from timers.listener.retrying import RETRYABLE, Outage, Retry, pause
from timers.model.clock import Clock
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

TRIM_BUDGET = 250
"""About how many history records one ``trim.lua`` call drops or indexes: a call holds
Redis, which serves nobody else meanwhile, only briefly
(figures: bench/FINDINGS.md, "History trim calls")."""
TRIM_PAUSE = 0.005
"""Seconds between two trim calls while more is owed: Redis serves others between them."""
TRIM_EVERY = 1.0
"""Seconds between two trim calls when none is owed and this listener wrote history since
the last: its own writes over the count are dropped within this."""
TRIM_IDLE_MAX = 30.0
"""The longest wait between two trim calls of an idle listener (nothing written, nothing
dropped: the wait doubles from :data:`TRIM_EVERY` up to this): a record past its age, and
another listener's writes over this one's count, are dropped within this while idle."""
TRIM_EMPTY_WAIT = 300.0
"""The wait after a trim call that found the shard's history empty, while this listener
writes nothing: nothing can expire or be over the count until someone writes, and a
listener that writes trims its own writes to its bounds (to this one's lower count, or
after it died right after writing, within this)."""


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


class HistoryTrimmer:
    """Keeps one shard's run history to this listener's bounds (:class:`HistoryPolicy`;
    one that keeps none drops all), idle or not: a loop of ``trim.lua`` calls, each
    bounded (about :data:`TRIM_BUDGET` records), repeated after :data:`TRIM_PAUSE` while
    one says more is owed, else after :data:`TRIM_EVERY` if the listener wrote history
    since (:meth:`written`) or the call dropped some, else after a wait that doubles up to
    :data:`TRIM_IDLE_MAX` (an idle listener sends a trim call every half minute, not every
    second), or after :data:`TRIM_EMPTY_WAIT` when the history is empty.
    Each call is atomic and idempotent, so listeners sharing a prefix trim side by side.
    The same calls index the records written before the index existed (``history.lua``
    history_plan)."""

    def __init__(self, scripts: Any, policy: HistoryPolicy, closed: asyncio.Event,
                 outage: Outage | None = None, budget: int = TRIM_BUDGET) -> None:
        self.scripts, self.closed, self.budget = scripts, closed, budget
        self.count = policy.wire[1]
        self.outage = outage
        self._wrote = False
        self.empty = False
        """The last call found the shard's history empty."""

    async def step(self) -> tuple[int, bool]:
        """One call: (records dropped or indexed, whether more is owed now)."""
        done, more, empty = await self.scripts.trim(self.count, self.budget)
        self.empty = bool(int(empty))
        return int(done), bool(int(more))

    def written(self) -> None:
        """The listener wrote endings (and with them history) to this shard."""
        self._wrote = True

    async def run(self) -> None:
        """Trim until the listener closes."""
        retry = Retry(self.closed, "trimming the run history", self.outage)
        idle = TRIM_EVERY
        while (reply := await retry.answer(self.step)) is not None:
            done, more = reply
            if more:
                await pause(TRIM_PAUSE, self.closed)
                continue
            idle = (TRIM_EVERY if done or self._wrote else TRIM_EMPTY_WAIT if self.empty
                    else min(2 * idle, TRIM_IDLE_MAX))
            self._wrote = False
            waited = 0.0
            while waited < idle and not self._wrote and not self.closed.is_set():
                await pause(TRIM_EVERY, self.closed)
                waited += TRIM_EVERY

    async def settle(self, clock: Clock, within: float = 5.0) -> None:
        """Trim till nothing is owed, for ``within`` seconds at most (a burst's end)."""
        deadline = clock.monotonic() + within
        with contextlib.suppress(*RETRYABLE):
            while clock.monotonic() < deadline and (await self.step())[1]:
                pass
