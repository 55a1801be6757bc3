"""What the admin reads (``get``, ``list``, ``stats``) see of flow control: a timer's group,
priority and key, and whether it waits for a concurrency key, a rate limit or releases
that disagree on its task's group.

A pending timer is in the due index its record names (``;g=``, ``;p=``), or, held back by
a gate, in a key's or rate limit's queue with a ``P|parked`` entry (``timers/store/lua/flow.lua``).
One left unmoved on a group disagreement is in its due index, its record marked ``;gx=``
(:mod:`timers.model.flow.disagreement`).
These are admin reads: they may read the whole ``P|parked`` hash or scan the records
(``list --key``); nothing on a hot path calls them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Record, as_text
from timers.model.flow.disagreement import Disagreement
from timers.model.flow.names import DEFAULT_GROUP, escape_key, unescape_key
from timers.model.keys import Keyspace
from timers.model.run_record import record_option
from timers.model.wire import FLOW_DUE_SPAN, Option
from timers.ops.base import Call, Operation, ms_to_datetime, pairs

SCAN_COUNT = 1000
"""Records per HSCAN round trip of ``list --key``."""
_PARKED = re.compile(r"([cCrR])\|(\d+)\|(\d+)\|(\d+)\|(.+)", re.S)


def utc_text(when: datetime) -> str:
    """``2026-11-23 10:00:00.123 UTC``."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


@dataclass(frozen=True)
class WaitState:
    """Why a timer is held back: a concurrency key (``kind`` "key"), a rate limit ("rate"),
    or releases that disagree on its task's group ("group": ``name`` is the group it waits
    in). ``waiting``: in the queue (or unmoved); else promoted (due again, its slot kept)."""

    kind: str
    name: str
    waiting: bool
    limit: int = 0
    """A key's slots."""
    running: int = 0
    """A key's slots held now (live leases)."""
    ahead: int = 0
    """Timers before it in its queue."""
    at: datetime | None = None
    """A promoted rate-limited timer's slot time; when a listener looks again at a timer
    that waits on a group disagreement."""
    disagreement: Disagreement | None = None
    """What the releases disagree on ("group")."""

    def describe(self) -> str:
        """One line, e.g. ``waiting for key device:7 (1/1 running)``."""
        if self.disagreement is not None:
            again = f" (looked at again {utc_text(self.at)})" if self.at is not None else ""
            return f"waiting: {self.disagreement.describe()}{again}"
        ahead = f", {self.ahead} ahead" if self.ahead else ""
        if self.kind == "key":
            held = f"({self.running}/{self.limit} running)"
            if self.waiting:
                return f"waiting for key {self.name} {held}{ahead}"
            return f"due again, a slot of key {self.name} kept for it {held}"
        if self.waiting or self.at is None:
            return f"waiting for rate limit {self.name}{ahead or ', 0 ahead'}"
        return f"rate-limited until {utc_text(self.at)}"


@dataclass(frozen=True)
class Parked:
    state: str
    a: int
    b: int
    c: int
    name: str

    @classmethod
    def read(cls, value: Any) -> Parked | None:
        match = _PARKED.fullmatch(as_text(value)) if value is not None else None
        if match is None:
            return None
        state, a, b, c, name = match.groups()
        return cls(state, int(a), int(b), int(c), name)

    @property
    def is_key(self) -> bool:
        return self.state in "cC"

    @property
    def waiting(self) -> bool:
        return self.state in "cr"

    def queue(self, keys: Keyspace) -> str:
        return keys.key_queue(self.name) if self.is_key else keys.rate_queue(self.name)


@dataclass(frozen=True)
class Found:
    """A pending timer as stored: escaped id, record, due time in ms, and its wait state."""

    escaped: str
    record: Record
    due_ms: float
    wait: WaitState | None = None


@dataclass(frozen=True)
class GroupCounts:
    pending: int = 0
    """Pending timers of the group, waiting ones included."""
    waiting: int = 0
    running: int = 0


@dataclass(frozen=True)
class FlowCounts:
    groups: dict[str, GroupCounts] = field(default_factory=dict)
    waiting_keys: dict[str, int] = field(default_factory=dict)
    waiting_rates: dict[str, int] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        return sum(g.pending for g in self.groups.values())

    @property
    def running(self) -> int:
        return sum(g.running for g in self.groups.values())


