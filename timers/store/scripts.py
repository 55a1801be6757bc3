"""The Lua scripts in ``timers/store/lua``: their source, and one typed wrapper per script.

The states of a timer and of a key's slot, every transition and the one script that makes
it, and the invariants they keep are written down in ``docs/state-machine.md``;
``tests/unit/test_model_flow.py`` checks those invariants against these scripts.

Each script starts with a Redis 7 shebang: ``#!lua flags=allow-oom`` on those that free
memory or keep it constant (renew, finish, cancel …), so they run on a full server, and a
plain ``#!lua`` on those that need memory (claim, schedule …), so a full server refuses
them before their first write instead of part-way. fakeredis cannot read a shebang; it
gets the scripts without that line. The shared helpers of ``lua/prelude.lua`` are put
right after the shebang of every script when it is loaded.

:class:`ScriptCalls` is the one place that spells each script's KEYS and ARGV order (the
order its header documents); :class:`Scripts` runs those calls on a redis-py client.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal, NamedTuple

from timers.model.history import DEFAULT_HISTORY_AGE, DEFAULT_HISTORY_COUNT
from timers.model.keys import DEFAULT_GROUP, SCRIPT_KEY_NAMES, Keyspace
from timers.store.cluster import is_cluster
from timers.store.declare import AsyncDeclaring, Declaring
from timers.store.lua_library import AsyncFunction, Function, library

ScriptName = Literal[
    "schedule", "reschedule", "cancel", "claim", "renew", "finish", "heartbeat", "forget",
    "cron_declare", "cron_next", "cron_pause", "cron_remove", "gate", "park",
    "near", "shards", "move", "arrive", "depart", "trim",
]
SCRIPT_NAMES: tuple[ScriptName, ...] = (
    "schedule",
    "reschedule",
    "cancel",
    "claim",
    "renew",
    "finish",
    "heartbeat",
    "forget",
    "cron_declare",
    "cron_next",
    "cron_pause",
    "cron_remove",
    "gate",
    "park",
    "near",
    "shards",
    "move",
    "arrive",
    "depart",
    "trim",
)
PRELUDES = ("prelude", "flow", "history", "declare")
"""``lua/prelude.lua``, ``lua/flow.lua``, ``lua/history.lua`` and ``lua/declare.lua``:
helpers shared by the scripts, included into each once, in this order."""


def _lua(name: str) -> str:
    return resources.files("timers.store").joinpath("lua", f"{name}.lua").read_text("utf-8")


_DECLARE_PART = re.compile(r"^[ \t]*-- declare \{\n.*?^[ \t]*-- declare \}\n",
                           re.MULTILINE | re.DOTALL)


def _script_text(name: str, declare: bool) -> str:
    """A script's file, with its declare part (``-- declare {`` to ``-- declare }``: the
    keys it needs and was not given, asked for before its first write; see
    ``lua/declare.lua``) kept or cut out."""
    text = _lua(name)
    return text if declare else _DECLARE_PART.sub("", text)


_DEFINITION = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*=)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--[^\n]*")


class _Definition(NamedTuple):
    names: frozenset[str]
    text: str
    uses: frozenset[str]


def _definitions(text: str) -> list[_Definition]:
    """The top-level ``local`` definitions of a helper file, in order: each runs from its
    ``local`` line to the next one (comments between go with the one above), with the names
    it defines and the names it uses. The file's opening comment goes with none."""
    found: list[_Definition] = []
    names: frozenset[str] = frozenset()
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        match = _DEFINITION.match(line)
        if match is not None:
            if names:
                found.append(_chunk(names, lines))
            defined = match.group(1) or match.group(2)
            names, lines = frozenset(part.strip() for part in defined.split(",")), []
        lines.append(line)
    if names:
        found.append(_chunk(names, lines))
    return found


def _chunk(names: frozenset[str], lines: list[str]) -> _Definition:
    text = "".join(lines)
    return _Definition(names, text, frozenset(_NAME.findall(_COMMENT.sub("", text))) - names)


@cache
def _helpers() -> tuple[_Definition, ...]:
    return tuple(d for name in PRELUDES for d in _definitions(_lua(name)))


