"""Stops that signal every process of ``timers listen --processes N`` at once.

Ctrl-C in a terminal signals the foreground job's process group, and systemd's default
``KillMode=control-group`` sends SIGTERM to the supervisor and to each child in the same
instant; the supervisor passes the signal on as well. A supervised child must take that
as one stop (its running tasks finish), not as a second signal meaning "exit at once".
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes
from tests.processes import children_of
from tests.retry_tasks import calls, done
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def _sigterm_to_all(supervisor: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the supervisor and each child at once, as ``KillMode=control-group``."""
    for pid in [supervisor.pid, *children_of(supervisor.pid)]:
        os.kill(pid, signal.SIGTERM)


def _ctrl_c(supervisor: subprocess.Popen[bytes]) -> None:
    """SIGINT to the process group the supervisor leads, as a terminal's Ctrl-C."""
    os.killpg(supervisor.pid, signal.SIGINT)


@pytest.mark.parametrize("stop", [_ctrl_c, _sigterm_to_all],
                         ids=["ctrl-c", "sigterm-to-every-process"])
def test_a_stop_that_reaches_every_process_lets_running_tasks_finish(
        stop: Callable[[subprocess.Popen[bytes]], None], timers_client: Timers,
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    tags = ["nap-0", "nap-1"]
    timers_client.schedule_many(TimerSpec("slow.nap", [tag, 1.5], in_=0) for tag in tags)
    supervisor = processes.timers_session(
        "listen", "--processes", "2", "--url", redis_url,
        "--tasks", "tests.retry_tasks", "--shutdown-timeout", "20")
    wait_until(lambda: len(calls(r)) == 2 or supervisor.poll() is not None, 15,
               message="both naps to start")
    assert len(children_of(supervisor.pid)) == 2
    stop(supervisor)
    assert supervisor.wait(30) == 0
    output = processes.output(supervisor)
    assert sorted(tag for tag, _ in done(r)) == tags, f"both naps finished:\n{output}"
    assert "handing back" not in output, output
    stats = timers_client.stats()
    assert (stats.pending, stats.running) == (0, 0)


def test_a_second_signal_to_the_supervisor_still_stops_at_once(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """Passed on a second after the first, the escalation is not taken for the same stop:
    the children hand their runs back and exit without waiting for the tasks."""
    timers_client.schedule("slow.hold", ["held", 60], in_=0)
    supervisor = processes.timers_session(
        "listen", "--processes", "2", "--url", redis_url,
        "--tasks", "tests.retry_tasks", "--shutdown-timeout", "60")
    wait_until(lambda: len(calls(r)) == 1 or supervisor.poll() is not None, 15,
               message="the task to start")
    supervisor.send_signal(signal.SIGTERM)
    wait_until(lambda: "waiting up to 60s" in processes.output(supervisor), 10,
               message="the child to wait for its task")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
    output = processes.output(supervisor)
    assert "handing back 1 unfinished run(s)" in output, output
    assert done(r) == [], "the task was left running, not waited for"
    assert timers_client.stats().pending == 1

