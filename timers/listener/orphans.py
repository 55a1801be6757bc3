"""A supervised listener stops when its supervisor dies, however it died (even ``kill -9``).

The supervisor passes its pid in ``$TIMERS_SUPERVISOR_PID``. The child asks Linux for
SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), which stops it gracefully:
running tasks get the shutdown timeout to finish, the timers still running after it (and
those claimed but not started) are handed back. Noticing the death a second way never
turns that stop into an abort. As a fallback (other
systems, or a parent that died before the request), it also watches its parent pid change.
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


async def watch_parent(
    expected: int,
    on_gone: Callable[[], None],
    getppid: Callable[[], int] = os.getppid,
    interval: float = WATCH_INTERVAL,
) -> None:
    """Call ``on_gone`` once the parent is no longer ``expected`` (it died: we were
    re-parented), checking every ``interval`` seconds. ``on_gone`` must stop the
    listener as the first SIGTERM does (and do nothing more if it is stopping already:
    ``PR_SET_PDEATHSIG`` may have sent that SIGTERM first)."""
    while getppid() == expected:  # noqa: ASYNC110 - nothing to wait on: polling is the point
        await asyncio.sleep(interval)
    log.warning("the supervisor (pid %d) is gone: stopping as on SIGTERM: running tasks get "
                "the shutdown timeout to finish, the timers still running after it are "
                "handed back", expected)
    on_gone()
