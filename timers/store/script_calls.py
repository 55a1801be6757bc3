"""What each Lua script of ``timers/store/lua`` is sent: :class:`ScriptCalls`, the one place
that spells each script's KEYS and ARGV order (the order its header documents). The typed
rows some of them take are :mod:`timers.store.script_rows`.

The states of a timer and of a key's slot, every transition and the one script that makes
it, and the invariants they keep are written down in ``docs/state-machine.md``;
``tests/unit/test_model_flow.py`` checks those invariants against these scripts.

Each script starts with a Redis 7 shebang: ``#!lua flags=allow-oom`` on those that free
memory or keep it constant (renew, finish, cancel …), so they run on a full server, and a
plain ``#!lua`` on those that need memory (claim, schedule …), so a full server refuses
them before their first write instead of part-way. Their source, linked with the shared
helpers each uses, is :mod:`timers.store.lua_source`; which helpers and which shared keys
each is given, :mod:`timers.store.script_manifest`; how they run on a client (function,
EVALSHA, declaring) is :mod:`timers.store.script_modes`; running a call,
:mod:`timers.store.scripts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from timers.model.fast_init import fast_init
from timers.model.history import DEFAULT_HISTORY_AGE, DEFAULT_HISTORY_COUNT
from timers.model.keys import DEFAULT_GROUP, SCRIPT_KEY_NAMES, Keyspace
from timers.store.script_manifest import ScriptName, schedule_key_names, shared_key_names
from timers.store.script_rows import (
    NO_TAKER,
    Arrival,
    Departure,
    Ending,
    GateRun,
    NewTimer,
    ParkTimer,
    Settle,
    Taker,
)

# -- what each script is sent ------------------------------------------------------------


def _flow_options(record: str) -> bool:
    """Whether a timer's record carries a group or a priority (its schedule may touch the
    flow keys)."""
    return ";g=" in record or ";p=" in record


@fast_init  # made once or more per schedule
@dataclass(frozen=True)
class Invocation:
    """One script call: which script, its KEYS and its ARGV."""

    script: ScriptName
    keys: tuple[str, ...]
    args: tuple[Any, ...]


DEFAULT_RETENTION = (round(DEFAULT_HISTORY_AGE * 1000), DEFAULT_HISTORY_COUNT)
"""The history's (age ms, count) when no listener stored its own (``P|histcfg``)."""


