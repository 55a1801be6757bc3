"""Every Redis key and channel name timers uses: the one place they are built.

Layout for a prefix ``P`` (default ``$TIMERS_PREFIX`` or ``timers``). ``<id>`` is always
the *escaped* timer id (see :mod:`timers.model.encoding`), so it never contains ``:``.

==================  ======  ========================================================
key                 type    holds
==================  ======  ========================================================
``P:<id>:<record>`` string  one per pending timer, value ``1``, expiring at the due
                            time (``SET … PXAT``). Its name is the whole timer, so the
                            ``expired`` event alone says what to run.
``P|due``           zset    id → due time in ms (Redis clock). The source of truth for
                            what is pending; the sweeper claims from its head.
``P|rec``           hash    id → record (``task[;opts]:args``): what fires, kept after
                            the expiring key is gone.
``P|run``           zset    run token → lease deadline in ms: timers being run.
``P|runrec``        hash    run token → ``reruns@<listener>|due|<id>:<record>``.
``P|seq``           string  counter that numbers run tokens (and history batches).
``P|fail``          zset    failure id → time of the last failure in ms.
``P|failrec``       hash    failure id → JSON :class:`timers.model.wire.FailureRecord`: id,
                            task, args, record, kind, error_type, message, traceback,
                            attempts, due_ms, first_failure, failed_at (Redis ms),
                            options (group g, priority p, key k, max lateness ml:
                            what a retry keeps);
                            a rejected key's: id, key, kind, error_type, message,
                            failed_at.
                            A dead timer's failure id is ``<id>:<run token>`` (one per
                            dead timer); a rejected event's is ``<id>`` or ``:<digest>``.
``P|failidx``       zset    every dead timer's failure id, all scores 0: the records of
                            one timer id are a ``ZRANGEBYLEX [<id>: (<id>;`` away.
``P|stats``         hash    counters (:class:`timers.model.wire.Counter`): fired (ended
                            well), failed, skipped, reruns, rejected, retried,
                            handed_back, late_finishes, routed (moved to their
                            task's group), placed (moved to the shard of
                            their task's limit), waited (held for a concurrency key),
                            rate_limited (held for a rate limit), held_ms (ms
                            they waited, added as each starts).
``P|listeners``     zset    listener id → heartbeat deadline ms: the live listeners.
``P|listener``      hash    listener id → JSON (id, host, pid, started, running,
                            fired: runs ended however they ended, concurrency,
                            tasks: the package, stuck, task_set: the digest of
                            its task paths in ``P|tasks``).
``P|tasks``         hash    task set digest → the task paths a listener can run, one a
                            line, sorted: written once per digest by the heartbeat of a
                            listener whose JSON names that digest (``task_set``); a
                            digest no live listener names is dropped (:mod:`timers.ops.fleet`).
``P|cron``          hash    escaped recurrence name → definition JSON (task, args,
                            cron or interval, tz, policies): written by producers only.
``P|cronstate``     hash    escaped recurrence name → ``v|last|prev|paused|run|anchor``
                            (see :mod:`timers.model.cron`): kept by the ``cron_*`` scripts.
                            Its pending occurrence is the timer ``<name>@<last>``.
``P|due|<g>|<p>``   zset    as ``P|due``, for the timers of group ``g`` at priority
                            ``p`` other than (``default``, 0): claims take higher
                            priorities first. ``P|queues`` (set) lists the
                            ``<g>|<p>`` that exist.
``P|run|<g>``       zset    as ``P|run``, for the runs of group ``g`` (not default).
``P|slots|<key>``   zset    run token (or ``w:<id>``, a slot kept for a promoted
                            timer) → lease deadline: who holds concurrency key
                            ``key``.
``P|waitk|<key>``   zset    id → queue score: timers waiting for a slot of ``key``;
                            score (1000 - priority) * 2^42 + due ms.
``P|rate|<name>``   hash    ``tat`` (GCRA), ``pacer`` (the waiting timer that holds
                            the next slot), ``last`` (ms of its last start) and ``by``
                            (``<token>|<last>``: whose) of rate limit ``name``.
``P|waitr|<name>``  zset    id → queue score: timers waiting for rate limit ``name``.
``P|parked``        hash    id → state of a timer held back by a flow gate (see
                            ``timers/store/lua/flow.lua``).
``P|held``          hash    run token → ``limit|lease|key``: the slot a run holds.
``P|next``          hash    run token → the token of the run next in line on its slot
                            (handed to the same listener; it takes the slot over when
                            the first run's ending is written).
``P|ungated|<b>``   zset    id → queue score: timers a claim gave out that no gate has
                            seen yet, per barrier ``k:<key>`` (a timer's own key) or
                            ``t:<task>`` (a keyed task) (the order barrier,
                            ``timers/store/lua/flow.lua``).
``P|ungatedt``      hash    id → run token of those, or ``r|<barrier>`` for a keyed
                            timer that waits for its rate limit (its key's order).
``P|barred``        hash    concurrency key → its limit: a key whose queue head waits
                            behind the order barrier (promoted when it lifts).
``P|hist``          zset    batch id ``::<n>`` -> when it was written, ms: the run
                            history indexed by batch (the ends, completed, skipped, dead,
                            cancelled, one finish call wrote with one age, or one cancel),
                            read newest first and trimmed from its head by count
                            (``timers/store/lua/history.lua``, by each listener's
                            ``trim.lua`` loop). A batch id ``:<n>`` is one written before
                            the task and dead indexes.
``P|histexp``       zset    batch id -> when its records expire, ms (its end plus its
                            task's age, else the listener's): trimmed from its head by
                            age, so each task keeps its own age in O(log n) per batch.
``P|histb``         hash    batch id -> the escaped ids it wrote, joined by ``:``. A batch
                            id is ``::`` and a number of ``P|seq`` (its first run's token,
                            or drawn for a cancel), so none repeats.
``P|histrec``       hash    escaped id -> ``<batch id>|`` and its newest end's
                            :class:`timers.model.history.HistoryRecord` text
                            ``ki|ended|duration|attempts|lateness|listener|task|error``
                            (:class:`timers.model.history.StoredHistory`); a batch's
                            record is one whose prefix names it.
``P|histcfg``       string  ``<age ms> <count>``: the listeners' history retention, for
                            ``cancel.lua`` (written by each listener as it starts).
``P|histtask``      hash    task -> its own history age ms (``@task(history=...)``; 0:
                            none kept), for ``cancel.lua`` (written by each listener as
                            it starts; a task absent keeps the listeners' age).
``P|histtaskn``     hash    task -> its own history count (``@task(history_count=N)``;
                            0: none kept), of the tasks that have one, for ``cancel.lua``
                            (written like ``P|histtask``; a task written without one is
                            dropped; its ``P|hist|n|<t>`` stays).
``P|hist|n|<t>``    zset    escaped id -> end ms: the kept records of task ``t``, its
                            index (``timers history --task``), written with each record
                            and dropped with it; for a task with a count of its own,
                            trimmed to the count as it is written, oldest first (each
                            popped id's record is dropped if it is still this task's).
                            Named from ``P|hist`` by the scripts.
``P|histf``         zset    escaped id -> end ms: the kept dead ends (``--failed``),
                            written and dropped with their records.
``P|histix``        string  the end ms through which every ``P|hist`` batch is in the
                            indexes: ``trim.lua`` indexes older batches (ids ``:<n>``)
                            past it, and filtered reads look at those one by one.
``P|series``        hash    ``<task>|<minute mod 1440>`` -> :class:`timers.model.history.MinuteSlot`
                            text: a ring of 24 h of minute slots per task (runs,
                            failures, lateness and duration histograms).
``P|seriest``       hash    task -> last minute written: the tasks with a series.
``P|arriving``      zset    ``<from shard>|<run token>`` -> deadline ms: timers moving
                            into this shard, not settled yet (Cluster: a limit the
                            task declares lives in one shard; ``lua/arrive.lua``).
``P|arrivingrec``   hash    ``<from shard>|<run token>`` -> ``<due>|<id>:<record>``: what
                            each of those pends once its source commits the move.
``P|moves``         hash    run token -> the shard a run of this shard moved to, noted
                            by ``lua/depart.lua`` (the move's commit point) until the
                            arrival is settled there.
``P|shards``        string  the shard count of the prefix (:mod:`timers.ops.shards`); kept
                            in the one-shard keyspace ``P`` of the prefix. Shard ``i`` of
                            ``S`` > 1 has the keyspace ``{P#i.k}`` (``k`` spreads the
                            shards' slots: :func:`timers.ops.shards.shard_prefix`), with
                            every key above.
``P|format``        string  the data format of the prefix's keys, an integer
                            (:mod:`timers.model.data_format`); absent: format 1. Kept,
                            like ``P|shards``, in the one-shard keyspace ``P`` alone:
                            written by each listener as it starts if absent, read by
                            each producer before its first write.
``P|instance``      string  a random id of the prefix on its server, given by its first
                            listener (:mod:`timers.listener.endings.journal`); in ``P`` alone.
==================  ======  ========================================================

The flow keys (``queues`` onward) are also named by ``timers/store/lua/prelude.lua`` and
``flow.lua``, from the timer key start ``P:``; ``tests/unit/test_flow_lua.py`` keeps them in
step.

Channels: ``P|wake`` carries the due time of a newly scheduled timer that is earlier than
the head of ``P|due`` (a listener ignores anything else on it);
``__keyevent@<db>__:expired`` carries expired key names.

System names use ``|`` after the prefix and timer keys use ``:``, so no timer id can ever
name a system key, and the listener can tell timer keys from everything else by their
``P:`` start alone.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from functools import cached_property

DEFAULT_PREFIX = "timers"
DEFAULT_GROUP = "default"
"""The group of a timer that names none; its keys are the plain ``P|due`` and ``P|run``."""
PREFIX_ENV = "TIMERS_PREFIX"
SCRIPT_KEY_NAMES = ("due", "rec", "run", "runrec", "queues", "parked", "held", "next",
                    "ungatedt", "barred", "near")
"""What follows ``P|`` in each of :attr:`Keyspace.script_keys` (``lua/prelude.lua``'s
``sys_key`` finds a key by this name among the KEYS it was given)."""


def check_prefix(prefix: str, name: str = "prefix") -> str:
    """``prefix`` if it can start key names, else ValueError (one line, saying ``name``)."""
    if (not prefix or prefix != prefix.strip()
            or any(c in ":|" or unicodedata.category(c) == "Cc" for c in prefix)):
        raise ValueError(f"{name} must be non-empty and free of ':', '|' and control "
                         f"characters, with no space at either end, got {prefix!r}")
    return prefix


def configured_prefix(prefix: str | None = None) -> str:
    """``prefix`` if given, else ``$TIMERS_PREFIX``, else ``timers``, checked."""
    if prefix is not None:
        return check_prefix(prefix)
    return check_prefix(os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX, f"${PREFIX_ENV}")


@dataclass(frozen=True)
class Keyspace:
    """Names of every key and channel under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def timer_key_start(self) -> str:
        """What every timer key name starts with."""
        return self.prefix + ":"

    def timer_key(self, entry: str) -> str:
        """The expiring key of a timer; ``entry`` is ``<escaped id>:<record>``."""
        return self.timer_key_start + entry

    @property
    def due(self) -> str:
        return self.prefix + "|due"

    @property
    def records(self) -> str:
        return self.prefix + "|rec"

    @property
    def running(self) -> str:
        return self.prefix + "|run"

    @property
    def running_records(self) -> str:
        return self.prefix + "|runrec"

    @property
    def sequence(self) -> str:
        return self.prefix + "|seq"

    @property
    def instance(self) -> str:
        """A random id the first listener gives the prefix on its server: names the
        directory of its listeners' endings journals on a host, whatever address each
        reaches the server by (:mod:`timers.listener.endings.journal`)."""
        return self.prefix + "|instance"

    @property
    def data_format(self) -> str:
        """string: the data format of the prefix's keys (:mod:`timers.model.data_format`;
        absent: format 1)."""
        return self.prefix + "|format"

    @property
    def failures(self) -> str:
        return self.prefix + "|fail"

    @property
    def failure_records(self) -> str:
        return self.prefix + "|failrec"

    @property
    def failure_index(self) -> str:
        return self.prefix + "|failidx"

    @property
    def stats(self) -> str:
        return self.prefix + "|stats"

    @property
    def listeners(self) -> str:
        return self.prefix + "|listeners"

    @property
    def listener_info(self) -> str:
        return self.prefix + "|listener"

    @property
    def task_sets(self) -> str:
        """hash: task set digest -> the task paths of the listeners that announce it."""
        return self.prefix + "|tasks"

    @property
    def recurrences(self) -> str:
        return self.prefix + "|cron"

    @property
    def recurrence_states(self) -> str:
        return self.prefix + "|cronstate"

    def due_index(self, group: str = DEFAULT_GROUP, priority: int = 0) -> str:
        """The due index of one group at one priority."""
        if group == DEFAULT_GROUP and priority == 0:
            return self.due
        return f"{self.due}|{group}|{priority}"

    def due_index_of(self, record: str) -> str:
        """The due index a record ``task[;opt=value…]:args`` is pended in, read as
        ``lua/prelude.lua``'s ``due_key_for`` reads it (``;g=``, ``;p=`` in -1000..1000)."""
        options = dict(part.partition("=")[::2] for part in record.partition(":")[0]
                       .split(";")[1:])
        group = options.get("g") or DEFAULT_GROUP
        text = options.get("p", "0")
        priority = int(text) if text.lstrip("-").isdigit() and text.count("-") <= 1 else 0
        return self.due_index(group, priority if -1000 <= priority <= 1000 else 0)

    def running_of(self, group: str = DEFAULT_GROUP) -> str:
        return self.running if group == DEFAULT_GROUP else f"{self.running}|{group}"

    @property
    def queues(self) -> str:
        return self.prefix + "|queues"

    def slots(self, key: str) -> str:
        return f"{self.prefix}|slots|{key}"

    def key_queue(self, key: str) -> str:
        return f"{self.prefix}|waitk|{key}"

    def ungated(self, barrier: str) -> str:
        return self.prefix + "|ungated|" + barrier

    @property
    def ungated_tokens(self) -> str:
        return self.prefix + "|ungatedt"

    @property
    def barred(self) -> str:
        return self.prefix + "|barred"

    def rate(self, name: str) -> str:
        return f"{self.prefix}|rate|{name}"

    def rate_queue(self, name: str) -> str:
        return f"{self.prefix}|waitr|{name}"

    @property
    def parked(self) -> str:
        return self.prefix + "|parked"

    @property
    def held(self) -> str:
        return self.prefix + "|held"

    @property
    def next_in_line(self) -> str:
        return self.prefix + "|next"

    @property
    def near(self) -> str:
        """hash: "until" (every timer due by then has its expiring key), "horizon" (ms)."""
        return self.prefix + "|near"

    @property
    def history(self) -> str:
        """zset: history batch id -> when it was written (ms) (``lua/history.lua``)."""
        return self.prefix + "|hist"

    @property
    def history_expiry(self) -> str:
        """zset: history batch id -> when its records expire (ms)."""
        return self.prefix + "|histexp"

    @property
    def history_batches(self) -> str:
        """hash: history batch id -> the escaped ids it wrote, joined by ``:``."""
        return self.prefix + "|histb"

    @property
    def history_task_ages(self) -> str:
        """hash: task -> its own history age in ms (0: keeps none)."""
        return self.prefix + "|histtask"

    @property
    def history_task_counts(self) -> str:
        """hash: task -> its own history count (0: keeps none), of the tasks with one."""
        return self.prefix + "|histtaskn"

    def history_task(self, task: str) -> str:
        """zset: escaped id -> end ms of the kept records of ``task``: its index (the
        scripts name it from :attr:`history` the same way)."""
        return f"{self.history}|n|{task}"

    @property
    def history_failed(self) -> str:
        """zset: escaped id -> end ms of the kept dead ends (the scripts name it from
        :attr:`history` the same way)."""
        return self.history + "f"

    @property
    def history_cursor(self) -> str:
        """string: the end ms through which every history batch is indexed (``trim.lua``)."""
        return self.prefix + "|histix"

    @property
    def history_records(self) -> str:
        """hash: escaped id -> history record text."""
        return self.prefix + "|histrec"

    @property
    def history_retention(self) -> str:
        """string: ``<age ms> <count>`` the listeners keep the history to."""
        return self.prefix + "|histcfg"

    @property
    def series(self) -> str:
        """hash: ``<task>|<minute slot>`` -> minute slot text."""
        return self.prefix + "|series"

    @property
    def series_tasks(self) -> str:
        """hash: task -> last minute written."""
        return self.prefix + "|seriest"

    @property
    def arrivals(self) -> str:
        """zset: ``<from shard>|<run token>`` -> deadline ms of a move not settled yet."""
        return self.prefix + "|arriving"

    @property
    def arrival_records(self) -> str:
        """hash: ``<from shard>|<run token>`` -> ``<due>|<id>:<record>`` of that move."""
        return self.prefix + "|arrivingrec"

    @property
    def moves(self) -> str:
        """hash: run token -> the shard the run moved to (until its arrival settles)."""
        return self.prefix + "|moves"

    @property
    def shards(self) -> str:
        """string: how many shards the prefix is split into (see :mod:`timers.ops.shards`)."""
        return self.prefix + "|shards"

    @cached_property
    def script_keys(self) -> tuple[str, ...]:
        """The keys the shared Lua helpers (``lua/prelude.lua``, ``lua/flow.lua``) may
        touch in any script, in the order of :data:`SCRIPT_KEY_NAMES`: each script that
        uses the helpers is given them as the last of its KEYS, so no helper builds a
        key name (on Redis Cluster only KEYS are checked before a script runs)."""
        named = {"due": self.due, "rec": self.records, "run": self.running,
                 "runrec": self.running_records, "queues": self.queues,
                 "parked": self.parked, "held": self.held, "next": self.next_in_line,
                 "ungatedt": self.ungated_tokens, "barred": self.barred, "near": self.near}
        return tuple(named[name] for name in SCRIPT_KEY_NAMES)

    @property
    def wake_channel(self) -> str:
        return self.prefix + "|wake"

    @staticmethod
    def expired_channel(db: int) -> str:
        """The channel Redis publishes expired key names of database ``db`` on."""
        return f"__keyevent@{db}__:expired"
