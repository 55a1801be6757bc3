"""The steps a run passes before its task is called, in order: whether this listener has
its task (else a peer that has it), its turn after the run before it on its key, its
context, its recurrence's next occurrence, its task resolved, its group, its lateness, a
suspect run's call in quarantine (a child process: its fence, its flow gate and the deaths
counted toward its crash limit are there), its flow limits. (The fence of any other run is
asked where its task is called, right before its code: in its thread or on the loop,
:mod:`timers.listener.calling.runner`.)

Each step is a small object the executor asks in turn (:data:`Check`): None lets the run
go on to the next; an :class:`~timers.model.runs.Outcome` ends it there (passed to a peer,
skipped, refused, moved to its group, missed, held back by its key or rate; or how a
suspect run ended in its child). A step answers at once when it can: only one that must
wait or ask Redis gives an awaitable, which the executor awaits for the answer. A step
with an ``after`` method (the recurrence's) is told how the run ended, whatever ended it,
once it has been asked. A new rule a run must pass before its call is one more step in the
executor's list, not a branch in its code.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias

from timers.exceptions import TaskRefused
from timers.listener.calling import context
from timers.listener.calling.runner import Turn
from timers.listener.cron_hook import RecurrenceHook
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.flow.gate import FREE, Admission, FlowGate
from timers.listener.flow.turns import Turns
from timers.listener.health.peers import Peers
from timers.listener.leases import Fence
from timers.listener.quarantine.parent import Quarantine, is_suspect
from timers.model.encoding import Record
from timers.model.flow.disagreement import describe, group_of, may_move
from timers.model.policy import DEFAULT_POLICY, TaskPolicy, policy_of
from timers.model.runs import Outcome, Run
from timers.model.wire import Option

_MAX_LATENESS, _RECURRENCE, _KEY = Option.MAX_LATENESS, Option.RECURRENCE, Option.KEY


def _unresolved(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("called before its task was resolved")


class Start:
    """One run on its way to its call, as the steps see it and fill it in (made per run:
    slots, no dataclass)."""

    __slots__ = ("after", "ended_ms", "fence", "fn", "found", "gated", "limited", "policy",
                 "record", "recurring", "refusal", "run", "started_ms")

    def __init__(self, run: Run, record: Record, started_ms: float,
                 fence: Callable[[], bool]) -> None:
        self.run, self.record, self.fence = run, record, fence
        """``fence``: asked right before the task's code, wherever it runs."""
        self.started_ms = started_ms
        """When it started, on the Redis clock (a run that waited for the run before it
        on its key: from when that one ended)."""
        self.ended_ms: float | None = None
        """When its function returned, when its thread says so (a run that may be
        followed)."""
        self.fn: Callable[..., Any] = _unresolved
        self.found = False
        """Whether its task was resolved here (:class:`Lacking`), and :attr:`fn` is it."""
        self.policy: TaskPolicy = DEFAULT_POLICY
        options = record.options
        self.recurring = _RECURRENCE in options
        """Whether it is an occurrence of a recurrence."""
        self.limited = _KEY in options
        """It goes through the flow gate: its task limits its runs, or its timer has a key
        (decided once per run; its ending is written promptly, see
        :attr:`~timers.listener.endings.ending.Executed.prompt`)."""
        self.refusal = ""
        """What the listeners seen said, for a task this listener lacks."""
        self.after: Turn | None = None
        """The turn of the run before it on its key, when it may start in that run's
        thread as it ends (:class:`FollowTurn`)."""
        self.gated: Admission = FREE
        """The flow gate's word (:class:`FlowCheck`): by when a rate let it go start."""


Answer: TypeAlias = "Outcome | Awaitable[Outcome | None] | None"
"""A step's answer: None, go on; an outcome, stop there; an awaitable, its answer once
waited for."""


class Check(Protocol):
    """One step of :mod:`timers.listener.checks`: None, go on; an outcome, stop there;
    an awaitable for either (:data:`Answer`)."""

    def __call__(self, start: Start) -> Answer:
        ...


class Lacking:
    """A task this listener cannot run: when another live listener serving its group has
    it, ``passed`` (handed back for that one), before a recurrence's steps (the listener
    that runs it takes them); else the run goes on, to be refused once its recurrence's
    next occurrence is scheduled (:class:`Resolve`)."""

    def __init__(self, resolve: Callable[[str], Callable[..., Any]], peers: Peers) -> None:
        self.resolve, self.peers = resolve, peers

    def __call__(self, start: Start) -> Answer:
        try:
            start.fn = self.resolve(start.record.task)
        except TaskRefused:
            return self._elsewhere(start)
        start.found = True
        return None

    async def _elsewhere(self, start: Start) -> Outcome | None:
        runners, view = await self.peers.runners(start.record.task, group_of(start.record))
        if runners:
            return Outcome("passed", "", runners[0].describe())
        start.refusal = self.peers.refusal(view)
        return None


