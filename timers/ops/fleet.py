"""Which live listener of a prefix can run which task: the listeners' task announcements.

Two apps that share a prefix (or a listener that imported an unrelated ``tasks`` package)
claim each other's timers. So every listener announces the task paths it can run: its
heartbeat JSON names a digest of them (``task_set``), and the list itself is written once
per digest into ``P|tasks`` (:mod:`timers.model.keys`; ``timers/store/lua/heartbeat.lua``), so a
heartbeat every few seconds costs a few bytes more, not the list.

A listener that claims a timer whose task it lacks reads the :class:`FleetView`: when a
live listener that serves the timer's group has the task, it hands the timer back (due a
little later each time, :func:`hand_over_delay_ms`, uncounted as an attempt) instead of
recording it as refused; when none has it, the refusal names the listeners and packages
it saw. ``timers failed retry`` and ``timers move`` read the same view.

The view is read in one round trip (:func:`read_fleet`) and the maths is pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from timers.model.encoding import Record, as_text
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.wire import Option
from timers.ops.base import Call, Operation, live_heartbeats, pairs

HAND_OVER_FIRST_MS = 100
"""How long a timer handed back for another listener waits the first time (ms)."""
HAND_OVER_MAX_MS = 5_000
"""The longest it waits between hand-backs (ms): a listener lacking the task claims one
such timer at most this often, however long the listener that has it takes."""
GIVE_WAY_MS = 50
"""How long after the due time it gave a timer it handed back a listener sweeps, when that
is the next due time: the listener that has the task claims it first, instead of racing
one whose claims cost nothing to hand back. Per due time, not per listener: two apps on
one prefix each give way on the other's timers only."""


def task_set_digest(tasks: Iterable[str]) -> str:
    """The digest that names a set of task paths (16 hex digits)."""
    return hashlib.sha256(encode_task_set(tasks).encode()).hexdigest()[:16]


def encode_task_set(tasks: Iterable[str]) -> str:
    """Task paths as ``P|tasks`` stores them: sorted, one a line."""
    return "\n".join(sorted(set(tasks)))


def decode_task_set(text: str) -> frozenset[str]:
    """The task paths of a stored task set."""
    return frozenset(line for line in text.split("\n") if line)


def handed_over(record: Record) -> int:
    """How many times listeners handed this timer back for another listener."""
    value = record.options.get(Option.HANDED_OVER, "0")
    return int(value) if value.isascii() and value.isdigit() else 0


def hand_over_delay_ms(times: int) -> int:
    """How long a timer handed back for the ``times``-th time waits before it is due again:
    doubling from :data:`HAND_OVER_FIRST_MS` up to :data:`HAND_OVER_MAX_MS`. A listener that
    has the task claims it then (or a listener that lacks it hands it back again, later)."""
    return min(HAND_OVER_MAX_MS, HAND_OVER_FIRST_MS << min(max(times - 1, 0), 16))


def handed_back(record: Record, waited_from_ms: int) -> str:
    """The record of a timer handed back for another listener: its hand-backs counted, its
    lateness still counting from ``waited_from_ms`` (its own due time)."""
    options = dict(record.options)
    options[Option.HANDED_OVER] = str(handed_over(record) + 1)
    options.setdefault(Option.WAITED_FROM, str(waited_from_ms))
    return Record(record.task, record.args, options).encode(max_args_bytes=1 << 62)


@dataclass(frozen=True)
class Peer:
    """A live listener as its heartbeat describes it."""

    id: str
    package: str
    groups: tuple[str, ...]
    tasks: frozenset[str] | None
    """The task paths it announced; None: its heartbeat names no set, or its set is not
    stored."""

    def serves(self, group: str) -> bool:
        return group in self.groups

    def runs(self, task: str, group: str) -> bool:
        """Whether it can run a timer of ``task`` in ``group``."""
        return self.tasks is not None and task in self.tasks and self.serves(group)

    def describe(self) -> str:
        """``host:pid:x (package 'tasks', groups default)``."""
        return f"{self.id} (package {self.package!r}, groups {', '.join(self.groups)})"


