"""Shards: the timers of one prefix split over several keyspaces, so a Redis Cluster spreads
them over its primaries.

A prefix of ``S`` shards has ``S`` keyspaces, each its own hash tag: ``{timers#0.k}`` …
``{timers#5.k}`` (see :func:`shard_prefix`). Every key a script touches for one timer
lives in its timer's shard, so every script stays a single-slot script. A timer's shard
comes from its id alone (:func:`shard_of`), so ``cancel``, ``get`` and ``reschedule`` go to
one shard in one round trip; an id ending in ``@<digits>`` (a recurrence's occurrence,
``<name>@<due ms>``) goes to the shard of what precedes it, beside its recurrence's state;
an id with a tag ``…{tag}…`` goes to the shard of the tag.

**Where a limit lives** (design invariant 11: a limit of N is N on any number of shards).
A limit's state (a concurrency key's slots and queue, a rate's GCRA state and queue) is in
one shard, and every timer it holds back must be in that shard too, or each shard would
count its own N. The rule:

1. A timer scheduled with a concurrency key (``key=``) lives in the shard of its key
   (:func:`shard_of_key`). Its id says so: a generated id is drawn until it falls in the
   key's shard (:func:`id_in_shard`), and an id the producer chose must fall there (give
   it the key as a tag, ``f"order-42{{{key}}}"``), so ``get``, ``cancel`` and
   ``reschedule`` still find it from the id alone, in one round trip.
2. A rate is counted in the shard of its timers: a rate shared by many keys (a task's
   ``rate=`` with a ``key=`` per device) would need every such key in one shard. A
   rate-limited task's throughput is its rate, so one shard is enough for it: a timer with
   a rate lives in the shard of the rate's name (:func:`shard_of_key` of it), and so does
   every concurrency key its task's timers carry; the rate wins over the key. A rate is
   the task's declaration, so that placement is rule 3's.
3. A limit the task declares (a key function, ``concurrency=`` per task, ``rate=``): a
   producer that knows the declaration (the task registered by name in its process)
   draws a generated id in the limit's shard (:meth:`TaskPolicy.limit_name`,
   :func:`timers.ops.placement.placed`). Otherwise it is known to listeners only: the
   timer moves to its limit's shard once, at its first claim, before any gate sees it
   (:mod:`timers.listener.flow.placer`: four steps over the two shards, each atomic in one,
   ordered so that a crash anywhere leaves it runnable exactly once), and carries
   ``;sh=<from shard>`` so it never moves again. ``get``, ``cancel``, ``reschedule`` and
   ``status`` look in the other shards when the id's own does not have it
   (:mod:`timers.ops.sharded`). Not moved, so still counted per shard: a recurrence's
   occurrence (it lives beside its recurrence) and a timer given ``key=`` whose task has
   a rate (rule 1 places it).
4. Everything else lives in the shard of its id.
5. A key's timers start in order across shards: a claim takes a keyed task's timer (no
   ``key=``) only once every earlier one of its task in the other shards has entered its
   key's order (the claim's floor, :meth:`timers.listener.flow.placer.Placer.floor`).

``S`` is fixed the first time a prefix is used and stored in Redis (``shards.lua``, in
the one-shard keyspace of the prefix: ``{timers}|shards``). On a cluster the default is
one shard per primary (``CLUSTER INFO``'s ``cluster_size`` when the prefix is first used);
on a single server it is 1 and nothing is stored. Each
client reads the layout once, at its first call. A prefix already in use without a layout
keeps one shard, so an upgrade strands nothing.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from redis.crc import key_slot

from timers.exceptions import BadShardCount, ShardLayoutMismatch
from timers.model.keys import Keyspace
from timers.model.timer_ids import new_timer_id
from timers.ops.base import Call, Operation
from timers.store.cluster import hash_tagged
from timers.store.script_calls import ScriptCalls

SHARDS_ENV = "TIMERS_SHARDS"
SLOTS = 16384
ONE_PER_PRIMARY = "auto"
"""What a cluster asks ``shards.lua`` for by default: a shard per primary serving slots."""
MAX_SHARDS = 1024
_OCCURRENCE = re.compile(r"^(.+)@[0-9]+$", re.DOTALL)


def check_shards(value: object, name: str = "shards") -> int:
    """``value`` as a shard count (1 to 1024), else ValueError naming ``name``."""
    try:
        count = int(str(value))
    except ValueError:
        count = 0
    if isinstance(value, bool) or not 1 <= count <= MAX_SHARDS or str(count) != str(value).strip():
        raise BadShardCount(f"{name} must be a whole number from 1 to {MAX_SHARDS}, "
                            f"got {value!r}")
    return count


def configured_shards(shards: int | None = None) -> int | None:
    """``shards`` if given, else ``$TIMERS_SHARDS``, else None (the prefix's default)."""
    if shards is not None:
        return check_shards(shards)
    value = os.environ.get(SHARDS_ENV)
    return check_shards(value, f"${SHARDS_ENV}") if value else None


def routing_part(timer_id: str) -> str:
    """What of a timer id picks its shard: all of it; for ``<name>@<digits>``, the name;
    and of that, for a name with a tag ``…{tag}…`` (the first ``{`` and the next ``}``,
    with something between), the tag alone, as Redis reads a hash tag: ``order-42{dev-7}``
    goes to the shard of concurrency key ``dev-7``."""
    match = _OCCURRENCE.match(timer_id)
    name = match.group(1) if match else timer_id
    start = name.find("{")
    if start >= 0:
        end = name.find("}", start + 1)
        if end > start + 1:
            return name[start + 1:end]
    return name


def _crc_shard(text: str, count: int) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass")) % count


def shard_of(timer_id: str, count: int) -> int:
    """The shard (0 to ``count`` - 1) of a timer id or recurrence name."""
    if count == 1:
        return 0
    return _crc_shard(routing_part(timer_id), count)


def shard_of_key(key: str, count: int) -> int:
    """The shard of concurrency key ``key``: where its slots, its queue and every timer
    scheduled with it live (the placement rule above)."""
    return 0 if count == 1 else _crc_shard(key, count)


def id_in_shard(shard: int, count: int, new_id: Callable[[], str] = new_timer_id) -> str:
    """A fresh generated id whose shard is ``shard``: ids are drawn until one falls there
    (``count`` draws on average, each the making of an id); they still sort in the order
    they were made (figures: bench/FINDINGS.md, "A schedule's client CPU per timer")."""
    while True:
        timer_id = new_id()
        if shard_of(timer_id, count) == shard:
            return timer_id


def shard_prefix(prefix: str, index: int, count: int) -> str:
    """The key prefix of shard ``index`` of ``count``: ``{timers#3}``, or ``{timers#3.k}``
    with the least ``k`` that puts its hash slot in the ``index``-th of ``count`` equal
    ranges of slots, so the shards spread evenly over primaries that hold equal ranges
    (12 shards: 4 each on 3 primaries, 3 each on 4, 2 each on 6). A prefix with a hash
    tag of its own keeps it: all its shards then share that tag's slot."""
    plain = hash_tagged(f"{prefix}#{index}")
    if not plain.startswith("{"):
        return plain
    low, high = index * SLOTS // count, (index + 1) * SLOTS // count
    for k in range(64 * count):
        tagged = "{" + f"{prefix}#{index}.{k}" + "}"
        if low <= key_slot(tagged.encode("utf-8", "surrogatepass")) < high:
            return tagged
    return plain


@dataclass(frozen=True)
class ShardLayout:
    """The keyspaces of a prefix's shards."""

    home: Keyspace
    """The one-shard keyspace of the prefix (``{timers}`` on a cluster): where the layout
    is stored, and the only shard when there is one."""
    count: int
    prefix: str
    """The prefix as configured, without a hash tag added."""

    @cached_property
    def keyspaces(self) -> tuple[Keyspace, ...]:
        if self.count == 1:
            return (self.home,)
        return tuple(Keyspace(shard_prefix(self.prefix, i, self.count))
                     for i in range(self.count))


def resolve_layout(home: Keyspace, prefix: str, asked: int | None, reply: Any) -> ShardLayout:
    """The layout from ``shards.lua``'s reply; ShardLayoutMismatch if ``asked`` differs."""
    count = int(reply)
    if asked is not None and asked != count:
        raise ShardLayoutMismatch(
            f"prefix {prefix!r} is split into {count} shard(s) on this server (fixed when "
            f"it was first used); shards={asked} (or ${SHARDS_ENV}) asks for another layout")
    return ShardLayout(home, count, prefix)


def wanted_count(cluster: bool, asked: int | None) -> tuple[int | str, bool]:
    """(the count to store if none is, whether to store it): a cluster stores one per
    primary, a single server stores only a count asked for."""
    if asked is not None:
        return asked, True
    return (ONE_PER_PRIMARY, True) if cluster else (1, False)


def read_layout(home: Keyspace, prefix: str, cluster: bool,
                asked: int | None) -> Operation[ShardLayout]:
    """The prefix's layout, fixing it if this is its first use (one round trip)."""
    wanted, store = wanted_count(cluster, asked)
    (reply,) = yield [Call.of(ScriptCalls(home).shards(wanted, store))]
    return resolve_layout(home, prefix, asked, reply)
