"""Every shard's figures as one: what the views of a sharded prefix show (see
:mod:`timers.ops.sharded`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from timers.model.history import MinuteSlot
from timers.ops.failures import Failure
from timers.ops.flow_views import GroupCounts
from timers.ops.history import merge_slots
from timers.ops.listings import Stats
from timers.ops.pending import PendingTimer

if TYPE_CHECKING:  # (the dashboard's and top's reads: loaded by merge_snapshots)
    from timers.ops.snapshot import FleetSnapshot


def _summed(dicts: Sequence[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for one in dicts:
        for name, value in one.items():
            out[name] += value
    return dict(out)


def merge_stats(parts: Sequence[Stats]) -> Stats:
    """The stats of every shard as one."""
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for part in parts:
        for name, counts in part.groups.items():
            total = groups[name]
            total[0] += counts.pending
            total[1] += counts.waiting
            total[2] += counts.running
    return Stats(sum(p.pending for p in parts), sum(p.running for p in parts),
                 sum(p.failed for p in parts), _summed([p.counters for p in parts]),
                 {g: GroupCounts(*c) for g, c in sorted(groups.items())},
                 _summed([p.waiting_keys for p in parts]),
                 _summed([p.waiting_rates for p in parts]),
                 sum(p.next_in_line for p in parts))


def unique_listeners(parts: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each listener once: a listener heartbeats in every shard, the same JSON."""
    seen: dict[str, dict[str, Any]] = {}
    for part in parts:
        for info in part:
            seen.setdefault(str(info.get("id")), info)
    return list(seen.values())


def merge_snapshots(parts: Sequence[FleetSnapshot]) -> FleetSnapshot:
    """The snapshots of every shard as one (the Redis clock of the latest read)."""
    from timers.ops.snapshot import FleetSnapshot, QueueFigures

    queues: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for part in parts:
        for q in part.queues:
            total = queues[(q.group, q.priority)]
            for i, value in enumerate((q.pending, q.overdue, q.due_next_minute,
                                       q.due_next_hour)):
                total[i] += value
    return FleetSnapshot(
        max(p.redis_ms for p in parts),
        [QueueFigures(g, p, *figures) for (g, p), figures in sorted(queues.items())],
        _summed([p.running for p in parts]), sum(p.held_back for p in parts),
        sum(p.dead for p in parts), sum(p.failures for p in parts),
        _summed([p.counters for p in parts]), unique_listeners([p.listeners for p in parts]),
        sum(p.recurrences for p in parts), sum(p.recurrences_paused for p in parts),
        sorted({g for p in parts for g in p.groups}))


def same_minutes(parts: Sequence[list[MinuteSlot]]) -> list[MinuteSlot]:
    """Shards' slots merged minute by minute (a shard read a minute later than another
    has its window shifted by one: aligned on the latest minute)."""
    last = max(part[-1].minute for part in parts)
    count = len(parts[0])
    wanted = range(last - count + 1, last + 1)
    aligned = []
    for part in parts:
        by_minute = {slot.minute: slot for slot in part}
        aligned.append([by_minute.get(m, MinuteSlot(m)) for m in wanted])
    return merge_slots(aligned)


def soonest(parts: Iterable[list[PendingTimer]]) -> list[PendingTimer]:
    """Shards' pending timers as one list, soonest first."""
    return sorted((t for part in parts for t in part), key=lambda t: t.due)


def latest(parts: Iterable[list[Failure]]) -> list[Failure]:
    """Shards' failure records as one list, most recent first."""
    return sorted((f for part in parts for f in part), key=lambda f: f.at, reverse=True)
