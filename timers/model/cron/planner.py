"""What happens to a claimed occurrence: a pure function of the schedule and the clock."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal, get_args

from timers.model.cron.schedule import MS, Schedule, from_ms, to_ms

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_VALUES: tuple[CatchUp, ...] = get_args(CatchUp)
NONE_GRACE = timedelta(seconds=60)
"""With ``catch_up="none"`` and no ``max_lateness``: how late an occurrence may still start
(like Quartz's misfire threshold); later, it counts as missed and is skipped."""


@dataclass(frozen=True)
class Step:
    """The decision for one claimed occurrence.

    ``run``: run its task (else ``reason`` says why not). ``successor``: due ms of the
    occurrence to schedule next. ``defer``: schedule it only once this run has ended (a
    catch-up run of ``catch_up="all"``, so missed occurrences run one after the other).
    """

    run: bool
    successor: int
    defer: bool = False
    reason: str = ""


def plan(
    schedule: Schedule,
    catch_up: CatchUp,
    max_lateness: timedelta | None,
    due_ms: int,
    now_ms: int,
    *,
    rerun: bool = False,
    lateness_ms: int | None = None,
) -> Step:
    """What to do with the occurrence due at ``due_ms`` when it is claimed at ``now_ms``.

    An occurrence whose successor is due too was *missed*. ``latest`` skips it and
    schedules the latest missed occurrence to run at once (then the chain goes on from
    there); ``all`` runs it and schedules the next one when it ends; ``none`` skips it and
    resumes after now. ``max_lateness`` bounds how late any occurrence may start (with
    ``none`` and no limit: :data:`NONE_GRACE`). A ``rerun`` (after a crash, or a retry of
    a failed task) runs whatever the catch-up policy, within ``max_lateness`` of
    ``lateness_ms`` (its own lateness; default ``now - due``).
    """

    late = now_ms - due_ms if lateness_ms is None else lateness_ms
    limit_ms = None if max_lateness is None else max_lateness // MS
    following = _next_ms(schedule, due_ms)
    if following > now_ms:  # this is the latest occurrence due
        step = Step(True, following)
        limit = NONE_GRACE // MS if limit_ms is None and catch_up == "none" else limit_ms
        if limit is not None and late > limit:
            step = Step(False, following, reason=_too_late(late, limit))
    else:
        step = _missed(schedule, catch_up, limit_ms, following, late, now_ms)
    if rerun:
        run = limit_ms is None or late <= limit_ms
        return replace(step, run=run, defer=step.defer and run,
                       reason="" if run else _too_late(late, limit_ms or 0))
    return step


def _next_ms(schedule: Schedule, after_ms: int) -> int:
    return to_ms(schedule.next_after(from_ms(after_ms)))


def _missed(schedule: Schedule, catch_up: CatchUp, limit_ms: int | None, following: int,
            late: int, now_ms: int) -> Step:
    """The step for an occurrence whose successor (``following``) is due too."""
    if catch_up == "all":
        if limit_ms is not None and late > limit_ms:
            first_in_time = _next_ms(schedule, now_ms - limit_ms - 1)
            return Step(False, first_in_time, reason=_too_late(late, limit_ms))
        return Step(True, following, defer=True)
    if catch_up == "latest":
        latest_dt = schedule.latest_at_or_before(from_ms(now_ms))
        latest = following if latest_dt is None else max(following, to_ms(latest_dt))
        if limit_ms is not None and now_ms - latest > limit_ms:
            return Step(False, _next_ms(schedule, now_ms), reason="missed, and so was every "
                        "later occurrence by more than its max lateness: going on after now")
        return Step(False, latest, reason=f"missed: catch_up=latest runs only the latest "
                    f"missed occurrence, due {from_ms(latest).isoformat()}")
    return Step(False, _next_ms(schedule, now_ms), reason="missed: catch_up=none")


def _too_late(late_ms: int, limit_ms: int) -> str:
    return (f"started {late_ms / 1000:.3f} s after its due time, over its max lateness of "
            f"{limit_ms / 1000:g} s")