def group_of(record: Record) -> str:
    return record.options.get(Option.GROUP) or DEFAULT_GROUP


def priority_of(record: Record) -> int:
    try:
        return int(record.options.get(Option.PRIORITY, "0"))
    except ValueError:
        return 0


def key_of(record: Record) -> str | None:
    escaped = record.options.get(Option.KEY)
    return None if escaped is None else unescape_key(escaped)


def read_record(value: Any) -> Record | None:
    """A timer's stored record, None for none or one that does not read."""
    try:
        return None if value is None else Record.decode(as_text(value))
    except MalformedTimerKey:
        return None


def _wait_calls(keys: Keyspace, parked: Parked, escaped: str, now_ms: int) -> list[Call]:
    queue = parked.queue(keys)
    calls = [Call(command=("ZSCORE", queue, escaped)), Call(command=("ZRANK", queue, escaped))]
    if parked.is_key:
        calls.append(Call(command=("ZCOUNT", keys.slots(parked.name), f"({now_ms}", "+inf")))
    return calls


def _wait_state(parked: Parked, replies: list[Any]) -> WaitState:
    rank = int(replies[1]) if replies[1] is not None else 0
    if parked.is_key:
        return WaitState("key", parked.name, parked.waiting, limit=parked.a,
                         running=int(replies[2]), ahead=rank if parked.waiting else 0)
    return WaitState("rate", parked.name, parked.waiting, ahead=rank if parked.waiting else 0,
                     at=None if parked.waiting else ms_to_datetime(parked.c))


def find_many(keys: Keyspace, escaped_ids: Iterable[str]) -> Operation[list[Found]]:
    """The timers of these ids that are pending (in a due index or a flow queue), in
    the order given. Two round trips however many."""
    ids = list(dict.fromkeys(escaped_ids))
    if not ids:
        return []
    now, records, parked_values = yield [
        Call(command=("TIME",)),
        Call(command=("HMGET", keys.records, *ids)),
        Call(command=("HMGET", keys.parked, *ids)),
    ]
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    plans: list[tuple[str, Record, Parked | None, int]] = []
    calls: list[Call] = []
    for escaped, value, parked_value in zip(ids, records, parked_values, strict=True):
        record = read_record(value)
        if record is None:
            continue
        parked = Parked.read(parked_value)
        plans.append((escaped, record, parked, len(calls)))
        calls.append(Call(command=("ZSCORE", keys.due_index(group_of(record),
                                                            priority_of(record)), escaped)))
        if parked is not None:
            calls += _wait_calls(keys, parked, escaped, now_ms)
    replies = (yield calls) if calls else []
    out = []
    for escaped, record, parked, at in plans:
        due, wait = replies[at], None
        disagreement = Disagreement.of(record)
        if parked is None and disagreement is not None and due is not None:
            wait = WaitState("group", disagreement.served, True, at=ms_to_datetime(float(due)),
                             disagreement=disagreement)
        if parked is not None:
            wait = _wait_state(parked, replies[at + 1:at + 4])
            if due is None and replies[at + 1] is not None:
                due = float(replies[at + 1]) - (1000 - priority_of(record)) * FLOW_DUE_SPAN
        if due is not None:
            out.append(Found(escaped, record, float(due), wait))
    return out


def due_indexes(keys: Keyspace, queues: Iterable[Any], group: str | None) -> list[str]:
    """The due index of every (group, priority) in ``P|queues``, and the plain one."""
    out = [keys.due] if group in (None, DEFAULT_GROUP) else []
    for member in queues:
        name, _, priority = as_text(member).rpartition("|")
        if group in (None, name) and priority.lstrip("-").isdigit():
            out.append(keys.due_index(name, int(priority)))
    return list(dict.fromkeys(out))


def parked_entries(reply: Any) -> dict[str, Parked]:
    out = {}
    for escaped, value in pairs(reply):
        parked = Parked.read(value)
        if parked is not None:
            out[as_text(escaped)] = parked
    return out