def helpers_for(body: str) -> str:
    """The shared helpers ``body`` uses, directly or through another helper, in the order
    the helper files define them: only those, since Redis runs a script's every top-level
    ``local function`` on each call (each makes a closure, about 0.3 µs apiece)."""
    helpers = _helpers()
    wanted = set(_NAME.findall(_COMMENT.sub("", body)))
    needed: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index, helper in enumerate(helpers):
            if index not in needed and helper.names & wanted:
                needed.add(index)
                wanted |= helper.uses
                changed = True
    return "".join(helper.text for index, helper in enumerate(helpers) if index in needed)


@cache
def source(name: ScriptName, declare: bool = False) -> str:
    """The script as sent to Redis: its shebang line, then the shared helpers it uses
    (from the helper files of :data:`PRELUDES`), then its body; with its declare part
    (the keys it asks for) when ``declare`` (:func:`declares_keys`)."""
    text = _script_text(name, declare)
    shebang, _, body = text.partition("\n") if text.startswith("#!") else ("", "", text)
    prelude = helpers_for(body)
    return f"{shebang}\n{prelude}{body}" if shebang else prelude + body


_SYSTEM_KEY = re.compile(r"sys_key\(\s*[^,()]+,\s*'([a-z]+)'\s*\)")


@cache
def shared_key_names(name: ScriptName) -> tuple[str, ...]:
    """The names (of :data:`~timers.model.keys.SCRIPT_KEY_NAMES`, in its order) of the
    shared keys script ``name``'s code builds with ``sys_key``, in its body or the
    helpers it uses: the shared keys it is given as the last of its KEYS. A script is
    given only these: each key more in KEYS costs Redis about 0.3 us a call."""
    used = set(_SYSTEM_KEY.findall(_COMMENT.sub("", source(name))))
    unknown = used - set(SCRIPT_KEY_NAMES)
    if unknown:
        raise RuntimeError(f"{name}.lua builds shared keys that Keyspace.script_keys "
                           f"lacks: {sorted(unknown)}")
    return tuple(n for n in SCRIPT_KEY_NAMES if n in used)


SCHEDULE_NEW_KEYS = ("near",)
"""The shared keys ``schedule.lua`` touches for new timers (``pend``: the near horizon)."""
SCHEDULE_FLOW_KEYS = ("queues",)
"""… and for a timer with a group or priority (``pend`` lists its due index)."""


@cache
def schedule_key_names(replace: bool, flow: bool) -> tuple[str, ...]:
    """The names (as :func:`shared_key_names`) of the shared keys a ``schedule.lua`` call
    is given: every one its code names when a timer may replace a pending one
    (``replace``: mode "r", whose ``unpark`` may pass a held slot on), else the near
    horizon's, and the queues set's when a timer may have a group or priority (``flow``).
    The due index and the records are its first KEYS already. Each key more costs Redis
    about 1k instructions a call."""
    if replace:
        wanted = set(shared_key_names("schedule")) - {"due", "rec"}
    else:
        wanted = {*SCHEDULE_NEW_KEYS, *(SCHEDULE_FLOW_KEYS if flow else ())}
    return tuple(n for n in SCRIPT_KEY_NAMES if n in wanted)


def without_shebang(text: str) -> str:
    """The script without its ``#!lua …`` first line (for servers that cannot read it)."""
    return text.partition("\n")[2] if text.startswith("#!") else text


def _reads_shebang(client: Any) -> bool:
    return not any(kind.__module__.startswith("fakeredis") for kind in type(client).__mro__)


EVAL_ONLY_ENV = "TIMERS_EVAL_ONLY"
"""Set to 1 to run every script by EVALSHA, never as a function of the library."""


DECLARE_KEYS_ENV = "TIMERS_DECLARE_KEYS"
"""Set to 1 to have every script ask for the keys it needs and was not given (as on Redis
Cluster) on any server."""


def declares_keys(client: Any) -> bool:
    """Whether scripts on ``client`` run their declare part (``lua/declare.lua``): on Redis
    Cluster, where only KEYS are checked before a script runs, and on fakeredis, so that
    the unit tests' check (``tests/unit/declared_keys.py``) proves each part complete. A
    single server needs none of it, and pays nothing for it: the part is cut out."""
    return (is_cluster(client) or not _reads_shebang(client)
            or os.environ.get(DECLARE_KEYS_ENV) == "1")