class ScriptCalls:
    """Builds each script's :class:`Invocation` for one keyspace, in its header's order."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys
        self._schedule_fixed: tuple[str, str, str, str] | None = None
        self._schedule_keys: dict[tuple[bool, bool], tuple[str, ...]] = {}

    def _shared(self, script: ScriptName, keys: Sequence[str], args: Sequence[Any],
                *also: Keyspace) -> Invocation:
        """A script that uses the shared helpers: its KEYS, then the shared keys its code
        names (:func:`shared_key_names`, of :attr:`Keyspace.script_keys`) of this keyspace
        and of ``also``."""
        wanted = shared_key_names(script)
        shared = [key for k in (self.keys, *also)
                  for name, key in zip(SCRIPT_KEY_NAMES, k.script_keys, strict=True)
                  if name in wanted]
        return Invocation(script, (*keys, *shared), tuple(args))

    def _occurrence_key(self, name_field: str, due_ms: int, record: str) -> str:
        return self.keys.timer_key(f"{name_field}@{due_ms}:{record}")

    def _fixed(self) -> tuple[str, str, str, str]:
        """The due index, the records, the timer keys' start and the wake channel."""
        fixed = self._schedule_fixed
        if fixed is None:
            k = self.keys
            fixed = self._schedule_fixed = (k.due, k.records, k.timer_key_start,
                                            k.wake_channel)
        return fixed

    def schedule(self, timers: Sequence[NewTimer]) -> Invocation:
        """The call adding ``timers``: its shared keys are those its timers may touch
        (:func:`schedule_key_names`)."""
        due, records, start, wake = self._fixed()
        keys = [due, records]
        args: list[Any] = [start, wake]
        replace = flow = False
        for t in timers:
            keys.append(f"{start}{t.escaped_id}:{t.record}")
            args += t
            replace = replace or t.how == "r"
            flow = flow or _flow_options(t.record)
        keys += self._schedule_shared(replace, flow)
        return Invocation("schedule", tuple(keys), tuple(args))

    def schedule_one(self, escaped_id: str, record: str, mode: str, ms: int,
                     how: str) -> Invocation:
        """:meth:`schedule` of the one timer ``NewTimer(escaped_id, record, mode, ms, how)``,
        the same call, made without the row and the loop (a lone schedule's)."""
        due, records, start, wake = self._fixed()
        shared = self._schedule_shared(how == "r", _flow_options(record))
        return Invocation("schedule", (due, records, f"{start}{escaped_id}:{record}", *shared),
                          (start, wake, escaped_id, record, mode, ms, how))

    def _schedule_shared(self, replace: bool, flow: bool) -> tuple[str, ...]:
        shared = self._schedule_keys.get((replace, flow))
        if shared is None:
            named = dict(zip(SCRIPT_KEY_NAMES, self.keys.script_keys, strict=True))
            shared = tuple(named[name] for name in schedule_key_names(replace, flow))
            self._schedule_keys[(replace, flow)] = shared
        return shared

    def reschedule(self, escaped_id: str, mode: str, ms: int) -> Invocation:
        """Reply: the new due ms, or nil when the timer is not pending."""
        k = self.keys
        return self._shared("reschedule", (k.due, k.records),
                            (k.timer_key_start, k.wake_channel, escaped_id, mode, ms))

    def cancel(self, escaped_id: str, canceller: str = "",
               retention: tuple[int, int] = DEFAULT_RETENTION) -> Invocation:
        """``canceller``: ``host:pid`` of who cancels; ``retention``: (age ms, count) of
        the history when no listener stored its own."""
        k = self.keys
        return self._shared("cancel", (k.due, k.records, k.history, k.history_records,
                                       k.history_retention, k.history_expiry,
                                       k.history_task_ages, k.history_batches,
                                       k.sequence, k.history_task_counts),
                            (k.timer_key_start, escaped_id, canceller.replace("|", "_"),
                             f"{retention[0]} {retention[1]}", k.wake_channel))

    def claim(self, *, limit: int, lease_ms: int, horizon_ms: int, listener_id: str,
              event_ids: Iterable[str] = (), groups: Sequence[str] = (DEFAULT_GROUP,),
              keyed_tasks: Sequence[str] = (), floor: int | None = None,
              known_keys: Sequence[str] = ()) -> Invocation:
        """Reply: ``[now_us, next_due, next_lease, (token, run, source)…]``.
        ``keyed_tasks``: the tasks with a concurrency key or cap (the order barrier);
        ``floor``: on several shards, the least of the other shards' :meth:`floor`
        (their timers due later wait for it); ``known_keys``: where scripts declare
        their keys, more keys to give it (those the lane's last claims asked for), last."""
        k = self.keys
        call = self._shared(
            "claim", (k.due, k.records, k.running, k.running_records, k.sequence, k.stats,
                      k.arrival_records),
            (k.timer_key_start, limit, lease_ms, horizon_ms, listener_id, ",".join(groups),
             ",".join(keyed_tasks), "" if floor is None else floor, *event_ids))
        if not known_keys:
            return call
        given = set(call.keys)
        return Invocation("claim", (*call.keys, *(key for key in known_keys
                                                  if key not in given)), call.args)

    def renew(self, lease_ms: int, tokens: Iterable[str]) -> Invocation:
        """Reply: the tokens no longer held."""
        k = self.keys
        return self._shared("renew", (k.running, k.running_records),
                            (lease_ms, k.timer_key_start, *tokens))

    def gate(self, lease_ms: int, runs: Iterable[GateRun]) -> Invocation:
        """Reply: one of ``go``, ``wait``, ``lost``, ``replaced`` per run."""
        k = self.keys
        args: list[Any] = [k.timer_key_start, k.wake_channel, lease_ms]
        for run in runs:
            args += [run.token, run.key, run.limit, run.rate, run.interval_ms, run.burst]
        return self._shared("gate", (k.running, k.running_records, k.records, k.stats),
                            tuple(args))

    def peek(self, limit: int, groups: Sequence[str]) -> Invocation:
        """Reply: ``[id, due ms, record, …]``: due timers no flow gate holds yet."""
        k = self.keys
        return self._shared("park", (k.due, k.records, k.stats),
                            (k.timer_key_start, "peek", limit, ",".join(groups)))

    def floor(self, groups: Sequence[str], tasks: Sequence[str]) -> Invocation:
        """Reply: a due ms: every timer of ``tasks`` in this shard due before it has
        entered its limit's order (claimed and gated, or in a flow queue); see
        docs/state-machine.md, Cluster, rule 5."""
        k = self.keys
        return self._shared("park", (k.due, k.records, k.stats,
                                     *(k.ungated("t:" + task) for task in tasks)),
                            (k.timer_key_start, "floor", ",".join(groups), *tasks))

    def park(self, lease_ms: int, timers: Iterable[ParkTimer]) -> Invocation:
        """Reply: how many of ``timers`` went into their key's queue."""
        k = self.keys
        args: list[Any] = [k.timer_key_start, "park", lease_ms, k.wake_channel]
        for timer in timers:
            args.extend(timer)
        return self._shared("park", (k.due, k.records, k.stats), tuple(args))

    def shards(self, wanted: int | str, store: bool) -> Invocation:
        """``self.keys`` is the prefix's one-shard keyspace (see :mod:`timers.ops.shards`)."""
        k = self.keys
        return Invocation("shards", (k.shards, k.due, k.records, k.recurrences, k.failures,
                                     k.queues), (wanted, "1" if store else "0"))

    def near(self, limit: int) -> Invocation:
        """Reply: ``[until, reached, keyed]``: keys written up to ``until`` ms;
        ``reached`` 1 when that is now + the near horizon (else call again); ``keyed``: how
        many keys this call wrote."""
        k = self.keys
        return self._shared("near", (k.due, k.records, k.near), (k.timer_key_start, limit))

    def finish(self, *, retention_ms: int, endings: Iterable[Ending],
               taker: Taker = NO_TAKER, history: tuple[int, int] = DEFAULT_RETENTION,
               series: Sequence[tuple[str, str]] = (), store_retention: bool = True,
               task_retention: Sequence[tuple[str, str, str]] = ()) -> Invocation:
        """``history``: (age ms, count) the history keeps; ``series``: (task, minute slot
        text) to add to the tasks' rings; ``store_retention``: store ``history`` for
        ``cancel.lua`` (the history is trimmed by :meth:`trim`); ``task_retention``: (task,
        its own age ms, its own count; "" for none) to store for ``cancel.lua``. An ending
        is ``(token, kind, a, b)`` or with two or three more values, its escaped id,
        history record and its task's age ms, with ``|<count>`` when its task has a count
        of its own (see ``lua/finish.lua``).

        Reply: ``[late finishes, (token, run, source)…]``: the runs handed over."""
        k = self.keys
        wires: list[Any] = []
        tasks: set[str] = set()  # the tasks whose index the endings add to
        for ending in endings:
            wires.extend(ending)
            if len(ending) == 4:
                wires += ("", "", "")
            else:
                if len(ending) == 6:
                    wires.append("")
                if ending[4]:
                    parts = ending[5].split("|", 7)
                    if len(parts) == 8:
                        tasks.add(parts[6])
        args: list[Any] = [k.timer_key_start, k.wake_channel, retention_ms, taker.listener_id,
                           ",".join(taker.groups), taker.take, taker.lease_ms,
                           "1" if taker.follow else "0", history[0], history[1],
                           "1" if store_retention else "0",
                           len(series)]
        for task, text in series:
            args += [task, text]
        args.append(len(task_retention))
        for task, age, count in task_retention:
            args += [task, age, count]
        args += wires
        return self._shared(
            "finish", (k.running, k.running_records, k.stats, k.failures, k.failure_records,
                       k.due, k.records, k.failure_index, k.sequence, k.history,
                       k.history_records, k.series, k.series_tasks,
                       k.history_retention, k.history_expiry, k.history_task_ages,
                       k.history_batches, k.history_task_counts, k.history_failed,
                       *(k.history_task(task) for task in tasks)),
            tuple(args))

    def trim(self, count: int, budget: int) -> Invocation:
        """One bounded step of the history's upkeep (``lua/trim.lua``): about ``budget``
        records past their expiry, else over ``count``, dropped, else indexed (the tasks'
        indexes it touches it asks for on Redis Cluster).

        Reply: ``[records dropped or indexed, 1 if more is owed, 1 if the history is
        empty]``."""
        k = self.keys
        return self._shared("trim", (k.history, k.history_expiry, k.history_records,
                                     k.history_batches, k.history_failed, k.history_cursor),
                            (count, budget))

    def heartbeat(self, listener_id: str, ttl_ms: int, info: str, task_set: str = "",
                  task_list: str = "") -> Invocation:
        """``info`` "" says the listener is gone. ``task_set``: the digest ``info`` names;
        ``task_list``: its task paths, one a line, to store ("" when stored already).

        Reply: ``[stored, id, …]``: 1 if the task list of ``task_set`` is stored (or none
        is named) else 0, then the ids of the live listeners (``lua/heartbeat.lua``)."""
        k = self.keys
        return Invocation("heartbeat", (k.listeners, k.listener_info, k.task_sets),
                          (listener_id, ttl_ms, info, task_set, task_list))

    def move(self, to: Keyspace, tasks: Sequence[str], dead: bool, index: str, page: int,
             after: tuple[str, str] = ("", "")) -> Invocation:
        """Move the pending timers (or, with ``dead``, dead timers) of ``tasks`` (empty:
        any) among the ``page`` entries of ``index`` (one of this prefix's due indexes, or
        its failure index) after the cursor ``after`` (score, member; empty: from the
        start) from this prefix to ``to``'s (``lua/move.lua``)."""
        k = self.keys
        return self._shared("move", (
            k.due, k.records, k.failures, k.failure_records, k.failure_index,
            to.due, to.records, to.failures, to.failure_records, to.failure_index, index,
        ), (k.timer_key_start, to.timer_key_start, to.wake_channel, ",".join(tasks),
            "d" if dead else "p", page, *after), to)

    def arrive(self, lease_ms: int, arrivals: Iterable[Arrival]) -> Invocation:
        """Write moving timers into this shard, inert until settled (``arrive.lua`` "a").
        Reply: per arrival, 1 written or 0 there already."""
        k = self.keys
        args: list[Any] = ["a", k.timer_key_start, k.wake_channel, lease_ms]
        for arrival in arrivals:
            args.extend(arrival)
        return self._shared("arrive", (k.arrivals, k.arrival_records), tuple(args))

    def settle(self, lease_ms: int, settles: Iterable[Settle]) -> Invocation:
        """Pend, drop or keep waiting arrivals (``arrive.lua`` "c"). Reply: per arrival,
        1 settled (or its deadline moved) or 0 gone already."""
        k = self.keys
        args: list[Any] = ["c", k.timer_key_start, k.wake_channel, lease_ms]
        keys: list[str] = [k.arrivals, k.arrival_records]
        for one in settles:
            args += [one.name, one.verdict]
            keys += [k.due_index_of(one.record), k.timer_key(f"{one.escaped_id}:{one.record}")]
        return self._shared("arrive", tuple(keys), tuple(args))

    def depart(self, departures: Iterable[Departure]) -> Invocation:
        """Let claimed runs leave for their limit's shard (``depart.lua`` "d"). Reply: per
        run, 1 left, 0 not held, 2 holds a slot here (stays)."""
        k = self.keys
        args: list[Any] = ["d", k.timer_key_start]
        keys: list[str] = [k.moves, k.stats]
        for one in departures:
            args += [one.token, one.to]
            keys.append(k.running_of(one.group))
        return self._shared("depart", tuple(keys), tuple(args))

    def departed(self, tokens: Iterable[str], forget: bool = False) -> Invocation:
        """What became of runs that were to leave (``depart.lua`` "q"), or (``forget``)
        forget the notes of those whose arrival is settled ("k"). Reply: per token 1
        left, 2 still held, 0 neither; with ``forget``: a count."""
        k = self.keys
        return self._shared("depart", (k.moves, k.stats),
                            ("k" if forget else "q", k.timer_key_start, *tokens))

    def forget(self, failure_id: str, read_as: str) -> Invocation:
        """Reply: 1 when the failure record was deleted."""
        k = self.keys
        return Invocation("forget", (k.failures, k.failure_records, k.failure_index),
                          (failure_id, read_as))

    def cron_declare(self, *, name_field: str, definition: str, read_state: str,
                     paused: str, version: int, anchor_ms: int, record: str,
                     due_if_withdrawn: int, due_otherwise: int) -> Invocation:
        """Reply: ``[result, version, due]`` (see ``lua/cron_declare.lua``)."""
        k = self.keys
        keys = (k.recurrences, k.recurrence_states, k.due, k.records,
                self._occurrence_key(name_field, due_if_withdrawn, record),
                self._occurrence_key(name_field, due_otherwise, record))
        return self._shared("cron_declare", keys, (
            k.timer_key_start, k.wake_channel, name_field, definition, read_state, paused,
            version, anchor_ms, record, due_if_withdrawn, due_otherwise))

    def cron_next(self, *, name_field: str, version: int, due_ms: int,
                  successor_ms: int | None, record: str, defer: bool, take: str,
                  release: str, group: str = DEFAULT_GROUP) -> Invocation:
        """``group``: the running occurrence's, whose running set leases its runs (where
        the overlap check looks for the previous run's lease). Reply: ``[status,
        holder]``."""
        k = self.keys
        keys = [k.recurrence_states, k.due, k.records, k.running_of(group)]
        if successor_ms is not None:
            keys.append(self._occurrence_key(name_field, successor_ms, record))
        return self._shared("cron_next", tuple(keys), (
            k.timer_key_start, k.wake_channel, name_field, version, due_ms,
            -1 if successor_ms is None else successor_ms, record, int(defer), take, release))

    def cron_pause(self, name_field: str) -> Invocation:
        """Reply: 1 paused now, 0 paused already, -1 no such recurrence."""
        k = self.keys
        return self._shared("cron_pause", (k.recurrence_states, k.due, k.records),
                            (k.timer_key_start, name_field, k.wake_channel))

    def cron_remove(self, name_field: str) -> Invocation:
        """Reply: 1 when the recurrence existed, 0 otherwise."""
        k = self.keys
        return self._shared("cron_remove",
                            (k.recurrences, k.recurrence_states, k.due, k.records),
                            (k.timer_key_start, name_field, k.wake_channel))
