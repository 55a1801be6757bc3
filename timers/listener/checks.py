"""The checks a run passes before its task is called, in order: its group, its lateness,
its flow limits. (Its fence is asked where the task is called, right before its code: in
its thread, on the loop, in a quarantine child: :mod:`timers.listener.calling.runner`.)

Each check is a small object the executor asks in turn (:data:`Check`): None lets the run
go on to the next; an :class:`~timers.model.runs.Outcome` ends it there, unstarted (moved
to its group, missed, held back by its key or rate). A check answers at once when it can
(its group, its lateness, a run without limits): only one that must ask Redis (the flow
gate) gives an awaitable, which the executor awaits for the answer. A new rule a run must
pass before its call is one more check in the executor's list, not a branch in its code.
What runs around the call (a recurrence's steps) and how it is called (in a thread, on the
loop, in a quarantine child) stay in the executor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias

from timers.listener.flow.gate import FREE, Admission, FlowGate
from timers.listener.quarantine.parent import is_suspect
from timers.model.encoding import Record
from timers.model.flow.disagreement import describe, group_of, may_move
from timers.model.policy import TaskPolicy
from timers.model.runs import Outcome, Run
from timers.model.wire import Option

_MAX_LATENESS = Option.MAX_LATENESS


class Start:
    """One run on its way to its call, as the checks see it (made per run: slots)."""

    __slots__ = ("fn", "gated", "limited", "policy", "record", "run", "started_ms")

    def __init__(self, run: Run, record: Record, fn: Callable[..., Any], policy: TaskPolicy,
                 limited: bool, started_ms: float) -> None:
        self.run, self.record, self.fn, self.policy = run, record, fn, policy
        self.limited = limited
        """It goes through the flow gate: its task limits its runs, or its timer has a key."""
        self.started_ms = started_ms
        """When it started, on the Redis clock."""
        self.gated: Admission = FREE
        """The flow gate's word (:class:`FlowCheck`): by when a rate let it go start."""


Answer: TypeAlias = "Outcome | Awaitable[Outcome | None] | None"
"""A check's answer: None, go on; an outcome, stop there; an awaitable, its answer once
Redis is asked."""


class Check(Protocol):
    """One check of :mod:`timers.listener.checks`: None, go on; an outcome, stop there;
    an awaitable for either (:data:`Answer`)."""

    def __call__(self, start: Start) -> Answer:
        ...


class GroupCheck:
    """A task that declares another group than its timer's: the timer moves there (or,
    moved as often as it may, waits: the releases disagree)."""

    def __call__(self, start: Start) -> Outcome | None:
        declared = start.policy.group
        record = start.record
        if declared is None or group_of(record) == declared:
            return None
        if may_move(record):
            return Outcome("moved", "", f"to group {declared}")
        return Outcome("disagreed", "GroupDisagreement",
                       describe(record.task, declared, group_of(record)))


class LatenessCheck:
    """A run started later after its due time than its max lateness allows is not run
    (the timer's own limit beats the task's)."""

    def __call__(self, start: Start) -> Outcome | None:
        missed = missed_by(start.record, start.policy, start.started_ms - start.run.waited_from_ms)
        return None if missed is None else Outcome("missed", "Missed", missed)


class FlowCheck:
    """A run with limits asks its flow gate (a rerun asks from its quarantine child, once
    the task is loaded); held back, it waits for its key or rate."""

    def __init__(self, flow: FlowGate) -> None:
        self.flow = flow

    def __call__(self, start: Start) -> Answer:
        if not start.limited or is_suspect(start.run.reruns):
            return None
        return self._admitted(start)

    async def _admitted(self, start: Start) -> Outcome | None:
        start.gated = gated = await self.flow.admit(start.run, start.record, start.policy)
        return gated.held


def missed_by(record: Record, policy: TaskPolicy, lateness_ms: float) -> str | None:
    """Why a run is too late to start, or None. The timer's own limit beats the task's."""
    limit_ms: float | None = None
    if _MAX_LATENESS in record.options:
        with contextlib.suppress(ValueError):
            limit_ms = float(record.options[_MAX_LATENESS])
    elif policy.max_lateness is not None:
        limit_ms = policy.max_lateness * 1000
    if limit_ms is None or lateness_ms <= limit_ms:
        return None
    return (f"started {lateness_ms / 1000:.3f} s after its due time, over its max lateness "
            f"of {limit_ms / 1000:g} s: not run")