@cache
def script_library(declare: bool = False) -> tuple[str, str]:
    """``(name, code)`` of the function library of every script
    (:mod:`timers.store.lua_library`), with their declare parts when ``declare``."""
    helpers = "".join(_lua(name) for name in PRELUDES)
    return library(helpers, tuple((name, _script_text(name, declare))
                                  for name in SCRIPT_NAMES))


def register(client: Any, name: ScriptName) -> Any:
    """One script on a redis-py client, sync or asyncio: a function of the library (see
    :mod:`timers.store.lua_library`), run by EVALSHA where the server refuses functions and on
    Redis Cluster (whose redis-py client finds an FCALL's slot by asking a node for its
    keys first: a round trip more per call). Where scripts declare their keys
    (:func:`declares_keys`), it is called again with the keys a call asks for
    (:class:`timers.store.declare.Declaring`)."""
    declare = declares_keys(client)
    text = source(name, declare)
    script = client.register_script(text if _reads_shebang(client) else without_shebang(text))
    if os.environ.get(EVAL_ONLY_ENV) == "1" or is_cluster(client):
        runner: Any = script
    else:
        library_name, code = script_library(declare)
        kind = AsyncFunction if inspect.iscoroutinefunction(client.execute_command) else Function
        runner = kind(client, f"{library_name}_{name}", code, script)
    if not declare:
        return runner
    asynchronous = inspect.iscoroutinefunction(client.execute_command)
    return (AsyncDeclaring if asynchronous else Declaring)(name, runner, is_cluster(client))


