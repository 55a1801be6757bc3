"""A run's flow plan: the concurrency key and rate limit its timer goes through, worked out
in one place from its record and its task's policy, once per run, and kept on the run.

Each stage that weighs a run's limits reads the run's plan (:func:`plan_of_run`): the
screen of a claim (:meth:`timers.listener.flow.gate.FlowGate.screen`), placement on a
sharded prefix (:mod:`timers.listener.flow.placer`) and the gate at the run's start
(:meth:`~timers.listener.flow.gate.FlowGate.admit`). The first of them to ask works it out
(a task's key and rate key functions are called then, and only then), the others read it:
so they never disagree on a run's key, limit or rate, even with a key function that gives
another key each time it is called. Parking a backlog
(:mod:`timers.listener.flow.parker`) weighs timers that are no runs yet:
:func:`plan_ahead`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from timers.exceptions import FlowKeyError
from timers.model.encoding import Args, Record
from timers.model.flow.declared import KeySpec, key_for
from timers.model.flow.names import DEFAULT_GROUP, TASK_KEY, unescape_key
from timers.model.policy import TaskPolicy, policy_of
from timers.model.run_record import record_head
from timers.model.runs import Run
from timers.model.wire import Option
from timers.store.script_rows import GateRun

_KEY_MARK = f"{Option.KEY}="


class FlowPlan(NamedTuple):
    """The limits a run goes through: its concurrency key ("" for none) with its limit,
    and its rate limit's name ("" for none) with the interval and burst."""

    key: str
    limit: int
    rate: str
    interval_ms: int
    burst: int

    @property
    def key_only(self) -> bool:
        """Its one limit is a concurrency key: the screen and the parker weigh it."""
        return bool(self.key) and not self.rate

    @property
    def home(self) -> str:
        """The limit whose shard the timer belongs in (its rate's, else its key's)."""
        return self.rate or self.key

    def gate_run(self, token: str) -> GateRun:
        """What ``gate.lua`` must decide for run ``token``."""
        return GateRun(token, *self)


def plan_of(record: Record, policy: TaskPolicy) -> FlowPlan | None:
    """The plan of a timer with ``record`` whose task has ``policy``, or None when nothing
    limits it. A key given at schedule time beats the task's key function; a key or rate
    function that fails raises :class:`~timers.exceptions.FlowKeyError`."""
    task_key = TASK_KEY + record.task
    key, limit = "", 1
    escaped = record.options.get(Option.KEY)
    if escaped:
        key, limit = unescape_key(escaped), policy.concurrency or 1
    elif policy.key is not None:
        key, limit = _call_key(policy.key, record.args, "key"), policy.concurrency or 1
    elif policy.concurrency is not None:
        key, limit = task_key, policy.concurrency
    if policy.rate is None:
        return FlowPlan(key, limit, "", 1, 1) if key else None
    rate = (task_key if policy.rate_key is None
            else _call_key(policy.rate_key, record.args, "rate_key"))
    return FlowPlan(key, limit, rate, policy.rate.interval_ms, policy.rate.burst)


def plan_of_run(run: Run, record: Record, policy: TaskPolicy) -> FlowPlan | None:
    """The plan of ``run``, whose decoded record is ``record`` and whose task has ``policy``:
    :func:`plan_of` at the first ask of any stage, kept on the run and read by the others
    (:meth:`Run.planned <timers.model.runs.Run.planned>`). A key function that failed
    raises :class:`~timers.exceptions.FlowKeyError` at each ask."""
    planned = run.planned(lambda: _plan_or_error(record, policy))
    if isinstance(planned, FlowKeyError):
        raise planned
    return planned


def plan_ahead(record_text: str, resolve: Callable[[str], Callable[..., Any]],
               run: Run | None = None) -> FlowPlan | None:
    """The plan of a claimed (or due) timer read before its run, from its record's text:
    None when its run must decide for itself (a recurrence, which schedules its next
    occurrence first; a task of another group, which the run moves), when nothing limits
    it, or on any error (a task refused, a key function failing: the run reports it).
    Reads no args unless the timer has a limit. Given the claimed ``run`` (the screen, the
    placer), the plan is the one kept on it (:func:`plan_of_run`); the parker weighs
    timers that are no runs yet."""
    task, options = record_head(record_text)
    try:
        policy = policy_of(resolve(task))
        if not (_KEY_MARK in options or policy.flow_limited):
            return None  # no limit: the common case costs a dict lookup, no decoding
        record = Record.decode(record_text)
        if Option.RECURRENCE in record.options:
            return None
        group = record.options.get(Option.GROUP) or DEFAULT_GROUP
        if policy.group is not None and policy.group != group:
            return None
        return plan_of(record, policy) if run is None else plan_of_run(run, record, policy)
    except Exception:
        return None


def _plan_or_error(record: Record, policy: TaskPolicy) -> FlowPlan | FlowKeyError | None:
    """What a run keeps of its plan: a key function's failure too, reported by its gate."""
    try:
        return plan_of(record, policy)
    except FlowKeyError as exc:
        return exc


def _call_key(make: KeySpec, args: Args, what: str) -> str:
    try:
        return key_for(make, args, what)
    except Exception as exc:
        raise FlowKeyError(f"{what} of the task failed: {type(exc).__name__}: {exc}") from None
