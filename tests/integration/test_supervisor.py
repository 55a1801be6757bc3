"""The supervisor of ``timers listen --processes N`` with real children: giving up on a
child that keeps dying, and passing a signal on to its children.

The children are trivial Python one-liners, not listeners (those are covered by
``tests/integration/test_supervision.py``); no Redis is involved, so these run on one
server only. The budget and exit reasons alone: ``tests/unit/test_supervisor.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.processes import alive, children_of
from timers.listener.supervision.supervisor import RestartBudget, Supervisor

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
"""A child that stays alive until it is signalled (its sleep is the role, not a wait)."""


# -- Supervisor -------------------------------------------------------------------------


def test_supervisor_gives_up_on_a_child_that_keeps_dying(own_signal_handlers: None) -> None:
    supervisor = Supervisor([sys.executable, "-c", "import sys; sys.exit(3)"], 1,
                            shutdown_timeout=5,
                            budget=RestartBudget(max_restarts=3, window=3600))
    assert supervisor.run() == 1
    exits = list(supervisor.last_exits)
    assert len(exits) == 4, exits  # the first run and 3 restarts, then no more
    assert all(e.startswith("pid ") and e.endswith("exited with code 3") for e in exits), exits
    assert len({e.split()[1] for e in exits}) == 4, "each exit is a different process"
    assert supervisor.children == {}


def test_giving_up_stops_the_healthy_children_too(tmp_path: Path,
                                                  own_signal_handlers: None) -> None:
    """Every slot runs the same command: the first child to claim the marker file sleeps,
    every other one exits 3 at once."""
    marker = tmp_path / "first"
    command = [sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        try:
            os.close(os.open({str(marker)!r}, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            sys.exit(3)
        time.sleep(60)  # the healthy child: alive until it is stopped
    """)]
    supervisor = Supervisor(command, 2, shutdown_timeout=5,
                            budget=RestartBudget(max_restarts=2, window=3600))
    assert supervisor.run() == 1
    assert len(supervisor.last_exits) == 3
    assert all(e.endswith("exited with code 3") for e in supervisor.last_exits)
    (sleeper,) = supervisor.children.values()
    assert sleeper.returncode == -signal.SIGTERM, "the healthy child was stopped by SIGTERM"
    assert not alive(sleeper.pid)


def test_supervisor_restarts_a_child_that_was_killed(own_signal_handlers: None) -> None:
    """A child killed by a signal is restarted; its exit reason names the signal."""
    command = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    supervisor = Supervisor(command, 1, budget=RestartBudget(max_restarts=1, window=3600))
    assert supervisor.run() == 1
    assert [e.split(" ", 2)[2] for e in supervisor.last_exits] == ["killed by SIGKILL"] * 2


def _supervisor_process(processes: int) -> subprocess.Popen[bytes]:
    """A supervisor of ``processes`` sleepers in its own Python process (it installs signal
    handlers), whose exit code is what ``run()`` returned."""
    script = textwrap.dedent(f"""
        import logging, sys
        from timers.listener.supervision.supervisor import Supervisor
        logging.basicConfig(level=logging.INFO)
        sys.exit(Supervisor({SLEEPER!r}, {processes}, shutdown_timeout=5).run())
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_stops_the_supervisor_and_its_children(sig: signal.Signals) -> None:
    proc = _supervisor_process(2)
    try:
        def two_children() -> set[int] | bool:
            found = children_of(proc.pid)
            return found if len(found) == 2 else proc.poll() is not None

        kids = wait_until(two_children, 10, message="the supervisor to start 2 children")
        assert proc.poll() is None, proc.communicate()[0].decode()
        assert isinstance(kids, set)
        proc.send_signal(sig)
        output = proc.communicate(timeout=20)[0].decode(errors="replace")
        assert proc.returncode == 0, output
        assert not children_of(proc.pid, zombies=True)
        assert not any(alive(pid) for pid in kids), output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in children_of(proc.pid, zombies=True):
            os.kill(pid, signal.SIGKILL)
