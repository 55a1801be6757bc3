"""Tasks for running the listener as a container's PID 1: one leaves a process behind
and crashes its listener; one notes that it ran. Each writes into the directory it is
given."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ORPHAN = ("import os, sys, time; deadline = time.monotonic() + 20\n"
          "while os.getppid() == int(sys.argv[3]) and time.monotonic() < deadline:\n"
          "    time.sleep(0.01)\n"
          "open(sys.argv[1], 'w').write(os.readlink('/proc/self'))\n"
          "time.sleep(float(sys.argv[2]) / 2)")
"""Waits until its listener (pid ``argv[3]``) is gone (it is re-parented), writes its pid
as /proc shows it (the host's, in a pid namespace), then lives on for ``argv[2] / 2``
seconds (that sleep is its lifetime, not a wait)."""


def orphan_then_crash(directory: str, seconds: float) -> None:
    """The first time: start a process that outlives this listener by ``seconds / 2``, then
    kill this listener process (a crash); the process is re-parented to PID 1. Later runs
    (after the lease) only note that they ran."""
    crashed = Path(directory, "crashed")
    if crashed.exists():
        Path(directory, "rerun").write_text("")
        return
    crashed.write_text("")
    subprocess.Popen([sys.executable, "-c", ORPHAN, str(Path(directory, "orphan")),
                      str(seconds), str(os.getpid())])
    os.kill(os.getpid(), signal.SIGKILL)


def note(directory: str, name: str) -> None:
    """Write an empty file ``name``: the run happened."""
    Path(directory, name).write_text("")
