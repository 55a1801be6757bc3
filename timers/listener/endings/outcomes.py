"""How a run's outcome becomes its :class:`~timers.listener.endings.ending.Ending`, what the
observer hears of it (:class:`~timers.model.runs.Fired`) and what the history and the
series keep of it (:class:`~timers.model.runs.RunFacts`), all three in one
:class:`~timers.listener.endings.ending.Executed`.

A run whose task was called (or refused, skipped, missed): ok, skipped, moved to its group,
left waiting while releases disagree on its group, a retry after a backoff, or a failure
record. A run whose task was not called, by what the listener does with it: handed back
(T17: too late for its rate's start window, asked back before it started, or its listener
stopping), left to its flow gate (held: nothing to write), left to the listener that took
it over, or handed back for a listener that has its task. Times are Redis times, from the
listener's :class:`~timers.listener.finding.due_tracker.DueTracker` (:class:`Tracker`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from timers.listener.endings.ending import Ending, Executed
from timers.model.encoding import Record
from timers.model.flow.disagreement import RECHECK_MS, group_of, moved, moves_of, waiting
from timers.model.keys import DEFAULT_GROUP
from timers.model.policy import DEFAULT_POLICY, TaskPolicy
from timers.model.runs import Fired, Outcome, Run, RunFacts, failure_entry
from timers.model.wire import EndingKind, Option
from timers.ops.fleet import GIVE_WAY_MS, hand_over_delay_ms, handed_back, handed_over

log = logging.getLogger("timers.listener")

_COUNTED = {EndingKind.OK, EndingKind.SKIP, EndingKind.FAIL, EndingKind.RETRY}
# members read once: reading one off its enum class costs many times a dict lookup, and
# the run path reads several per fire
# (figures: bench/FINDINGS.md, "A run's Python in the listener")
_OK, _SKIP, _RETRY = EndingKind.OK, EndingKind.SKIP, EndingKind.RETRY
_TRACE = Option.TRACE

TAKES_BACK_NEXT = frozenset({"wait", "replaced"})
"""Gate statuses (a held run's :attr:`Outcome.error_type`) under which ``gate.lua`` took the
run next in line after the held run, if any, back into its key's queue (``take_back_next``:
a run next in line follows the run before it only into a start)."""

_UNSTARTED = frozenset({"late", "held", "revoked", "taken", "passed"})
"""Outcomes of a run whose task was not called: handed back, held by its gate, or left to
another listener (:meth:`OutcomeEndings._not_started`)."""


class Tracker(Protocol):
    """The Redis clock as the listener reads it, and how it sweeps for due timers
    (:class:`~timers.listener.finding.due_tracker.DueTracker`)."""

    def redis_time_ms(self) -> int: ...

    def redis_now_ms(self) -> float: ...

    def give_way(self, due_ms: int, ms: float) -> None: ...


class Start(Protocol):
    """What an ending reads of a run's start (:class:`~timers.listener.checks.Start`)."""

    record: Record
    policy: TaskPolicy
    started_ms: float
    """When its task was called (Redis ms)."""
    ended_ms: float | None
    """When its task returned in its thread (Redis ms), or None: when its ending is made."""
    limited: bool
    """It went through a flow gate: its ending frees a slot."""


class Line(Protocol):
    """Runs next in line on a key slot (:class:`~timers.listener.flow.turns.Turns`)."""

    def not_started(self, token: str, taken_back: bool) -> None: ...

    def of(self, token: str) -> _Turn | None: ...


class _Turn(Protocol):
    @property
    def taken_back(self) -> bool: ...