def find_pending(keys: Keyspace, limit: int, group: str | None = None) -> Operation[list[Found]]:
    """Pending timers of every group (or of ``group``), waiting ones too, soonest first:
    the first ``limit`` of each due index and each flow queue, merged."""
    queues, parked_reply = yield [
        Call(command=("SMEMBERS", keys.queues)),
        # An admin read: the whole parked hash, to name every queue that has waiting timers.
        Call(command=("HGETALL", keys.parked)),
    ]
    sources = due_indexes(keys, queues, group)
    sources += sorted({p.queue(keys) for p in parked_entries(parked_reply).values()
                       if p.waiting})
    heads = yield [Call(command=("ZRANGE", source, 0, limit - 1)) for source in sources]
    found = yield from find_many(keys, (as_text(i) for head in heads for i in head))
    chosen = [f for f in found if group in (None, group_of(f.record))]
    return sorted(chosen, key=lambda f: f.due_ms)[:limit]


def find_by_key(keys: Keyspace, key: str, limit: int) -> Operation[list[Found]]:
    """Timers waiting for concurrency key ``key`` (in queue order), then the pending ones
    that name it (soonest first). Scans every record: an admin read, O(pending)."""
    queue, holders = yield [
        Call(command=("ZRANGE", keys.key_queue(key), 0, limit - 1)),
        Call(command=("ZRANGE", keys.slots(key), 0, -1)),
    ]
    escaped_key = escape_key(key)
    named = [as_text(h)[2:] for h in holders if as_text(h).startswith("w:")]
    cursor: Any = 0
    while True:
        (reply,) = yield [Call(command=("HSCAN", keys.records, cursor, "COUNT", SCAN_COUNT))]
        cursor, entries = reply[0], reply[1]
        named += [as_text(i) for i, record in pairs(entries)
                  if record_option(as_text(record), Option.KEY) == escaped_key]
        if int(cursor) == 0:
            break
    waiting = [as_text(i) for i in queue]
    found = yield from find_many(keys, waiting + named)
    first = [f for f in found if f.escaped in waiting]
    rest = sorted((f for f in found if f.escaped not in waiting), key=lambda f: f.due_ms)
    return (first + rest)[:limit]


def flow_counts(keys: Keyspace, listener_groups: Iterable[str] = ()) -> Operation[FlowCounts]:
    """Pending (waiting included), waiting and running per group; waiting per key and
    rate limit. Reads the whole parked hash: an admin read."""
    queues, parked_reply = yield [Call(command=("SMEMBERS", keys.queues)),
                                  Call(command=("HGETALL", keys.parked))]
    indexes = [(DEFAULT_GROUP, keys.due)]
    for member in queues:
        name, _, priority = as_text(member).rpartition("|")
        if priority.lstrip("-").isdigit():
            indexes.append((name, keys.due_index(name, int(priority))))
    parked = {i: p for i, p in parked_entries(parked_reply).items() if p.waiting}
    groups = sorted({DEFAULT_GROUP, *listener_groups, *(g for g, _ in indexes)})
    replies = yield [*(Call(command=("ZCARD", index)) for _, index in indexes),
                     *(Call(command=("ZCARD", keys.running_of(g))) for g in groups),
                     Call(command=("HMGET", keys.records, *parked) if parked else ("PING",))]
    pending = dict.fromkeys(groups, 0)
    for (group, _), size in zip(indexes, replies, strict=False):
        pending[group] = pending.get(group, 0) + int(size)
    running = dict(zip(groups, (int(r) for r in replies[len(indexes):]), strict=False))
    waiting: dict[str, int] = {}
    by_key: dict[str, int] = {}
    by_rate: dict[str, int] = {}
    for p, value in zip(parked.values(), replies[-1] if parked else [], strict=True):
        record = read_record(value)
        group = group_of(record) if record is not None else DEFAULT_GROUP
        waiting[group] = waiting.get(group, 0) + 1
        pending[group] = pending.get(group, 0) + 1
        counts = by_key if p.is_key else by_rate
        counts[p.name] = counts.get(p.name, 0) + 1
    return FlowCounts(
        {g: GroupCounts(pending[g], waiting.get(g, 0), running.get(g, 0)) for g in pending},
        by_key, by_rate)
