"""The typed rows some Lua scripts of ``timers/store/lua`` take, one per timer, run or move
in the repeated part of their ARGV (each script's header documents its fields), as
:class:`timers.store.script_calls.ScriptCalls` spreads them into a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from timers.model.keys import DEFAULT_GROUP


class NewTimer(NamedTuple):
    """One timer for ``schedule.lua`` (see its header for ``mode`` and ``how``)."""

    escaped_id: str
    record: str
    mode: str
    ms: int
    how: str


class GateRun(NamedTuple):
    """One claimed run for ``gate.lua``: its concurrency key ("" for none) with its limit,
    and its rate limit's name ("" for none) with the interval and burst."""

    token: str
    key: str = ""
    limit: int = 1
    rate: str = ""
    interval_ms: int = 1
    burst: int = 1


class ParkTimer(NamedTuple):
    """A due timer for ``park.lua``: its escaped id, the record read, its concurrency key
    and the key's limit."""

    id: str
    record: str
    key: str
    limit: int


class Arrival(NamedTuple):
    """A claimed run moving into another shard (``arrive.lua`` "a"): the arrival's name
    ``<from shard>|<run token>``, its due ms, escaped id and the record to pend there."""

    name: str
    due_ms: int
    escaped_id: str
    record: str


class Settle(NamedTuple):
    """How ``arrive.lua`` "c" settles an arrival: ``verdict`` "c" (pend it), "d" (drop it)
    or "x" (not yet: its deadline moves on); ``escaped_id`` and ``record`` name the keys
    pending it touches (they are declared)."""

    name: str
    verdict: str
    escaped_id: str
    record: str


class Departure(NamedTuple):
    """A claimed run leaving for the shard of its limit (``depart.lua`` "d")."""

    token: str
    group: str
    to: int


class Taker(NamedTuple):
    """Who ``finish.lua`` may hand a timer to when a run frees its concurrency key's slot:
    the finishing listener, up to ``take`` runs (its free slots) of the groups it serves."""

    listener_id: str = ""
    groups: tuple[str, ...] = (DEFAULT_GROUP,)
    take: int = 0
    lease_ms: int = 0
    follow: bool = False
    """Whether it also takes runs next in line (``finish.lua``'s ARGV[8])."""


NO_TAKER = Taker()
"""Hand nothing over."""

Ending = Sequence[str]
"""One ending for ``finish.lua``: ``(token, kind, a, b)``, or with its history record
``(token, kind, a, b, escaped id, record)`` kept the listener's age, or
``(token, kind, a, b, escaped id, record, age ms)`` kept its task's (see its header)."""
