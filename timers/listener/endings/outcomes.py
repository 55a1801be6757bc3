"""How a run's outcome becomes its :class:`~timers.listener.endings.ending.Ending`, and what
the history and the series keep of it (:class:`~timers.model.runs.RunFacts`): ok, skipped,
moved to its group, left waiting while releases disagree on its group, a retry after a
backoff, a failure record, or a timer handed back for a listener that has its task.
Times are Redis times, from the listener's
:class:`~timers.listener.finding.due_tracker.DueTracker` (:class:`Tracker`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from timers.listener.endings.ending import Ending
from timers.model.encoding import Record
from timers.model.flow.disagreement import RECHECK_MS, group_of, moved, moves_of, waiting
from timers.model.keys import DEFAULT_GROUP
from timers.model.policy import TaskPolicy
from timers.model.runs import Fired, Outcome, Run, RunFacts, failure_entry
from timers.model.wire import EndingKind, Option
from timers.ops.fleet import GIVE_WAY_MS, hand_over_delay_ms, handed_back, handed_over

log = logging.getLogger("timers.listener")

_COUNTED = {EndingKind.OK, EndingKind.SKIP, EndingKind.FAIL, EndingKind.RETRY}
# members read once: reading one off its enum class costs many times a dict lookup, and
# the run path reads several per fire
# (figures: bench/FINDINGS.md, "A run's Python in the listener")
_OK, _SKIP, _RETRY = EndingKind.OK, EndingKind.SKIP, EndingKind.RETRY


class Tracker(Protocol):
    """The Redis clock as the listener reads it, and how it sweeps for due timers
    (:class:`~timers.listener.finding.due_tracker.DueTracker`)."""

    def redis_time_ms(self) -> int: ...

    def give_way(self, due_ms: int, ms: float) -> None: ...


class OutcomeEndings:
    """The endings of one listener's runs, with the warnings it gives once (a task it
    hands back, a group disagreement)."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self._disagreements: set[tuple[str, str, str]] = set()
        """(task, group it declares, group served) of the group disagreements warned of."""
        self._handed_tasks: set[str] = set()
        """Tasks whose timers this listener handed back for another listener (warned of)."""

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
