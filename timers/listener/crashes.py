"""Poison timers: a run whose listener died counts a crash; past the task's limit the timer
is recorded dead instead of run again.

The claim script re-claims a run whose lease lapsed with ``reruns + 1`` and names the
listener that held it. A task that kills its process (``os._exit``, a segfault in a C
extension) would otherwise run after every lease lapse, forever, and take down every
listener that picks it up, with the unrelated timers those listeners held. Such a suspect
run therefore runs again in a child process (:mod:`timers.listener.quarantine`), which counts its
further crashes without taking the listener down.
"""

from __future__ import annotations

from timers.policy import TaskPolicy
from timers.runs import Outcome, Run


def crash_outcome(run: Run, policy: TaskPolicy) -> Outcome | None:
    """The ending of a run that must not start because its listener died too often, or None."""
    if run.reruns < policy.max_crashes:
        return None
    last = listener_name(run.died_on) or "unknown"
    return died_outcome(run.reruns, f"listener {last} died while running it")


def died_outcome(times: int, last: str) -> Outcome:
    """A timer dead of crashes: "its process died 3 times (last: <how and where>)"."""
    return Outcome("crashed", "ProcessDied", f"its process died {times} times (last: {last})")


def listener_name(listener_id: str) -> str:
    """``host:pid`` of a listener id ``host:pid:<random>``."""
    host, sep, rest = listener_id.partition(":")
    return f"{host}:{rest.partition(':')[0]}" if sep else listener_id