class Registered(dict[ScriptName, Any]):
    """The scripts of :data:`SCRIPT_NAMES` on a client, each registered (:func:`register`)
    when first looked up and then passed to ``prepare``: a process that calls one script
    (``timers schedule``) builds and hashes one, not every one."""

    def __init__(self, client: Any, prepare: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self.client, self.prepare = client, prepare

    def __missing__(self, name: ScriptName) -> Any:
        if name not in SCRIPT_NAMES:
            raise KeyError(name)
        runner = self[name] = register(self.client, name)
        if self.prepare is not None:
            self.prepare(runner)
        return runner


def register_all(client: Any, prepare: Callable[[Any], None] | None = None) -> Registered:
    """Every script on a redis-py client, sync or asyncio, each registered on its first
    use (:class:`Registered`; ``prepare`` is then called with it)."""
    return Registered(client, prepare)


# -- what each script is sent ------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """One script call: which script, its KEYS and its ARGV."""

    script: ScriptName
    keys: tuple[str, ...]
    args: tuple[Any, ...]


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


DEFAULT_RETENTION = (round(DEFAULT_HISTORY_AGE * 1000), DEFAULT_HISTORY_COUNT)
"""The history's (age ms, count) when no listener stored its own (``P|histcfg``)."""

NO_TAKER = Taker()
"""Hand nothing over."""

Ending = Sequence[str]
"""One ending for ``finish.lua``: ``(token, kind, a, b)``, or with its history record
``(token, kind, a, b, escaped id, record)`` kept the listener's age, or
``(token, kind, a, b, escaped id, record, age ms)`` kept its task's (see its header)."""


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

    def schedule(self, timers: Sequence[NewTimer]) -> Invocation:
        """The call adding ``timers``: its shared keys are those its timers may touch
        (:func:`schedule_key_names`)."""
        fixed = self._schedule_fixed
        if fixed is None:
            k = self.keys
            fixed = self._schedule_fixed = (k.due, k.records, k.timer_key_start,
                                            k.wake_channel)
        due, records, start, wake = fixed
        keys = [due, records]
        args: list[Any] = [start, wake]
        replace = flow = False
        for t in timers:
            keys.append(f"{start}{t.escaped_id}:{t.record}")
            args += t
            replace = replace or t.how == "r"
            flow = flow or ";g=" in t.record or ";p=" in t.record
        keys += self._schedule_shared(replace, flow)
        return Invocation("schedule", tuple(keys), tuple(args))

    def _schedule_shared(self, replace: bool, flow: bool) -> tuple[str, ...]:
        shared = self._schedule_keys.get((replace, flow))
        if shared is None:
            named = dict(zip(SCRIPT_KEY_NAMES, self.keys.script_keys, strict=True))
            shared = tuple(named[name] for name in schedule_key_names(replace, flow))
            self._schedule_keys[(replace, flow)] = shared
        return shared

    def reschedule(self, escaped_id: str, mode: str, ms: int) -> Invocation:
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
              keyed_tasks: Sequence[str] = (), floor: int | None = None) -> Invocation:
        k = self.keys
        return self._shared(
            "claim", (k.due, k.records, k.running, k.running_records, k.sequence, k.stats,
                      k.arrival_records),
            (k.timer_key_start, limit, lease_ms, horizon_ms, listener_id, ",".join(groups),
             ",".join(keyed_tasks), "" if floor is None else floor, *event_ids))

    def renew(self, lease_ms: int, tokens: Iterable[str]) -> Invocation:
        k = self.keys
        return self._shared("renew", (k.running, k.running_records),
                            (lease_ms, k.timer_key_start, *tokens))

    def gate(self, lease_ms: int, runs: Iterable[GateRun]) -> Invocation:
        k = self.keys
        args: list[Any] = [k.timer_key_start, k.wake_channel, lease_ms]
        for run in runs:
            args += [run.token, run.key, run.limit, run.rate, run.interval_ms, run.burst]
        return self._shared("gate", (k.running, k.running_records, k.records, k.stats),
                            tuple(args))

    def peek(self, limit: int, groups: Sequence[str]) -> Invocation:
        k = self.keys
        return self._shared("park", (k.due, k.records, k.stats),
                            (k.timer_key_start, "peek", limit, ",".join(groups)))

    def floor(self, groups: Sequence[str], tasks: Sequence[str]) -> Invocation:
        k = self.keys
        return self._shared("park", (k.due, k.records, k.stats,
                                     *(k.ungated("t:" + task) for task in tasks)),
                            (k.timer_key_start, "floor", ",".join(groups), *tasks))

    def park(self, lease_ms: int, timers: Iterable[ParkTimer]) -> Invocation:
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
        of its own (see ``lua/finish.lua``)."""
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
        indexes it touches it asks for on Redis Cluster)."""
        k = self.keys
        return self._shared("trim", (k.history, k.history_expiry, k.history_records,
                                     k.history_batches, k.history_failed, k.history_cursor),
                            (count, budget))

    def heartbeat(self, listener_id: str, ttl_ms: int, info: str, task_set: str = "",
                  task_list: str = "") -> Invocation:
        """``info`` "" says the listener is gone. ``task_set``: the digest ``info`` names;
        ``task_list``: its task paths, one a line, to store ("" when stored already)."""
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
        """Write moving timers into this shard, inert until settled (``arrive.lua`` "a")."""
        k = self.keys
        args: list[Any] = ["a", k.timer_key_start, k.wake_channel, lease_ms]
        for arrival in arrivals:
            args.extend(arrival)
        return self._shared("arrive", (k.arrivals, k.arrival_records), tuple(args))

    def settle(self, lease_ms: int, settles: Iterable[Settle]) -> Invocation:
        """Pend, drop or keep waiting arrivals (``arrive.lua`` "c")."""
        k = self.keys
        args: list[Any] = ["c", k.timer_key_start, k.wake_channel, lease_ms]
        keys: list[str] = [k.arrivals, k.arrival_records]
        for one in settles:
            args += [one.name, one.verdict]
            keys += [k.due_index_of(one.record), k.timer_key(f"{one.escaped_id}:{one.record}")]
        return self._shared("arrive", tuple(keys), tuple(args))

    def depart(self, departures: Iterable[Departure]) -> Invocation:
        """Let claimed runs leave for their limit's shard (``depart.lua`` "d")."""
        k = self.keys
        args: list[Any] = ["d", k.timer_key_start]
        keys: list[str] = [k.moves, k.stats]
        for one in departures:
            args += [one.token, one.to]
            keys.append(k.running_of(one.group))
        return self._shared("depart", tuple(keys), tuple(args))

    def departed(self, tokens: Iterable[str], forget: bool = False) -> Invocation:
        """What became of runs that were to leave (``depart.lua`` "q"), or (``forget``)
        forget the notes of those whose arrival is settled ("k")."""
        k = self.keys
        return self._shared("depart", (k.moves, k.stats),
                            ("k" if forget else "q", k.timer_key_start, *tokens))

    def forget(self, failure_id: str, read_as: str) -> Invocation:
        k = self.keys
        return Invocation("forget", (k.failures, k.failure_records, k.failure_index),
                          (failure_id, read_as))

    def cron_declare(self, *, name_field: str, definition: str, read_state: str,
                     paused: str, version: int, anchor_ms: int, record: str,
                     due_if_withdrawn: int, due_otherwise: int) -> Invocation:
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
        the overlap check looks for the previous run's lease)."""
        k = self.keys
        keys = [k.recurrence_states, k.due, k.records, k.running_of(group)]
        if successor_ms is not None:
            keys.append(self._occurrence_key(name_field, successor_ms, record))
        return self._shared("cron_next", tuple(keys), (
            k.timer_key_start, k.wake_channel, name_field, version, due_ms,
            -1 if successor_ms is None else successor_ms, record, int(defer), take, release))

    def cron_pause(self, name_field: str) -> Invocation:
        k = self.keys
        return self._shared("cron_pause", (k.recurrence_states, k.due, k.records),
                            (k.timer_key_start, name_field, k.wake_channel))

    def cron_remove(self, name_field: str) -> Invocation:
        k = self.keys
        return self._shared("cron_remove",
                            (k.recurrences, k.recurrence_states, k.due, k.records),
                            (k.timer_key_start, name_field, k.wake_channel))


