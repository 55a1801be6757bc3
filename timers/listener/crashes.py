"""Poison timers: a run whose listener died counts a crash; past the task's limit the timer
is recorded dead instead of run again.

The claim script re-claims a run whose lease lapsed with ``reruns + 1`` and names the
listener that held it. A task that kills its process (``os._exit``, a segfault in a C
extension) would otherwise run after every lease lapse, forever, and take down every
listener that picks it up, with the unrelated timers those listeners held. Such a suspect
run therefore runs again in a child process (:mod:`timers.listener.quarantine`), which counts its
further crashes without taking the listener down.

What a dead timer's record says is what is known, in two counts: how many times its own
start died in quarantine (a child that sent "started" and then died), and how many times a
listener holding it went away (a lapsed lease: the listener may have died of another run
before this one started, so that is not counted as a start that died). Both count towards
the task's ``max_crashes``.
"""

from __future__ import annotations

from timers.model.policy import TaskPolicy
from timers.model.runs import Outcome, Run


def crash_outcome(run: Run, policy: TaskPolicy) -> Outcome | None:
    """The ending of a run that must not start because its listener died too often, or None."""
    if run.reruns < policy.max_crashes:
        return None
    last = listener_name(run.died_on) or "unknown"
    return Outcome("crashed", "ProcessDied", f"its listener went away {times(run.reruns)} "
                   f"while holding it (last: listener {last})")


def died_outcome(died: int, last: str, lapses: int = 0, before_start: int = 0) -> Outcome:
    """A timer dead of crashes in quarantine: ``died`` starts that died there (the last
    one ``last``, how and where), after ``lapses`` listeners holding it went away, and
    ``before_start`` quarantine processes that died before they started it."""
    parts = [f"its process died {times(died)} in quarantine (last: {last})"]
    if before_start:
        parts.append(f"{before_start} quarantine process(es) died before starting it")
    if lapses:
        parts.append(f"after its listener went away {times(lapses)} while holding it")
    return Outcome("crashed", "ProcessDied", ", ".join(parts))


def times(n: int) -> str:
    """``once``, ``2 times``."""
    return "once" if n == 1 else f"{n} times"


def listener_name(listener_id: str) -> str:
    """``host:pid`` of a listener id ``host:pid:<random>``."""
    host, sep, rest = listener_id.partition(":")
    return f"{host}:{rest.partition(':')[0]}" if sep else listener_id
