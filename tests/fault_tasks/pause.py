"""``pause.listener``: a task that, run outside its listener's process (in a quarantine
child), stops that listener (``SIGSTOP``) and returns: the listener is paused with the
run's outcome unread, its lease running out."""

from __future__ import annotations

import os
import signal


def listener(trace: str, pid_file: str) -> None:
    """Note this run in ``trace``; outside the process whose pid ``pid_file`` holds, stop
    that process first."""
    with open(trace, "a") as out:
        out.write(f"{os.getpid()}\n")
    with open(pid_file) as source:
        pid = int(source.read())
    if os.getpid() != pid:
        os.kill(pid, signal.SIGSTOP)
