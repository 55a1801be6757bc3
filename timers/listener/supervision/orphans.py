"""A supervised listener stops when its supervisor dies, however it died (even ``kill -9``).

The supervisor passes its pid in ``$TIMERS_SUPERVISOR_PID``. The child asks Linux for
SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``) as its first step
(:func:`tie_to_supervisor`, from ``python -m timers``), so its start-up (the app's import,
a wait for Redis) is covered too, and signals itself if the supervisor died before the
request. Once listening, that SIGTERM stops it gracefully, and its parent watch
(:func:`watch_parent`, also the fallback on other systems) aborts the stop
``ORPHAN_GRACE`` seconds later: the timers still running then (and those claimed but not
started) are handed back, and the process exits, its fork server and quarantine children
with it. Noticing the death a second way never aborts sooner.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("timers.listener")
SUPERVISOR_ENV = "TIMERS_SUPERVISOR_PID"
WATCH_INTERVAL = 1.0
SAME_STOP_WINDOW = 1.0
"""Seconds after a supervised child's first stop signal in which another one is the same
stop, not "exit at once": a service manager that signals every process of the service
(systemd's default ``KillMode=control-group``) reaches the child directly and through its
supervisor within that time. The supervisor passes an escalation on only after it."""
PR_SET_PDEATHSIG = 1
ORPHAN_GRACE = 2.0
"""Seconds a listener whose supervisor died lets its running tasks go on before it hands
them back and exits: nobody is left to stop it later, and a supervisor started again
starts listeners of its own."""


def supervisor_pid() -> int | None:
    """The pid of the supervisor this process was started by, if any."""
    value = os.environ.get(SUPERVISOR_ENV, "")
    return int(value) if value.isdigit() else None


def ask_for_signal_on_parent_death(sig: int = signal.SIGTERM) -> bool:
    """Linux: have the kernel send ``sig`` when the parent exits. False where unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def tie_to_supervisor() -> None:
    """In a supervised child, first thing: SIGTERM when the supervisor dies, and now if it
    died before the request (the kernel sends nothing then). Until the listener handles
    SIGTERM, it ends the process at once: nothing is claimed yet."""
    parent = supervisor_pid()
    if parent is None:
        return
    ask_for_signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


async def watch_parent(
    expected: int,
    on_gone: Callable[[], None],
    abort: Callable[[], None],
    getppid: Callable[[], int] = os.getppid,
    interval: float = WATCH_INTERVAL,
    grace: float = ORPHAN_GRACE,
) -> None:
    """Call ``on_gone`` once the parent is no longer ``expected`` (it died: we were
    re-parented), checking every ``interval`` seconds, then ``abort`` ``grace`` seconds
    later (unless cancelled: the listener stopped). ``on_gone`` must stop the listener as
    the first SIGTERM does (and do nothing more if it is stopping already:
    ``PR_SET_PDEATHSIG`` may have sent that SIGTERM first)."""
    while getppid() == expected:  # noqa: ASYNC110 - nothing to wait on: polling is the point
        await asyncio.sleep(interval)
    log.warning("the supervisor (pid %d) is gone: stopping: running tasks get %g s (at most "
                "the shutdown timeout) to finish, the timers still running after it are "
                "handed back", expected, grace)
    on_gone()
    await asyncio.sleep(grace)
    abort()
