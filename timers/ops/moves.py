"""Move timers from one prefix to another on the same server (``timers move``).

Two apps that shared a prefix by mistake each want their own: this moves the pending
timers of chosen tasks (and, if asked, their dead ones) over, a page of one index per
script call (``lua/move.lua``), each timer gone from the old prefix only as it is written
under the new one.

Each index is walked by a cursor that removals cannot shift (design invariant 14): the
last entry read, (score, member), not a rank, so the timers the old prefix's listeners
claim meanwhile make it skip none. Walks are repeated (:func:`move_all`) until one moves
nothing while no run of those tasks is in flight under the old prefix: a run claimed
there ends there or comes back pending (handed back, retried) and is moved by the next
walk. Timers a flow limit holds (in a concurrency key's or a rate limit's queue, or
promoted to a slot the old prefix keeps), those whose id the new prefix has already, and
runs still in flight when the wait is over are left where they are and counted. Moved
timers are gone from the old prefix: running it again moves only what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model import run_record
from timers.model.encoding import Record, as_text
from timers.model.keys import Keyspace
from timers.ops.base import Call, Operation
from timers.store.script_calls import ScriptCalls

MOVE_PAGE = 200
"""Index entries each script call reads."""
MOVE_WAIT_S = 30.0
"""How long a move waits, by default, for runs of its tasks in flight under the old
prefix to end or come back pending."""
POLL_S = 0.1
"""How often a waiting move looks again."""


@dataclass
class Walk:
    """One walk over the old prefix's indexes: what it moved, what it left and why."""

    moved: int = 0
    """Pending timers now under the new prefix."""
    dead_moved: int = 0
    """Dead timers' failure records now under the new prefix."""
    held: int = 0
    """Left: a flow limit holds them (a key's or a rate's queue, or promoted)."""
    taken: int = 0
    """Left: the new prefix has a timer (or a dead one) with that id already."""


@dataclass
class MoveSummary(Walk):
    """What a move did (its walks' moves), and what its last walk left and why."""

    running: int = 0
    """Left: runs of the tasks still in flight under the old prefix when the wait ended
    (each ends there or comes back pending; a second move moves those)."""
    walks: int = 0
    """Walks over the indexes."""

    @property
    def left(self) -> int:
        """Timers (and dead ones) left under the old prefix, for any reason."""
        return self.held + self.taken + self.running


def _task_of(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    try:
        return Record.decode(as_text(raw)).task
    except MalformedTimerKey:
        return None


def _held_by_gates(source: Keyspace, chosen: set[str], page: int) -> Operation[int]:
    """How many timers of the chosen tasks (empty: any) a flow limit holds (``P|parked``):
    waiting in a queue, or promoted to a slot of the old prefix; not moved."""
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


def runs_in_flight(source: Keyspace, tasks: Sequence[str] = ()) -> Operation[frozenset[str]]:
    """The ids (escaped) of the timers of ``tasks`` (empty: any) claimed under ``source``'s
    prefix and not ended: claimed, next in line or running."""
    (entries,) = yield [Call(command=("HVALS", source.running_records))]
    chosen = set(tasks)
    ids = set()
    for entry in entries or []:
        try:
            _, _, _, escaped, record = run_record.decode(as_text(entry))
        except ValueError:
            continue
        if not chosen or run_record.record_head(record)[0] in chosen:
            ids.add(escaped)
    return frozenset(ids)


def _walk_index(calls: ScriptCalls, target: Keyspace, tasks: Sequence[str], dead: bool,
                index: str, page: int, walk: Walk) -> Operation[None]:
    after = ("", "")
    while True:
        (reply,) = yield [Call.of(calls.move(target, tasks, dead, index, page, after))]
        moved, _, _, taken, read = (int(str(n)) for n in reply[:5])
        if dead:
            walk.dead_moved += moved
        else:
            walk.moved += moved
        walk.taken += taken
        if read < page:
            return
        after = (as_text(reply[5]), as_text(reply[6]))


def move_timers(source: Keyspace, target: Keyspace, tasks: Sequence[str] = (),
                dead: bool = False, page: int = MOVE_PAGE) -> Operation[Walk]:
    """One walk: move the pending timers of ``tasks`` (empty: every task) from ``source``'s
    prefix to ``target``'s, and with ``dead`` their dead timers' records too, walking each
    due index (and the failure index) once by a cursor removals cannot shift."""
    calls = ScriptCalls(source)
    walk = Walk()
    (queues,) = yield [Call(command=("SMEMBERS", source.queues))]
    indexes = [source.due, *(f"{source.due}|{as_text(q)}" for q in sorted(queues or []))]
    for index in indexes:
        yield from _walk_index(calls, target, tasks, False, index, page, walk)
    if dead:
        yield from _walk_index(calls, target, tasks, True, source.failure_index, page, walk)
    walk.held = yield from _held_by_gates(source, set(tasks), page)
    return walk


def move_all(run: Callable[[Operation[Any]], Any], source: Keyspace, target: Keyspace,
             tasks: Sequence[str] = (), dead: bool = False, wait: float = MOVE_WAIT_S,
             page: int = MOVE_PAGE, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> MoveSummary:
    """Walk (:func:`move_timers`, each driven by ``run``, e.g. ``Timers.run``) until a walk
    moves nothing while no run of ``tasks`` is in flight under the old prefix, before it or
    after it; runs in flight are waited for up to ``wait`` seconds, then counted as left.
    What is left is what the last walk left."""
    summary = MoveSummary()
    deadline = clock() + wait
    before: frozenset[str] = run(runs_in_flight(source, tasks))
    while True:
        walk: Walk = run(move_timers(source, target, tasks, dead, page))
        after: frozenset[str] = run(runs_in_flight(source, tasks))
        summary.walks += 1
        summary.moved += walk.moved
        summary.dead_moved += walk.dead_moved
        summary.held, summary.taken, summary.running = walk.held, walk.taken, 0
        moved = walk.moved + walk.dead_moved
        if not moved and not before and not after:
            return summary
        if clock() >= deadline:
            summary.running = len(after)
            return summary
        if not moved and after:
            sleep(POLL_S)  # they end there, or come back pending for the next walk
        before = after