class OutcomeEndings:
    """The endings of one listener's runs, with the warnings it gives once (a task it
    hands back, a group disagreement)."""

    def __init__(self, tracker: Tracker, turns: Line) -> None:
        self.tracker = tracker
        self.turns = turns
        """Runs next in line on a key slot: one after a run not started does not start."""
        self._disagreements: set[tuple[str, str, str]] = set()
        """(task, group it declares, group served) of the group disagreements warned of."""
        self._handed_tasks: set[str] = set()
        """Tasks whose timers this listener handed back for another listener (warned of)."""

    def executed(self, run: Run, start: Start | None, outcome: Outcome,
                 started_ms: float) -> Executed:
        """How ``run`` ended, from its ``outcome`` (``start`` None: its record could not be
        read; ``started_ms``: when the executor began it, Redis ms)."""
        if outcome.kind in _UNSTARTED:
            return self._not_started(run, start, outcome)
        record, policy = (start.record, start.policy) if start else (None, DEFAULT_POLICY)
        try:
            ending = self.ending(run, record, outcome, policy)
        except Exception as exc:
            log.exception("could not decide how timer %s ended", run.timer_id)
            failure_id, failure = failure_entry(
                run, internal_error(exc), record.task if record else None,
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

    def unstarted(self, run: Run) -> Executed:
        """A run that did not start, handed back (T17): its run next in line does not
        start either, the hand-back takes it back into its key's queue in its place
        (finish.lua), as the hand-back of this one keeps its place."""
        self.turns.not_started(run.token, True)
        own = self.turns.of(run.token)
        if own is not None and own.taken_back:  # with the run before it, handed back
            return Executed(None, None)
        return Executed(Ending.release(run.token, follows=run.follows), None)

    def _not_started(self, run: Run, start: Start | None, outcome: Outcome) -> Executed:
        """A run whose task was not called, by what the listener does with it (see the
        module's words)."""
        kind = outcome.kind
        if kind == "late":  # its rate's next run may start: this one did not
            log.info("timer %s handed back unstarted: %s", run.timer_id, outcome.message,
                     extra={"id": run.timer_id, "task": start.record.task if start else None})
            return self.unstarted(run)
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
            return self.unstarted(run)
        if kind == "passed" and start is not None:
            return Executed(self.handed_back(run, start.record, outcome.message), None)
        return Executed(None, None)  # taken: another listener took the run over

    def ending(self, run: Run, record: Record | None, outcome: Outcome,
               policy: TaskPolicy) -> Ending:
        """A run's ending: ok, skipped, a retry after a backoff, or a failure record."""
        if outcome.ok:
            return Ending.of(run, _OK)
        if outcome.kind == "skipped":
            log.info("timer %s skipped: %s", run.timer_id, outcome.message)
            return Ending.of(run, EndingKind.SKIP)
        if outcome.kind == "moved" and record is not None:
            log.info("timer %s (%s) moved %s", run.timer_id, record.task, outcome.message)
            return Ending.move(run, moved(record, policy.group or DEFAULT_GROUP))
        if outcome.kind == "disagreed" and record is not None and policy.group is not None:
            return self._left_waiting(run, record, policy.group, outcome.message)
        now_ms = self.tracker.redis_time_ms()
        first_failure = record.options.get(Option.FIRST_FAILURE) if record else None
        delay = policy.retry_delay(run.attempt) if outcome.kind == "error" else None
        if record is not None and delay is not None:
            options = dict(record.options)
            options.pop(Option.WAITED_FROM, None)
            options.pop(Option.RERUNS, None)  # a retry is an attempt, not a crash rerun
            options.pop(Option.GROUP_DISAGREEMENT, None)
            options.update({Option.ATTEMPTS: str(run.attempt),
                            Option.FIRST_FAILURE: first_failure or str(now_ms),
                            Option.ORIGINAL_DUE: str(run.original_due_ms)})
            retry = Record(record.task, record.args, options).encode(max_args_bytes=1 << 62)
            log.warning("timer %s (%s) failed, attempt %d; retrying in %.1fs: %s: %s",
                        run.timer_id, record.task, run.attempt, delay, outcome.error_type,
                        outcome.message[:300])
            return Ending.retry(run, retry, round(delay * 1000))
        failure_id, failure = failure_entry(
            run, outcome, record.task if record else None, record.args if record else None,
            now_ms, first_failure_ms=int(first_failure) if first_failure else None,
            options=record.options if record else None)
        log.warning("timer %s (%s) failed for good, attempt %d: %s: %s", run.timer_id,
                    record.task if record else "?", run.attempt, outcome.error_type,
                    outcome.message[:300])
        return Ending.of(run, EndingKind.FAIL, failure_id=failure_id, failure=failure)


    def _left_waiting(self, run: Run, record: Record, declared: str, why: str) -> Ending:
        """A timer moved as often as it may: left in its group, due again a while later.
        One warning per task and pair of groups in the life of this listener."""
        seen = (record.task, declared, group_of(record))
        if seen in self._disagreements:
            log.debug("timer %s waits: %s", run.timer_id, why)
        else:
            self._disagreements.add(seen)
            log.warning("%s: timer %s and any like it wait in group %s (moved %d time(s); "
                        "looked at again every %.0f s) until the releases agree on the "
                        "task's @task(group=...)", why, run.timer_id, seen[2],
                        moves_of(record), RECHECK_MS / 1000,
                        extra={"id": run.timer_id, "task": record.task,
                               "declared_group": declared, "served_group": seen[2]})
        due_ms = self.tracker.redis_time_ms() + RECHECK_MS
        return Ending.wait(run, waiting(record, declared, run.waited_from_ms), due_ms)

    def handed_back(self, run: Run, record: Record, runner: str) -> Ending:
        """A timer whose task this listener lacks, handed back uncounted for a live
        listener that has it: due again a little later each time (:mod:`timers.ops.fleet`),
        so the two never pass it to and fro at full speed; and this listener sweeps a
        little after that due time, so the one that has the task claims it first.
        A warning per task."""
        times = handed_over(record) + 1
        delay = hand_over_delay_ms(times)
        if record.task in self._handed_tasks:
            log.debug("timer %s (%s) handed back for %s (%d time(s))", run.timer_id,
                      record.task, runner, times)
        else:
            self._handed_tasks.add(record.task)
            log.warning("timer %s (%s) handed back: this listener cannot run it; live listener "
                        "%s can (timers of that task are handed back to it, each due again "
                        "%d ms later at first, up to %.0f s)", run.timer_id, record.task,
                        runner, delay, hand_over_delay_ms(1 << 10) / 1000,
                        extra={"id": run.timer_id, "task": record.task, "runner": runner})
        due_ms = self.tracker.redis_time_ms() + delay
        self.tracker.give_way(due_ms, GIVE_WAY_MS)
        return Ending.wait(run, handed_back(record, run.waited_from_ms), due_ms)


def internal_error(exc: Exception) -> Outcome:
    """The outcome of a run the listener itself failed around (not the task)."""
    return Outcome("error", type(exc).__qualname__, f"internal error: {exc}")


def facts(run: Run, ending: Ending, report: Fired, policy: TaskPolicy) -> RunFacts | None:
    """What the history and the series keep of a run (None: a run that neither ended its
    timer nor failed, or whose task does not read)."""
    kind = ending.kind
    if kind not in _COUNTED or report.task is None:
        return None
    if kind is _SKIP:
        return RunFacts(run.escaped_id, report.task, int(report.finished_ms), None,
                        report.attempt, None, True, False, False, "", policy.history_ms,
                        policy.history_count)
    failed = kind is not _OK
    outcome = report.outcome
    started = report.started_ms
    return RunFacts(run.escaped_id, report.task, int(report.finished_ms),
                    max(0, int(report.finished_ms - started)), report.attempt,
                    int(started - report.due_ms), kind is not _RETRY, True, failed,
                    f"{outcome.error_type}: {outcome.message}" if failed else "",
                    policy.history_ms, policy.history_count)
