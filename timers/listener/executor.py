"""The executor: runs one claimed timer and says how it ended.

It decodes the record, runs a recurrence's steps around the run, resolves the task, asks
the checks a run passes before its call in turn (:mod:`timers.listener.checks`: its group,
its lateness, its flow gate), calls it under its fence (in a quarantine child when a lease of
it lapsed before: its listener died or stalled; the child counts the deaths it sees
toward ``max_crashes``), and turns the outcome into an :class:`Ending`
(:mod:`timers.listener.endings.outcomes`): ok, skipped, a retry after a backoff, or a
failure record. A run whose task was not called (held back,
taken over, handed back) writes its own kind of ending, or none. Times are Redis times,
from the listener's :class:`DueTracker`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from timers.exceptions import MalformedTimerKey, TaskRefused
from timers.listener.calling import context
from timers.listener.calling.runner import Runner, Turn
from timers.listener.checks import Check, FlowCheck, GroupCheck, LatenessCheck, Start
from timers.listener.cron_hook import RecurrenceHook
from timers.listener.endings.ending import Ending, Executed
from timers.listener.endings.outcomes import OutcomeEndings, facts
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.flow.gate import TAKES_BACK_NEXT, FlowGate
from timers.listener.flow.turns import Turns
from timers.listener.health.peers import Peers
from timers.listener.leases import Fence
from timers.listener.quarantine.parent import Quarantine, is_suspect
from timers.listener.retrying import RETRYABLE
from timers.listener.tuning.precise import PreciseSleeper
from timers.model.encoding import Args, Record
from timers.model.flow.disagreement import group_of
from timers.model.keys import DEFAULT_GROUP
from timers.model.policy import DEFAULT_POLICY, TaskPolicy, policy_of
from timers.model.runs import Fired, Outcome, Run, failure_entry
from timers.model.wire import EndingKind, Option

log = logging.getLogger("timers.listener")


class _Attempt:
    """One run's attempt as the executor learns it (made per run: slots, no dataclass)."""

    __slots__ = ("ended_ms", "limited", "policy", "record", "started_ms")

    def __init__(self, started_ms: float) -> None:
        self.started_ms = started_ms
        self.ended_ms: float | None = None
        self.record: Record | None = None
        self.policy: TaskPolicy = DEFAULT_POLICY
        self.limited = False
        """The run goes through the flow gate: its task limits its runs, or its timer has
        a key (decided once per run; its ending is written promptly, see
        :attr:`Executed.prompt`)."""

    @property
    def task(self) -> str | None:
        return self.record.task if self.record else None

    @property
    def args(self) -> Args:
        return self.record.args if self.record else None