@dataclass(frozen=True)
class FleetView:
    """The live listeners of a prefix and what each can run."""

    peers: tuple[Peer, ...] = ()

    def runners(self, task: str, group: str = DEFAULT_GROUP,
                exclude: str | None = None) -> list[Peer]:
        """The live listeners (but ``exclude``) that can run ``task`` in ``group``."""
        return [p for p in self.peers if p.id != exclude and p.runs(task, group)]

    def unknown(self, exclude: str | None = None) -> list[Peer]:
        """Live listeners (but ``exclude``) whose tasks are not known."""
        return [p for p in self.peers if p.id != exclude and p.tasks is None]

    def may_run(self, task: str, group: str = DEFAULT_GROUP) -> bool:
        """Whether some live listener can run ``task`` in ``group``, or might (one serving
        the group did not say what it runs); True when no listener is live (one that starts
        later may)."""
        if not self.peers:
            return True
        return any(p.runs(task, group) or (p.tasks is None and p.serves(group))
                   for p in self.peers)

    def may_run_anywhere(self, task: str) -> bool:
        """Whether some live listener can run ``task`` in a group it serves, or might (it did
        not say what it runs); True when no listener is live (one that starts later may)."""
        return not self.peers or any(p.tasks is None or task in p.tasks for p in self.peers)

    def describe(self, exclude: str | None = None, limit: int = 5) -> str:
        """The listeners seen (but ``exclude``), for a refusal: ``other live listeners:
        a (package …, groups …); …``."""
        others = [p for p in self.peers if p.id != exclude]
        other = "other " if exclude is not None else ""
        if not others:
            return f"no {other}live listener of the prefix"
        shown = "; ".join(p.describe() for p in others[:limit])
        more = f"; and {len(others) - limit} more" if len(others) > limit else ""
        return f"{other}live listeners: {shown}{more}"


def _peer(name: str, beat: Mapping[str, Any], sets: Mapping[str, frozenset[str]]) -> Peer:
    groups = beat.get("groups")
    digest = beat.get("task_set")
    return Peer(
        id=str(beat.get("id", name)),
        package=str(beat.get("tasks", "?")),
        groups=tuple(g for g in groups if isinstance(g, str))
        if isinstance(groups, list) else (DEFAULT_GROUP,),
        tasks=sets.get(digest) if isinstance(digest, str) else None)


def fleet_of(now_ms: int, entries: Any, infos: Any, sets: Any) -> FleetView:
    """The view from raw replies: ``ZRANGE P|listeners 0 -1 WITHSCORES``, ``HGETALL
    P|listener`` and ``HGETALL P|tasks`` (RESP2 lists or RESP3 maps)."""
    stored = {as_text(k): decode_task_set(as_text(v)) for k, v in pairs(sets)}
    peers = [_peer(name, beat, stored) for name, beat, _ in live_heartbeats(now_ms, entries, infos)]
    return FleetView(tuple(peers))


def fleet_calls(keys: Keyspace) -> list[Call]:
    """The one round trip that reads the view."""
    return [Call(command=("TIME",)),
            Call(command=("ZRANGE", keys.listeners, 0, -1, "WITHSCORES")),
            Call(command=("HGETALL", keys.listener_info)),
            Call(command=("HGETALL", keys.task_sets))]


def fleet_from(replies: list[Any]) -> FleetView:
    """The view from the replies to :func:`fleet_calls`."""
    now, entries, infos, sets = replies
    return fleet_of(int(now[0]) * 1000 + int(now[1]) // 1000, entries, infos, sets)


def read_fleet(keys: Keyspace) -> Operation[FleetView]:
    """The live listeners of ``keys``' prefix and what each can run (one round trip)."""
    replies = yield fleet_calls(keys)
    return fleet_from(replies)
