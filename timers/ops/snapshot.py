"""The state of a whole keyspace in two round trips, for metrics, ``timers top`` and the
dashboard: what is pending, due soon, overdue, running, held back, dead; which listeners
are alive and how late their recent runs started.

Every figure is a count Redis keeps or an ``O(log n)`` range count on a due index, so
reading one costs the same with a million timers pending as with ten (``bench/`` measures
it); nothing walks an index. Recurrence states are read whole: there is one per recurrence,
not per timer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timers.model.encoding import as_text
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.wire import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
from timers.ops.base import Call, Operation, live_heartbeats, pairs

HEARTBEAT_HOLD_MS = HEARTBEAT_INTERVAL * HEARTBEAT_MISSES * 1000

OVERDUE_AFTER_MS = 1000
"""A timer due longer ago than this and not claimed yet is overdue: no listener is
keeping up (or none runs its group). Listeners claim timers within milliseconds."""
SOON_MS = (60_000, 3_600_000)
"""The "due in the next minute / hour" windows."""


@dataclass(frozen=True)
class QueueFigures:
    """One due index (a group at one priority)."""

    group: str
    priority: int
    pending: int
    overdue: int
    due_next_minute: int
    due_next_hour: int


@dataclass(frozen=True)
class FleetSnapshot:
    """A keyspace at one instant (``redis_ms``, the Redis clock)."""

    redis_ms: int
    queues: list[QueueFigures]
    running: dict[str, int]
    """Runs under way, per group."""
    held_back: int
    """Due timers waiting for a concurrency key or a rate limit (and those promoted)."""
    dead: int
    """Dead timers kept for ``timers failed`` (retry or purge them)."""
    failures: int
    """Every failure record: dead timers and rejected event keys."""
    counters: dict[str, int]
    """The stats counters since the keyspace began (``timers stats``)."""
    listeners: list[dict[str, Any]]
    """Live listeners' heartbeats (id, host, pid, groups, running, recent lateness …)."""
    recurrences: int
    recurrences_paused: int
    groups: list[str] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return sum(q.pending for q in self.queues) + self.held_back

    @property
    def overdue(self) -> int:
        return sum(q.overdue for q in self.queues)

    def pending_by_group(self) -> dict[str, int]:
        out = dict.fromkeys(self.groups, 0)
        for q in self.queues:
            out[q.group] = out.get(q.group, 0) + q.pending
        return out

    def serving(self) -> dict[str, int]:
        """Live listeners serving each group: every group with timers pending and every
        group a listener serves (0 for a group none serves)."""
        out = dict.fromkeys(self.pending_by_group(), 0)
        for beat in self.listeners:
            for group in beat["groups"] or [DEFAULT_GROUP]:
                out[group] = out.get(group, 0) + 1
        return out

    def due_within(self, window_ms: int) -> int:
        """Timers due from now to ``window_ms`` ahead (one of :data:`SOON_MS`)."""
        pick = {SOON_MS[0]: "due_next_minute", SOON_MS[1]: "due_next_hour"}[window_ms]
        return sum(getattr(q, pick) for q in self.queues)


def _indexes(keys: Keyspace, queues: Any) -> list[tuple[str, int, str]]:
    found = [(DEFAULT_GROUP, 0, keys.due)]
    for member in queues or []:
        group, _, priority = as_text(member).rpartition("|")
        if group and priority.lstrip("-").isdigit():
            found.append((group, int(priority), keys.due_index(group, int(priority))))
    return found


def _paused(states: Any) -> int:
    return sum(1 for _, value in pairs(states) if as_text(value).split("|")[3:4] == ["1"])


def _live(now_ms: int, entries: Any, infos: Any) -> list[dict[str, Any]]:
    # when each beat last: its deadline less the hold
    return [_readable(beat, name, deadline - HEARTBEAT_HOLD_MS)
            for name, beat, deadline in live_heartbeats(now_ms, entries, infos)]


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _readable(beat: dict[str, Any], name: str, beat_ms: float) -> dict[str, Any]:
    """A heartbeat with the fields views read in the types they expect: another app on
    the same Redis (or a bug) may have written anything there."""
    groups = beat.get("groups")
    busiest = beat.get("busiest_tasks")
    return {**beat, "id": str(beat.get("id", name)), "heartbeat_ms": beat_ms,
            "groups": [str(g) for g in groups] if isinstance(groups, list) else [],
            "busiest_tasks": [[str(b[0]), int(b[1])] for b in busiest
                              if isinstance(b, list) and len(b) == 2
                              and _number(b[1]) is not None] if isinstance(busiest, list)
            else [],
            **{f: _number(beat.get(f)) for f in ("running", "runs_last_minute",
                                                  "lateness_p50_ms", "lateness_p99_ms")}}


def read_snapshot(keys: Keyspace) -> Operation[FleetSnapshot]:
    """The snapshot of ``keys``'s keyspace: two round trips (the queues, then the figures)."""
    now, queues = yield [Call(command=("TIME",)), Call(command=("SMEMBERS", keys.queues))]
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    indexes = _indexes(keys, queues)
    groups = sorted({g for g, _, _ in indexes})
    counts: list[Call] = []
    for _, _, index in indexes:
        counts += [Call(command=("ZCARD", index)),
                   Call(command=("ZCOUNT", index, "-inf", now_ms - OVERDUE_AFTER_MS)),
                   Call(command=("ZCOUNT", index, f"({now_ms}", now_ms + SOON_MS[0])),
                   Call(command=("ZCOUNT", index, f"({now_ms}", now_ms + SOON_MS[1]))]
    replies = yield [
        *counts, *(Call(command=("ZCARD", keys.running_of(g))) for g in groups),
        Call(command=("HLEN", keys.parked)), Call(command=("ZCARD", keys.failure_index)),
        Call(command=("ZCARD", keys.failures)), Call(command=("HGETALL", keys.stats)),
        Call(command=("ZRANGE", keys.listeners, 0, -1, "WITHSCORES")),
        Call(command=("HGETALL", keys.listener_info)), Call(command=("HLEN", keys.recurrences)),
        Call(command=("HGETALL", keys.recurrence_states)),
    ]
    figures = [QueueFigures(g, p, *(int(x) for x in replies[4 * i:4 * i + 4]))
               for i, (g, p, _) in enumerate(indexes)]
    rest = replies[len(counts):]
    running = {g: int(n) for g, n in zip(groups, rest, strict=False)}
    held, dead, failures, stats, entries, infos, crons, states = rest[len(groups):]
    return FleetSnapshot(
        now_ms, figures, running, int(held), int(dead), int(failures),
        {as_text(k): int(v) for k, v in pairs(stats)}, _live(now_ms, entries, infos),
        int(crons), _paused(states), groups)
