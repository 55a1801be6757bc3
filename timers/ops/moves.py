"""Move timers from one prefix to another on the same server (``timers move``).

Two apps that shared a prefix by mistake each want their own: this moves the pending
timers of chosen tasks (and, if asked, their dead ones) over, one script call per page of
timers (``lua/move.lua``), each timer gone from the old prefix only as it is written under
the new one. Timers a flow gate holds (in a concurrency key's or a rate limit's queue),
running ones and those whose id the new prefix has already are left where they are and
counted; a second run moves what came due meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Record, as_text
from timers.model.keys import Keyspace
from timers.ops.base import Call, Operation
from timers.store.scripts import ScriptCalls

MOVE_PAGE = 200
"""Timers per script call."""


@dataclass
class MoveSummary:
    """What a move did."""

    moved: int = 0
    """Pending timers now under the new prefix."""
    dead_moved: int = 0
    """Dead timers' failure records now under the new prefix."""
    held: int = 0
    """Left: a flow gate holds them (a key's or a rate's queue): in no due index."""
    taken: int = 0
    """Left: the new prefix has a timer (or a dead one) with that id already."""

    def add(self, reply: Sequence[object], dead: bool) -> tuple[int, int]:
        """Count one script reply; returns (left in place, gone meanwhile)."""
        moved, gone, other, held, taken = (int(str(n)) for n in reply)
        if dead:
            self.dead_moved += moved
        else:
            self.moved += moved
        self.held += held
        self.taken += taken
        return other + held + taken, gone


def _task_of(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    try:
        return Record.decode(as_text(raw)).task
    except MalformedTimerKey:
        return None


def _held_by_gates(source: Keyspace, chosen: set[str], page: int) -> Operation[int]:
    """How many timers of the chosen tasks (empty: any) a flow gate holds (``P|parked``):
    in no due index, so not moved."""
    (ids,) = yield [Call(command=("HKEYS", source.parked))]
    names = [as_text(i) for i in ids or []]
    if not chosen:
        return len(names)
    held = 0
    for start in range(0, len(names), page):
        (records,) = yield [Call(command=("HMGET", source.records,
                                          *names[start:start + page]))]
        held += sum(1 for raw in records if _task_of(raw) in chosen)
    return held


def move_timers(source: Keyspace, target: Keyspace, tasks: Sequence[str] = (),
                dead: bool = False, page: int = MOVE_PAGE) -> Operation[MoveSummary]:
    """Move the pending timers of ``tasks`` (empty: every task) from ``source``'s prefix to
    ``target``'s, and with ``dead`` their dead timers' records too."""
    calls = ScriptCalls(source)
    summary = MoveSummary()
    (queues,) = yield [Call(command=("SMEMBERS", source.queues))]
    indexes = [source.due, *(f"{source.due}|{as_text(q)}" for q in sorted(queues or []))]
    chosen = set(tasks)
    for index in indexes:
        offset = 0
        while True:
            (ids,) = yield [Call(command=("ZRANGE", index, offset, offset + page - 1))]
            if not ids:
                break
            names = [as_text(i) for i in ids]
            if chosen:
                (records,) = yield [Call(command=("HMGET", source.records, *names))]
                picked = [n for n, raw in zip(names, records, strict=True)
                          if _task_of(raw) in chosen]
                offset += len(names) - len(picked)
            else:
                picked = names
            if picked:
                (reply,) = yield [Call.of(calls.move(target, tasks, False, picked))]
                offset += summary.add(reply, dead=False)[0]
    summary.held += yield from _held_by_gates(source, chosen, page)
    if dead:
        offset = 0
        while True:
            (ids,) = yield [Call(command=("ZRANGE", source.failure_index, offset,
                                          offset + page - 1))]
            if not ids:
                break
            (reply,) = yield [Call.of(calls.move(target, tasks, True,
                                                 [as_text(i) for i in ids]))]
            offset += summary.add(reply, dead=True)[0]
    return summary
