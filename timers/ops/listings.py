"""The listing reads of :class:`timers.ops.operations.Operations`: the pending timers
(``list``), the counts (``stats``, :class:`Stats`) and the live listeners."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.ops import flow_views as views
from timers.ops.base import Call, Operation, live_heartbeats, pairs
from timers.ops.flow_views import GroupCounts
from timers.ops.pending import PendingTimer, pending_of


@dataclass(frozen=True)
class Stats:
    """The counts ``stats`` reads: pending, running and failed timers, the counters, and
    per group, concurrency key and rate limit what waits."""

    pending: int
    running: int
    failed: int
    counters: dict[str, int] = field(default_factory=dict)
    groups: dict[str, GroupCounts] = field(default_factory=dict)
    """Per group: pending (waiting included), waiting, running."""
    waiting_keys: dict[str, int] = field(default_factory=dict)
    """Timers waiting for each concurrency key."""
    waiting_rates: dict[str, int] = field(default_factory=dict)
    """Timers waiting for each rate limit."""
    next_in_line: int = 0
    """Of ``running``: runs next in line on a concurrency key slot, handed to a listener
    with the run before them and not started yet (they start as that one ends)."""

    @property
    def fired(self) -> int:
        """The ``fired`` counter: runs that ended well."""
        return self.counters.get("fired", 0)


class ListingOperations:
    """The listings of one keyspace, as sans-I/O operations (a mixin of
    :class:`timers.ops.operations.Operations`)."""

    keys: Keyspace

    def list_pending(
        self, limit: int = 100, group: str | None = None, key: str | None = None
    ) -> Operation[list[PendingTimer]]:
        """Pending timers of every group (or of ``group``), waiting ones too, soonest
        first; with ``key``: those waiting for that concurrency key, in queue order, then
        the pending ones that name it."""
        if limit <= 0:
            return []
        if key is not None:
            found = yield from views.find_by_key(self.keys, key, limit)
        else:
            found = yield from views.find_pending(self.keys, limit, group)
        out = []
        for item in found:
            try:
                out.append(pending_of(item))
            except MalformedTimerKey:
                continue
        return out

    def stats(self) -> Operation[Stats]:
        """Counts; ``pending`` and ``running`` over every group, waiting timers included."""
        failed, counters, infos, following = yield [
            Call(command=("ZCARD", self.keys.failures)),
            Call(command=("HGETALL", self.keys.stats)),
            Call(command=("HGETALL", self.keys.listener_info)),
            Call(command=("HLEN", self.keys.next_in_line)),
        ]
        flow = yield from views.flow_counts(self.keys, listener_groups(infos))
        return Stats(
            flow.pending,
            flow.running,
            int(failed),
            {as_text(k): int(v) for k, v in pairs(counters)},
            flow.groups, flow.waiting_keys, flow.waiting_rates, int(following),
        )

    def listeners(self) -> Operation[list[dict[str, Any]]]:
        """The live listeners, from their heartbeats."""
        now, entries, infos = yield [
            Call(command=("TIME",)),
            Call(command=("ZRANGE", self.keys.listeners, 0, -1, "WITHSCORES")),
            Call(command=("HGETALL", self.keys.listener_info)),
        ]
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        return [beat for _, beat, _ in live_heartbeats(now_ms, entries, infos)]


def listener_groups(infos: Any) -> set[str]:
    """The groups the listeners' heartbeats name (dead ones' too: their runs count)."""
    out: set[str] = set()
    for _, value in pairs(infos):
        try:
            groups = json.loads(as_text(value)).get("groups") or []
        except (ValueError, AttributeError):
            continue
        if isinstance(groups, list):  # another app's junk there must not stop `stats`
            out.update(g for g in groups if isinstance(g, str))
    return out