class FollowTurn:
    """A run next in line on a key slot: it may start in the thread of the run before it
    as that one ends (:mod:`timers.listener.flow.turns`), when nothing is to be decided at
    its start but to call it. Else it waits here for that run to end, and its start counts
    from then: so does a rerun, which runs in quarantine (a child process), never in that
    thread. Asked back meanwhile (the run before it did not start), it does not start."""

    def __init__(self, turns: Turns, tracker: DueTracker,
                 resolve: Callable[[str], Callable[..., Any]]) -> None:
        self.turns, self.tracker, self.resolve = turns, tracker, resolve

    def __call__(self, start: Start) -> Answer:
        return self._followed(start) if start.run.follows else None

    async def _followed(self, start: Start) -> Outcome | None:
        run = start.run
        after = self.turns.before(run)
        if after is not None and (start.recurring or is_suspect(run.reruns)
                                  or not self._may_follow_in_thread(start.record)):
            await after.ended.wait()
            start.started_ms = self.tracker.redis_now_ms()
            after = None
        start.after = after
        if after is None and (own := self.turns.of(run.token)) is not None and own.revoked:
            return _TAKEN_BACK  # it waited for the run before it, which did not start
        return None

    def _may_follow_in_thread(self, record: Record) -> bool:
        """Whether nothing is to be decided at this run's start but to call it: no rate
        limit to ask the gate about, no max lateness, no move to another group."""
        try:
            policy = policy_of(self.resolve(record.task))
        except Exception:
            return False
        return (policy.rate is None and policy.max_lateness is None
                and _MAX_LATENESS not in record.options
                and (policy.group is None or policy.group == group_of(record)))


class EnterContext:
    """From here on the run's context is current (:func:`timers.current`)."""

    def __call__(self, start: Start) -> None:
        context.enter_run(start.run, start.record, start.started_ms, start.fence)


class Recurrence:
    """An occurrence of a recurrence schedules its next one first, whatever becomes of
    this one (even a task this listener cannot import must not end the chain); it may be
    skipped (paused, removed, overlapping). Told how the run ended, it frees what it took
    (:class:`~timers.listener.cron_hook.RecurrenceHook`)."""

    def __init__(self, hook: RecurrenceHook) -> None:
        self.hook = hook

    def __call__(self, start: Start) -> Answer:
        if not start.recurring:
            return None
        return self.hook.before_run(start.run, start.record, start.started_ms)

    async def after(self, start: Start, outcome: Outcome) -> None:
        """Once an occurrence's run has ended (``outcome``), before its ending is written;
        nothing for a run stopped before this step (the hook kept nothing for it)."""
        await self.hook.after_run(start.run, start.record, outcome)


class Resolve:
    """The run's task, its policy and whether it goes through the flow gate; a task that
    may not run here is refused, naming this listener and the listeners seen."""

    def __init__(self, resolve: Callable[[str], Callable[..., Any]], name: str) -> None:
        self.resolve, self.name = resolve, name
        """``name``: how a refusal names this listener (its id and groups)."""

    def __call__(self, start: Start) -> Outcome | None:
        if not start.found:
            try:
                start.fn = self.resolve(start.record.task)
            except TaskRefused as exc:
                seen = f"; {start.refusal}" if start.refusal else ""
                return Outcome("refused", "TaskRefused",
                               f"{exc} (refused by {self.name}{seen})" if self.name
                               else f"{exc}{seen}")
        start.policy = policy = policy_of(start.fn)
        start.limited = policy.flow_limited or start.limited
        return None


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


class Quarantined:
    """A suspect run (a lease of it lapsed before: its listener died or stalled) is called
    in a quarantine child (:mod:`timers.listener.quarantine.parent`), and how it ended there
    ends the steps. The child checks the fence right before the task's code, asks the run's
    flow gate once it has loaded the task (a rate's slot is taken when the run starts, not a
    child's loading time before: invariant 13), and its deaths count toward the task's
    ``max_crashes``. A child that found the lease not known to hold started nothing: the run
    is revalidated as a thread's stale start is (not started if taken over, else in a new
    child). A child that got its gate's word past its start window started nothing: the run
    asks its gate once more, from a new child (T29)."""

    def __init__(self, quarantine: Quarantine, flow: FlowGate, fence: Fence) -> None:
        self.quarantine, self.flow, self.fence = quarantine, flow, fence
        self.aside: Callable[[Run], tuple[str, bytes] | None] | None = None
        """Where a child notes that its run's task returned, before it says so (a rerun
        finds the note while this listener is paused, or after it died;
        :meth:`timers.listener.endings.journal.Journal.aside`; None: no journal)."""

    def __call__(self, start: Start) -> Answer:
        return self._called(start) if is_suspect(start.run.reruns) else None

    async def _called(self, start: Start) -> Outcome:
        run, record, policy = start.run, start.record, start.policy
        aside = self.aside(run) if self.aside is not None and not start.recurring else None
        admit = (functools.partial(self.flow.admit, run, record, policy) if start.limited
                 else None)
        late = False
        while True:
            outcome = await self.quarantine.run(run.timer_id, run.token, record.task,
                                                start.fn, record.args, policy, run.reruns,
                                                admit, aside)
            if outcome.kind == "late" and not late:  # a new child asks its gate again (T29)
                late = True
                continue
            if outcome.kind != "stale":
                return outcome
            if not await self.fence.revalidate(run):
                return TAKEN


class FlowCheck:
    """A run with limits asks its flow gate; held back, it waits for its key or rate."""

    def __init__(self, flow: FlowGate) -> None:
        self.flow = flow

    def __call__(self, start: Start) -> Answer:
        return self._admitted(start) if start.limited else None

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


_TAKEN_BACK = Outcome("revoked", "", "asked back before it started: the run before it did not "
                      "start: waits for its key again")
TAKEN = Outcome("taken", "", "another listener took the run over after its lease lapsed")
"""A run whose lease another listener took over: nothing to write, nothing to run."""
