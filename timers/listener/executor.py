"""The executor: runs one claimed timer and says how it ended.

It decodes the record, passes the run through its steps in turn
(:mod:`timers.listener.checks`: a task this listener lacks goes to a peer, its turn after
the run before it on its key, its context, its recurrence's next occurrence, its task, its
group, its lateness, a suspect run's call in quarantine, its flow gate), calls it under its
fence in a thread or on the loop, tells its recurrence how it ended, and turns the outcome into
an :class:`Ending` (:mod:`timers.listener.endings.outcomes`): ok, skipped, a retry after a
backoff, or a failure record. A run whose task was not called (held back, taken over,
handed back) writes its own kind of ending, or none. Times are Redis times, from the
listener's :class:`DueTracker`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.listener.calling.runner import Runner, Turn
from timers.listener.checks import (
    TAKEN,
    Check,
    EnterContext,
    FlowCheck,
    FollowTurn,
    GroupCheck,
    Lacking,
    LatenessCheck,
    Quarantined,
    Recurrence,
    Resolve,
    Start,
)
from timers.listener.cron_hook import RecurrenceHook
from timers.listener.endings.ending import Ending, Executed
from timers.listener.endings.outcomes import OutcomeEndings, facts
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.flow.gate import TAKES_BACK_NEXT, FlowGate
from timers.listener.flow.turns import Turns
from timers.listener.health.peers import Peers
from timers.listener.leases import Fence
from timers.listener.quarantine.parent import Quarantine
from timers.listener.retrying import RETRYABLE
from timers.listener.tuning.precise import PreciseSleeper
from timers.model.flow.disagreement import group_of
from timers.model.keys import DEFAULT_GROUP
from timers.model.policy import DEFAULT_POLICY
from timers.model.runs import Fired, Outcome, Run, failure_entry
from timers.model.wire import EndingKind, Option

log = logging.getLogger("timers.listener")


class Executor:
    """Runs claimed timers: :meth:`execute` one run, get its
    :class:`~timers.listener.endings.ending.Executed`."""

    def __init__(self, resolve: Callable[[str], Callable[..., Any]], runner: Runner,
                 quarantine: Quarantine, recurrences: RecurrenceHook, tracker: DueTracker,
                 sleeper: PreciseSleeper, *, flow: FlowGate, name: str, turns: Turns,
                 fence: Fence, peers: Peers,
                 stopping: asyncio.Event) -> None:
        self.runner = runner
        self.tracker, self.sleeper, self.flow = tracker, sleeper, flow
        """``flow``: the gate of runs with limits."""
        self.turns = turns
        """Runs next in line on a key slot and the runs they follow."""
        self.fence = fence
        """Starts a run only while its lease holds (invariant 12): asked right before the
        task's code wherever it runs, and of Redis (:meth:`_revalidated`) after a stall."""
        recurrence = Recurrence(recurrences)
        self.quarantined = Quarantined(quarantine, flow, fence)
        """The step that calls a suspect run in a quarantine child."""
        self.checks: tuple[Check, ...] = (
            Lacking(resolve, peers), FollowTurn(turns, tracker, resolve), EnterContext(),
            recurrence, Resolve(resolve, name), GroupCheck(), LatenessCheck(),
            self.quarantined, FlowCheck(flow))
        """What a run passes before its task is called, in order (:mod:`timers.listener.checks`)."""
        self.recurrence = recurrence
        """The one step told how a run ended (it frees what the run's occurrence took)."""
        self.endings = OutcomeEndings(tracker)
        """How each run's outcome becomes its ending."""
        self.stopping = stopping
        """Set when the listener stops: a run not started by then is handed back unstarted
        (a loaded listener could otherwise start, after the stop, runs it claimed before
        it, and hand them back part-run a moment later: a second run elsewhere)."""
        self.note: Callable[[Run], tuple[str, bytes] | None] | None = None
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
        started_ms = tracker.redis_ms_at(now)
        start: Start | None = None
        try:
            start = Start(run, run.record(), started_ms, self._fence_of(run))
            outcome = await self._attempt(start)
        except MalformedTimerKey as exc:
            outcome = Outcome("malformed", "MalformedTimerKey", str(exc))
        except RETRYABLE as exc:
            # Redis went away around the run (a recurrence step): hand it back to run again
            log.warning("timer %s handed back: %s", run.timer_id, exc)
            return Executed(Ending.release(run.token, follows=run.follows), None)
        except Exception as exc:
            log.exception("internal error around timer %s", run.timer_id)
            outcome = _internal_error(exc)
        if outcome.kind in _UNSTARTED:
            return self._not_started(run, start, outcome)
        return self._ended(run, start, outcome, started_ms)

    def _ended(self, run: Run, start: Start | None, outcome: Outcome,
               started_ms: float) -> Executed:
        """A run whose task was called, or refused, skipped or missed: its ending and its
        report (``start`` None: its record could not be read)."""
        record, policy = (start.record, start.policy) if start else (None, DEFAULT_POLICY)
        try:
            ending = self.endings.ending(run, record, outcome, policy)
        except Exception as exc:
            log.exception("could not decide how timer %s ended", run.timer_id)
            failure_id, failure = failure_entry(
                run, _internal_error(exc), record.task if record else None,
                record.args if record else None, self.tracker.redis_time_ms(),
                options=record.options if record else None)
            ending = Ending.of(run, EndingKind.FAIL, failure_id=failure_id, failure=failure)
        if record is not None:
            task, group, trace = record.task, group_of(record), record.options.get(_TRACE)
        else:
            task, group, trace = None, DEFAULT_GROUP, None
        ended_ms = start.ended_ms if start else None
        report = Fired(run.timer_id, task, run.waited_from_ms,
                       start.started_ms if start else started_ms,
                       ended_ms or self.tracker.redis_now_ms(), run.source, run.attempt,
                       outcome, group, trace)
        return Executed(ending, report, facts(run, ending, report, policy),
                        start is not None and start.limited)

    def _not_started(self, run: Run, start: Start | None, outcome: Outcome) -> Executed:
        """A run whose task was not called, by what the listener does with it: handed back
        (too late for its rate's start window, or asked back before it started), left to
        its flow gate (held: nothing to write), left to the listener that took it over, or
        handed back for a listener that has its task."""
        kind = outcome.kind
        if kind == "late":  # its rate's next run may start: this one did not
            log.info("timer %s handed back unstarted: %s", run.timer_id, outcome.message,
                     extra={"id": run.timer_id, "task": start.record.task if start else None})
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
        if kind == "passed" and start is not None:
            return Executed(self.endings.handed_back(run, start.record, outcome.message), None)
        return Executed(None, None)  # taken: another listener took the run over

    def _unstarted(self, run: Run) -> Executed:
        """A run that did not start, handed back (T17): its run next in line does not
        start either, the hand-back takes it back into its key's queue in its place
        (finish.lua), as the hand-back of this one keeps its place."""
        self.turns.not_started(run.token, True)
        own = self.turns.of(run.token)
        if own is not None and own.taken_back:  # with the run before it, handed back
            return Executed(None, None)
        return Executed(Ending.release(run.token, follows=run.follows), None)

    async def _attempt(self, start: Start) -> Outcome:
        """``start`` through its checks in turn, then its call; the recurrence step, once
        asked, is told how it ended."""
        outcome: Outcome | None = None
        for check in self.checks:
            # (a check answers at once unless it waits or asks Redis: no coroutine per check)
            if (said := check(start)) is not None and (
                    outcome := said if isinstance(said, Outcome) else await said
            ) is not None:
                break
        else:
            outcome = await self._call(start)
        if start.recurring:  # (a run stopped before its recurrence's step left it nothing)
            await self.recurrence.after(start, outcome)
        return outcome

    async def _call(self, start: Start) -> Outcome:
        """Call the task of a run that passed every step, in a thread or on the loop. A
        rate's run that reached its call past its start window asks its gate once more
        (T29)."""
        run, record, fn, policy = start.run, start.record, start.fn, start.policy
        recurring, fence, after = start.recurring, start.fence, start.after
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
            if outcome is TAKEN and own is not None:
                self.runner.let_follower_go(own)  # it waited for this one
        elif outcome.kind == "late":  # past its window: asks its gate once more (T29)
            again = await self.flow.admit(run, record, policy)
            outcome = again.held or await self.runner.call(
                fn, record.args, policy.timeout, own, None, fence, start.limited, note,
                again.start_by)
        if own is not None:
            self._timed_by_thread(start, own)
        return outcome

    async def _revalidated(self, run: Run) -> Outcome | None:
        """After a run's fence found its lease not fresh where it was to start: None when
        Redis says it still holds (start it), else :data:`~timers.listener.checks.TAKEN`."""
        return None if await self.fence.revalidate(run) else TAKEN

    def _fence_of(self, run: Run) -> Callable[[], bool]:
        """The check a thread makes right before it calls ``run``'s function."""
        fence, token = self.fence, run.token
        return lambda: fence.fresh(token)

    def _timed_by_thread(self, start: Start, own: Turn) -> None:
        """A run that may be followed ends when its function returns in its thread (the
        run next in line starts then, before the loop hears of it); one that started in
        the thread of the run before it started then."""
        job = own.job
        if job is not None and job.ended is not None:
            start.ended_ms = self.tracker.redis_ms_at(job.ended)
        if start.after is not None and job is not None and job.started is not None:
            start.started_ms = self.tracker.redis_ms_at(job.started)


_UNSTARTED = frozenset({"late", "held", "revoked", "taken", "passed"})
"""Outcomes of a run whose task was not called and that writes no ending of its own
(:meth:`Executor._not_started`)."""
# Members read once: reading one off its enum class costs many times a dict lookup, and
# the run path reads several per fire
# (figures: bench/FINDINGS.md, "A run's Python in the listener").
_TRACE = Option.TRACE


def _internal_error(exc: Exception) -> Outcome:
    return Outcome("error", type(exc).__qualname__, f"internal error: {exc}")