class Executor:
    """Runs claimed timers: :meth:`execute` one run, get its
    :class:`~timers.listener.endings.ending.Executed`."""

    def __init__(self, resolve: Callable[[str], Callable[..., Any]], runner: Runner,
                 quarantine: Quarantine, recurrences: RecurrenceHook, tracker: DueTracker,
                 sleeper: PreciseSleeper, *, flow: FlowGate, name: str, turns: Turns,
                 fence: Fence, peers: Peers,
                 stopping: asyncio.Event) -> None:
        self.resolve, self.runner, self.quarantine = resolve, runner, quarantine
        self.recurrences, self.tracker, self.sleeper = recurrences, tracker, sleeper
        self.flow, self.name = flow, name
        """``flow``: the gate of runs with limits. ``name``: how a refusal names this
        listener (its id and groups)."""
        self.turns = turns
        """Runs next in line on a key slot and the runs they follow."""
        self.fence = fence
        """Starts a run only while its lease holds (invariant 12): asked right before the
        task's code wherever it runs, and of Redis (:meth:`_revalidated`) after a stall."""
        self.checks: tuple[Check, ...] = (GroupCheck(), LatenessCheck(), FlowCheck(flow))
        """What a run passes before its task is called, in order (:mod:`timers.listener.checks`)."""
        self.endings = OutcomeEndings(tracker)
        """How each run's outcome becomes its ending."""
        self.peers = peers
        """Who else can run a task this listener lacks."""
        self.stopping = stopping
        """Set when the listener stops: a run not started by then is handed back unstarted
        (a loaded listener could otherwise start, after the stop, runs it claimed before
        it, and hand them back part-run a moment later: a second run elsewhere)."""
        self.note: Callable[[Run], tuple[str, bytes] | None] | None = None
        self.aside: Callable[[Run], tuple[str, bytes] | None] | None = None
        """Where a quarantine child notes that its run's task returned, and the line
        (:meth:`timers.listener.endings.journal.Journal.aside`; None: no journal)."""
        """The journal line of a run that completed, written by its thread as its function
        returns (:mod:`timers.listener.endings.journal`; None: no journal)."""

    async def execute(self, run: Run) -> Executed:
        """Run ``run`` and say how it ended. A cancellation (shutting down) goes through:
        the listener hands the run back."""
        tracker = self.tracker
        start_at = tracker.monotonic_when_due(run.due_ms)
        now = tracker.clock.monotonic()
        if start_at > now:
            # claimed a few ms ahead (or handed over from a key's queue before its due
            # time): start at the due time, never before it on the Redis clock
            await self.sleeper.sleep_until(start_at)
            now = tracker.clock.monotonic()
        if self.stopping.is_set():
            log.debug("timer %s handed back unstarted: the listener is stopping",
                      run.timer_id)
            return self._unstarted(run)
        attempt = _Attempt(tracker.redis_ms_at(now))
        try:
            outcome = await self._attempt(run, attempt)
        except MalformedTimerKey as exc:
            outcome = Outcome("malformed", "MalformedTimerKey", str(exc))
        except RETRYABLE as exc:
            # Redis went away around the run (a recurrence step): hand it back to run again
            log.warning("timer %s handed back: %s", run.timer_id, exc)
            return Executed(_released(run), None)
        except Exception as exc:
            log.exception("internal error around timer %s", run.timer_id)
            outcome = _internal_error(exc)
        if outcome.kind in _UNSTARTED:
            return self._not_started(run, attempt, outcome)
        try:
            ending = self.endings.ending(run, attempt.record, outcome, attempt.policy)
        except Exception as exc:
            log.exception("could not decide how timer %s ended", run.timer_id)
            failure_id, failure = failure_entry(
                run, _internal_error(exc), attempt.task, attempt.args,
                self.tracker.redis_time_ms(),
                options=attempt.record.options if attempt.record else None)
            ending = Ending.of(run, EndingKind.FAIL, failure_id=failure_id, failure=failure)
        record = attempt.record  # (read once: the report's fields come from it)
        if record is not None:
            task, group, trace = record.task, group_of(record), record.options.get(_TRACE)
        else:
            task, group, trace = None, DEFAULT_GROUP, None
        report = Fired(run.timer_id, task, run.waited_from_ms, attempt.started_ms,
                       attempt.ended_ms or self.tracker.redis_now_ms(), run.source, run.attempt,
                       outcome, group, trace)
        return Executed(ending, report, facts(run, ending, report, attempt.policy),
                        attempt.limited)

    def _not_started(self, run: Run, attempt: _Attempt, outcome: Outcome) -> Executed:
        """A run whose task was not called, by what the listener does with it: handed back
        (too late for its rate's start window, or asked back before it started), left to
        its flow gate (held: nothing to write), left to the listener that took it over, or
        handed back for a listener that has its task."""
        kind = outcome.kind
        if kind == "late":  # its rate's next run may start: this one did not
            log.info("timer %s handed back unstarted: %s", run.timer_id, outcome.message,
                     extra={"id": run.timer_id, "task": attempt.task})
            return self._unstarted(run)
        if kind == "held":
            log.log(logging.WARNING if outcome.error_type == "lost" else logging.DEBUG,
                    "timer %s not started: %s", run.timer_id, outcome.message)
            # a run next in line after it does not start (its gate took it back, or it is
            # handed back)
            self.turns.not_started(run.token, outcome.error_type in TAKES_BACK_NEXT)
            return Executed(None, None)
        if kind == "revoked":  # a run next in line that did not start (the run before it
            # did not, or its listener stalled)
            log.debug("timer %s not started: %s", run.timer_id, outcome.message)
            return self._unstarted(run)
        if kind == "passed" and attempt.record is not None:
            return Executed(self.endings.handed_back(run, attempt.record, outcome.message), None)
        return Executed(None, None)  # taken: another listener took the run over

    def _unstarted(self, run: Run) -> Executed:
        """A run that did not start, handed back (T17): its run next in line does not
        start either, the hand-back takes it back into its key's queue in its place
        (finish.lua), as the hand-back of this one keeps its place."""
        self.turns.not_started(run.token, True)
        own = self.turns.of(run.token)
        if own is not None and own.taken_back:  # with the run before it, handed back
            return Executed(None, None)
        return Executed(_released(run), None)

    async def _attempt(self, run: Run, attempt: _Attempt) -> Outcome:
        record = attempt.record = run.record()
        attempt.limited = _KEY in record.options
        try:
            found: Callable[..., Any] | None = self.resolve(record.task)
        except TaskRefused:
            found = None
        lacking = None if found is not None else await self._lacking(record)
        if lacking is not None and lacking.kind == "passed":
            return lacking  # before a recurrence's steps: the listener that runs it takes them
        recurring = _RECURRENCE in record.options
        after = await self._turn_before(run, attempt, record, recurring) if run.follows else None
        if after is None and run.follows and (own := self.turns.of(run.token)) is not None \
                and own.revoked:  # it waited for the run before it, which did not start
            return _TAKEN_BACK
        fence = self._fence_of(run)  # asked by the thread before the call, and by the task
        context.enter_run(run, record, attempt.started_ms, fence)  # timers.current()
        # a recurrence's next occurrence is scheduled first, whatever becomes of this one
        # (even a task this listener cannot import must not end the chain)
        skip = (await self.recurrences.before_run(run, record, attempt.started_ms)
                if recurring else None)
        try:
            fn = found if found is not None else self.resolve(record.task)  # refused: says why
            attempt.policy = policy = policy_of(fn)
            attempt.limited = limited = policy.flow_limited or attempt.limited
            start = Start(run, record, fn, policy, limited, attempt.started_ms)
            outcome = skip
            if outcome is None:
                for check in self.checks:
                    # (a check answers at once unless it asks Redis: no coroutine per check)
                    if (said := check(start)) is not None and (
                            outcome := said if isinstance(said, Outcome) else await said
                    ) is not None:
                        break
                else:
                    outcome = await self._call(start, attempt, after, fence, recurring)
        except TaskRefused as exc:
            seen = f"; {lacking.message}" if lacking is not None else ""
            outcome = Outcome("refused", "TaskRefused", f"{exc} (refused by {self.name}{seen})"
                              if self.name else f"{exc}{seen}")
        if recurring:
            await self.recurrences.after_run(run, record, outcome)
        return outcome

    async def _call(self, start: Start, attempt: _Attempt, after: Turn | None,
                    fence: Callable[[], bool], recurring: bool) -> Outcome:
        """Call the task of a run that passed every check: in a quarantine child when a
        lease of it lapsed before (gated there), else in a thread or on the loop. A rate's
        run that reached its call past its start window asks its gate once more (T29)."""
        run, record, fn, policy = start.run, start.record, start.fn, start.policy
        if is_suspect(run.reruns):
            aside = self.aside(run) if self.aside is not None and not recurring else None
            return await self._quarantined(run, record, fn, policy, start.limited, aside)
        own = self.turns.of(run.token)
        start_by = start.gated.start_by
        if own is not None and start_by is not None:
            own.solo = True  # it may not start: nothing follows in its thread
        # a recurrence's run has a step after it: its ending is journaled then; a coroutine's
        # as the loop queues it (the note is a thread's, written as its function returns)
        note = (self.note(run) if self.note is not None and not recurring
                and not self.runner.on_loop(fn) else None)
        outcome = await self.runner.call(fn, record.args, policy.timeout, own, after,
                                         fence, start.limited, note, start_by)
        if outcome.kind == "stale":  # the thread found the lease not fresh
            outcome = (await self._revalidated(run)
                       or await self.runner.call(fn, record.args, policy.timeout, own,
                                                 None, fence, start.limited, note, start_by))
            if outcome is _TAKEN and own is not None:
                self.runner.let_follower_go(own)  # it waited for this one
        elif outcome.kind == "late":  # past its window: asks its gate once more (T29)
            again = await self.flow.admit(run, record, policy)
            outcome = again.held or await self.runner.call(
                fn, record.args, policy.timeout, own, None, fence, start.limited, note,
                again.start_by)
        if own is not None:
            self._timed_by_thread(attempt, own, after is not None)
        return outcome

    async def _quarantined(self, run: Run, record: Record, fn: Callable[..., Any],
                           policy: TaskPolicy, limited: bool,
                           aside: tuple[str, bytes] | None = None) -> Outcome:
        """A suspect run in a quarantine child, which checks the lease right before the
        task's code; a child that found it not known to hold started nothing, and the run
        is revalidated as a thread's stale start is: not started if taken over (or, next
        in line, handed back), else in a new child. A run with limits asks its flow gate
        once the child has loaded the task, right before the start: a rate's slot is
        taken when the run starts, not a child's loading time before (invariant 13); a
        child that got the word past its start window started nothing, and the run asks its
        gate once more, in a new child (T29).
        ``aside``: where the child notes that the task returned, before it says so (a
        rerun finds it while this listener is paused, or after it died)."""
        admit = functools.partial(self.flow.admit, run, record, policy) if limited else None
        late = False
        while True:
            outcome = await self.quarantine.run(run.timer_id, run.token, record.task, fn,
                                                record.args, policy, run.reruns, admit,
                                                aside)
            if outcome.kind == "late" and not late:  # a new child asks its gate again (T29)
                late = True
                continue
            if outcome.kind != "stale":
                return outcome
            unfenced = await self._revalidated(run)
            if unfenced is not None:
                return unfenced

    async def _lacking(self, record: Record) -> Outcome | None:
        """None when this listener can run ``record``'s task. Else, when another live
        listener serving its group has the task, ``passed`` (hand it back for that one), or
        ``refused`` whose message names the listeners seen."""
        try:
            self.resolve(record.task)
            return None
        except TaskRefused:
            pass
        runners, view = await self.peers.runners(record.task, group_of(record))
        if runners:
            return Outcome("passed", "", runners[0].describe())
        return Outcome("refused", "TaskRefused", self.peers.refusal(view))

    async def _revalidated(self, run: Run) -> Outcome | None:
        """After a run's fence found its lease not fresh where it was to start: None when
        Redis says it still holds (start it), else :data:`_TAKEN`."""
        return None if await self.fence.revalidate(run) else _TAKEN

    def _fence_of(self, run: Run) -> Callable[[], bool]:
        """The check a thread makes right before it calls ``run``'s function."""
        fence, token = self.fence, run.token
        return lambda: fence.fresh(token)

    def _timed_by_thread(self, attempt: _Attempt, own: Turn, chained: bool) -> None:
        """A run that may be followed ends when its function returns in its thread (the
        run next in line starts then, before the loop hears of it); one that started in
        the thread of the run before it started then."""
        job = own.job
        if job is not None and job.ended is not None:
            attempt.ended_ms = self.tracker.redis_ms_at(job.ended)
        if chained and job is not None and job.started is not None:
            attempt.started_ms = self.tracker.redis_ms_at(job.started)

    async def _turn_before(self, run: Run, attempt: _Attempt, record: Record,
                           recurring: bool) -> Turn | None:
        """For a run next in line on a key slot: the turn of the run before it, when this
        one may start in that run's thread as it ends (:mod:`timers.listener.flow.turns`). Else
        it waits here for that run to end, and its start counts from then: so does a
        rerun, which runs in quarantine (a child process), never in that thread."""
        after = self.turns.before(run)
        if after is None or (not recurring and not is_suspect(run.reruns)
                             and self._may_follow_in_thread(record)):
            return after
        await after.ended.wait()
        attempt.started_ms = self.tracker.redis_now_ms()
        return None

    def _may_follow_in_thread(self, record: Record) -> bool:
        """Whether nothing is to be decided at this run's start but to call it: no rate
        limit to ask the gate about, no max lateness, no move to another group."""
        try:
            policy = policy_of(self.resolve(record.task))
        except Exception:
            return False
        return (policy.rate is None and policy.max_lateness is None
                and Option.MAX_LATENESS not in record.options
                and (policy.group is None or policy.group == group_of(record)))


_TAKEN = Outcome("taken", "", "another listener took the run over after its lease lapsed")
"""A run whose lease another listener took over: nothing to write, nothing to run."""
_TAKEN_BACK = Outcome("revoked", "", "asked back before it started: the run before it did not "
                      "start: waits for its key again")


_UNSTARTED = frozenset({"late", "held", "revoked", "taken", "passed"})
"""Outcomes of a run whose task was not called and that writes no ending of its own
(:meth:`Executor._not_started`)."""
# Members read once: reading one off its enum class costs many times a dict lookup, and
# the run path reads several per fire
# (figures: bench/FINDINGS.md, "A run's Python in the listener").
_RECURRENCE, _KEY, _TRACE = Option.RECURRENCE, Option.KEY, Option.TRACE


def _released(run: Run) -> Ending:
    """``run`` handed back unstarted (T17)."""
    return Ending.release(run.token, follows=run.follows)


def _internal_error(exc: Exception) -> Outcome:
    return Outcome("error", type(exc).__qualname__, f"internal error: {exc}")