class Scripts:
    """Each script as a method on one redis-py client and keyspace.

    A method returns the script's reply on a sync client and an awaitable of it on an
    asyncio one (redis-py's ``Script`` does the same), hence ``Any``. Scripts are
    registered on first use, once per :class:`Scripts`.
    """

    def __init__(self, client: Any, keys: Keyspace) -> None:
        self.client = client
        self.calls = ScriptCalls(keys)
        self._registered: dict[ScriptName, Any] = {}

    def script(self, name: ScriptName) -> Any:
        """The registered redis-py ``Script`` object."""
        if name not in self._registered:
            self._registered[name] = register(self.client, name)
        return self._registered[name]

    def run(self, call: Invocation) -> Any:
        return self.script(call.script)(keys=list(call.keys), args=list(call.args))

    def schedule(self, timers: Sequence[NewTimer]) -> Any:
        return self.run(self.calls.schedule(timers))

    def reschedule(self, escaped_id: str, mode: str, ms: int) -> Any:
        return self.run(self.calls.reschedule(escaped_id, mode, ms))

    def cancel(self, escaped_id: str, canceller: str = "",
               retention: tuple[int, int] = DEFAULT_RETENTION) -> Any:
        return self.run(self.calls.cancel(escaped_id, canceller, retention))

    def claim(self, *, limit: int, lease_ms: int, horizon_ms: int, listener_id: str,
              event_ids: Iterable[str] = (), groups: Sequence[str] = (DEFAULT_GROUP,),
              keyed_tasks: Sequence[str] = (), floor: int | None = None) -> Any:
        """Reply: ``[now_us, next_due, next_lease, (token, run, source)…]``.
        ``keyed_tasks``: the tasks with a concurrency key or cap (the order barrier);
        ``floor``: on several shards, the least of the other shards' :meth:`floor`
        (their timers due later wait for it)."""
        return self.run(self.calls.claim(limit=limit, lease_ms=lease_ms, horizon_ms=horizon_ms,
                                         listener_id=listener_id, event_ids=event_ids,
                                         groups=groups, keyed_tasks=keyed_tasks, floor=floor))

    def gate(self, lease_ms: int, runs: Iterable[GateRun]) -> Any:
        """Reply: one of ``go``, ``wait``, ``lost``, ``replaced`` per run."""
        return self.run(self.calls.gate(lease_ms, runs))

    def renew(self, lease_ms: int, tokens: Iterable[str]) -> Any:
        """Reply: the tokens no longer held."""
        return self.run(self.calls.renew(lease_ms, tokens))

    def peek(self, limit: int, groups: Sequence[str]) -> Any:
        """Reply: ``[id, due ms, record, …]``: due timers no flow gate holds yet."""
        return self.run(self.calls.peek(limit, groups))

    def floor(self, groups: Sequence[str], tasks: Sequence[str]) -> Any:
        """Reply: a due ms: every timer of ``tasks`` in this shard due before it has
        entered its limit's order (claimed and gated, or in a flow queue); see
        docs/state-machine.md, Cluster, rule 5."""
        return self.run(self.calls.floor(groups, tasks))

    def park(self, lease_ms: int, timers: Iterable[ParkTimer]) -> Any:
        """Reply: how many of ``timers`` went into their key's queue."""
        return self.run(self.calls.park(lease_ms, timers))

    def near(self, limit: int) -> Any:
        """Reply: ``[until, reached, keyed]``: keys written up to ``until`` ms;
        ``reached`` 1 when that is now + the near horizon (else call again); ``keyed``: how
        many keys this call wrote."""
        return self.run(self.calls.near(limit))

    def finish(self, *, retention_ms: int, endings: Iterable[Ending],
               taker: Taker = NO_TAKER, history: tuple[int, int] = DEFAULT_RETENTION,
               series: Sequence[tuple[str, str]] = (), store_retention: bool = True,
               task_retention: Sequence[tuple[str, str, str]] = ()) -> Any:
        """Reply: ``[late finishes, (token, run, source)…]``: the runs handed over."""
        return self.run(self.calls.finish(retention_ms=retention_ms, endings=endings,
                                          taker=taker, history=history, series=series,
                                          store_retention=store_retention,
                                          task_retention=task_retention))

    def trim(self, count: int, budget: int) -> Any:
        """Reply: ``[records dropped or indexed, 1 if more is owed]`` (``lua/trim.lua``)."""
        return self.run(self.calls.trim(count, budget))

    def heartbeat(self, listener_id: str, ttl_ms: int, info: str, task_set: str = "",
                  task_list: str = "") -> Any:
        """Reply: ``[stored, id, …]``: 1 if the task list of ``task_set`` is stored (or
        none is named) else 0, then the ids of the live listeners (``lua/heartbeat.lua``)."""
        return self.run(self.calls.heartbeat(listener_id, ttl_ms, info, task_set, task_list))

    def arrive(self, lease_ms: int, arrivals: Iterable[Arrival]) -> Any:
        """Reply: per arrival, 1 written or 0 there already."""
        return self.run(self.calls.arrive(lease_ms, arrivals))

    def settle(self, lease_ms: int, settles: Iterable[Settle]) -> Any:
        """Reply: per arrival, 1 settled (or its deadline moved) or 0 gone already."""
        return self.run(self.calls.settle(lease_ms, settles))

    def depart(self, departures: Iterable[Departure]) -> Any:
        """Reply: per run, 1 left, 0 not held, 2 holds a slot here (stays)."""
        return self.run(self.calls.depart(departures))

    def departed(self, tokens: Iterable[str], forget: bool = False) -> Any:
        """Reply: per token 1 left, 2 still held, 0 neither; with ``forget``: a count."""
        return self.run(self.calls.departed(tokens, forget))

    def forget(self, failure_id: str, read_as: str) -> Any:
        return self.run(self.calls.forget(failure_id, read_as))

    def cron_declare(self, **kwargs: Any) -> Any:
        """Arguments as :meth:`ScriptCalls.cron_declare`."""
        return self.run(self.calls.cron_declare(**kwargs))

    def cron_next(self, *, name_field: str, version: int, due_ms: int,
                  successor_ms: int | None, record: str, defer: bool, take: str,
                  release: str, group: str = DEFAULT_GROUP) -> Any:
        """Reply: ``[status, holder]``."""
        return self.run(self.calls.cron_next(
            name_field=name_field, version=version, due_ms=due_ms, successor_ms=successor_ms,
            record=record, defer=defer, take=take, release=release, group=group))

    def cron_pause(self, name_field: str) -> Any:
        return self.run(self.calls.cron_pause(name_field))

    def cron_remove(self, name_field: str) -> Any:
        return self.run(self.calls.cron_remove(name_field))
