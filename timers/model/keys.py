"""Every Redis key and channel name timers uses: the one place they are built.

The layout (each key's type and what it holds, the channels) is the reference page
``docs/reference/keys.md``. System names use ``|`` after the prefix and timer keys use
``:``, so no timer id can ever name a system key.
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
