"""Whether a live listener announces the task a producer schedules (a typo caught where it
is made, not when a listener refuses it hours later).

Listeners announce the task paths they can run (their heartbeat's ``task_set``,
:mod:`timers.ops.fleet`). The first time a client schedules a task in a group it reads
them, in one round trip (:func:`timers.ops.fleet.read_fleet`), and remembers the answer:
every later timer of that task and group costs nothing more. When live listeners serve the
group and none can run the task, it warns once (logger ``timers.producer``) naming the
nearest task paths they announce; with ``strict_tasks=True`` it refuses instead
(:class:`timers.exceptions.InvalidTimer`, nothing written). With no live listener at all it
says nothing: one that starts later may run it.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from timers.exceptions import InvalidTimer
from timers.model.encoding import check_task
from timers.model.flow.names import DEFAULT_GROUP, check_group
from timers.model.keys import Keyspace
from timers.ops.operations import Operation, TimerSpec

if TYPE_CHECKING:  # (read by the first schedule: a command that only reads loads none of it)
    from timers.ops.fleet import FleetView

log = logging.getLogger("timers.producer")


def tasks_of(specs: Iterable[TimerSpec | Mapping[str, Any]],
             default_group: str) -> list[tuple[str, str]]:
    """The (task, group) pairs of ``specs`` (a group not given: ``default_group``)."""
    pairs = []
    for spec in specs:
        task, group = ((spec.task, spec.group) if isinstance(spec, TimerSpec)
                       else (spec.get("task"), spec.get("group")))
        group = group if group is not None else default_group
        try:  # (a bad task path or group is the write's own error, said there)
            pairs.append((check_task(task), check_group(group)))
        except ValueError:
            continue
    return pairs


class TaskCheck:
    """The (task, group) pairs a client has checked; ``strict``: refuse an unknown one."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.checked: set[tuple[str, str]] = set()

    def unchecked(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Those of ``pairs`` not checked yet (none: no round trip is needed)."""
        return list(dict.fromkeys(p for p in pairs if p not in self.checked))

    def ask(self, keys: Keyspace, pairs: list[tuple[str, str]]) -> Operation[None]:
        """Read the live listeners of ``keys``' prefix (one round trip) and :meth:`judge`
        ``pairs`` by them."""
        from timers.ops.fleet import read_fleet

        self.judge((yield from read_fleet(keys)), pairs)

    def judge(self, fleet: FleetView, pairs: Iterable[tuple[str, str]]) -> None:
        """Warn once (or, strict, raise :class:`InvalidTimer`) for each pair no live
        listener can run; remember the rest, and the warned ones."""
        for task, group in pairs:
            if (task, group) in self.checked:  # (judged by a call that was in flight too)
                continue
            if not fleet.may_run(task, group):
                said = unknown_task(fleet, task, group)
                if self.strict:
                    raise InvalidTimer(said)
                log.warning("%s", said)
            self.checked.add((task, group))


def unknown_task(fleet: FleetView, task: str, group: str = DEFAULT_GROUP) -> str:
    """``no live listener announces task 'reminders.smss' in group default: did you mean
    'reminders.sms'? (live listeners: …)``."""
    serving = [p for p in fleet.peers if p.serves(group)]
    known = sorted({t for p in serving for t in p.tasks or ()})
    near = difflib.get_close_matches(task, known, n=3, cutoff=0.6)
    meant = (f": did you mean {' or '.join(repr(n) for n in near)}?" if near
             else "" if serving else f": no live listener serves group {group!r}")
    return (f"no live listener announces task {task!r} in group {group}{meant} "
            f"({fleet.describe()})")
