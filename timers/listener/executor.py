"""The executor: runs one claimed timer and says how it ended.

It decodes the record, passes the run through its steps in turn
(:mod:`timers.listener.checks`: a task this listener lacks goes to a peer, its turn after
the run before it on its key, its context, its recurrence's next occurrence, its task, its
group, its lateness, a suspect run's call in quarantine, its flow gate), calls it under its
fence in a thread or on the loop, and tells its recurrence how it ended. What the outcome
means for the timer (its ending, or none for a run whose task was not called) is
:mod:`timers.listener.endings.outcomes`'s to say. Times are Redis times, from the
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
from timers.listener.endings.outcomes import OutcomeEndings, internal_error
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.flow.gate import FlowGate
from timers.listener.flow.turns import Turns
from timers.listener.health.peers import Peers
from timers.listener.leases import Fence
from timers.listener.quarantine.parent import Quarantine
from timers.listener.retrying import RETRYABLE
from timers.listener.tuning.precise import PreciseSleeper
from timers.model.runs import Outcome, Run

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
        self.endings = OutcomeEndings(tracker, turns)
        """How each run's outcome becomes its ending, whether its task was called or not."""
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
            return self.endings.unstarted(run)
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
            outcome = internal_error(exc)
        return self.endings.executed(run, start, outcome, started_ms)

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
