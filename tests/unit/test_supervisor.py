"""The supervisor of ``timers listen --processes N``: restart budget, exit reasons, giving
up on a child that keeps dying, and passing a signal on to its children.

The children are trivial Python one-liners, not listeners (those are covered by
``tests/integration/test_supervision.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.processes import alive, children_of
from timers.listener.orphans import watch_parent
from timers.listener.supervisor import RestartBudget, Supervisor, exit_reason

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


# -- RestartBudget ----------------------------------------------------------------------


def test_budget_allows_up_to_its_maximum_within_the_window_then_refuses() -> None:
    budget = RestartBudget(max_restarts=3, window=10.0)
    assert [budget.allow(t) for t in (100.0, 101.0, 102.0)] == [True, True, True]
    assert budget.allow(103.0) is False
    assert budget.allow(109.9) is False
    assert budget.allow(110.0) is False, "100.0 is still within 10 s of 110.0"


def test_budget_allows_again_once_old_restarts_leave_the_window() -> None:
    budget = RestartBudget(max_restarts=3, window=10.0)
    for t in (100.0, 101.0, 102.0):
        assert budget.allow(t)
    assert not budget.allow(105.0)
    assert budget.allow(110.5), "the restart at 100.0 left the window"
    assert not budget.allow(110.6), "101.0, 102.0 and 110.5 are within 10 s"
    assert budget.allow(112.1), "101.0 and 102.0 left the window"
    assert budget.allow(112.2)
    assert not budget.allow(112.3)


def test_refused_restarts_do_not_use_up_the_budget() -> None:
    budget = RestartBudget(max_restarts=1, window=5.0)
    assert budget.allow(0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        assert not budget.allow(t)
    assert budget.allow(5.5), "only the allowed restart at 0.0 counts"


def test_default_budget_is_ten_restarts_a_minute() -> None:
    budget = RestartBudget()
    assert all(budget.allow(float(t)) for t in range(10))
    assert not budget.allow(10.0)
    assert budget.allow(60.5)


# -- exit_reason ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (3, "exited with code 3"),
        (255, "exited with code 255"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (-signal.SIGTERM, "killed by SIGTERM"),
        (-signal.SIGSEGV, "killed by SIGSEGV"),
        (-200, "killed by signal 200"),
    ],
)
def test_exit_reason_names_codes_and_signals(code: int, reason: str) -> None:
    assert exit_reason(code) == reason


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
        time.sleep(60)
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
        from timers.listener.supervisor import Supervisor
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


def test_the_parent_watch_stops_a_child_whose_supervisor_is_gone() -> None:
    """The fallback to PR_SET_PDEATHSIG: a changed parent pid (re-parented) stops the child."""
    stopped: list[bool] = []
    parents = iter([42, 42, 1])
    asyncio.run(asyncio.wait_for(
        watch_parent(42, lambda: stopped.append(True), getppid=lambda: next(parents),
                     interval=0.001), 5))
    assert stopped == [True]
