"""A service manager that signals every process of the service at once.

systemd's default ``KillMode=control-group`` sends SIGTERM to the supervisor of ``timers
listen --processes N`` and to each child in the same instant, and the supervisor passes
it on once more: a supervised child must take that second SIGTERM as the same stop (its
running tasks finish) rather than as "exit at once".
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes
from tests.processes import children_of
from tests.retry_tasks import calls, done
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def _signal_all(supervisor: subprocess.Popen[bytes], sig: int) -> None:
    """SIGTERM to the supervisor and each child at once, as ``KillMode=control-group``."""
    for pid in [supervisor.pid, *children_of(supervisor.pid)]:
        os.kill(pid, sig)


def test_sigterm_to_every_process_lets_running_tasks_finish(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        tmp_path: os.PathLike[str]) -> None:
    tags = ["nap-0", "nap-1"]
    timers_client.schedule_many(TimerSpec("slow.nap", [tag, 1.5], in_=0) for tag in tags)
    log_path = os.path.join(tmp_path, "supervisor.log")
    with open(log_path, "wb") as log_file:
        supervisor = subprocess.Popen(
            [TIMERS_COMMAND, "listen", "--processes", "2", "--url", redis_url,
             "--tasks", "tests.retry_tasks", "--shutdown-timeout", "20"],
            cwd=ROOT, env=processes.env(), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: len(calls(r)) == 2 or supervisor.poll() is not None, 15,
                   message="both naps to start")
        assert len(children_of(supervisor.pid)) == 2
        _signal_all(supervisor, signal.SIGTERM)
        assert supervisor.wait(30) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(10)
    with open(log_path, errors="replace") as log_text:
        output = log_text.read()
    assert sorted(tag for tag, _ in done(r)) == tags, f"both naps finished:\n{output}"
    assert "handing back" not in output, output
    stats = timers_client.stats()
    assert (stats.pending, stats.running) == (0, 0)


def test_a_second_signal_to_the_supervisor_still_stops_at_once(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        tmp_path: os.PathLike[str]) -> None:
    """Passed on a second after the first, the escalation is not taken for the same stop:
    the children hand their runs back and exit without waiting for the tasks."""
    timers_client.schedule("slow.hold", ["held", 60], in_=0)
    log_path = os.path.join(tmp_path, "supervisor.log")
    with open(log_path, "wb") as log_file:
        supervisor = subprocess.Popen(
            [TIMERS_COMMAND, "listen", "--processes", "2", "--url", redis_url,
             "--tasks", "tests.retry_tasks", "--shutdown-timeout", "60"],
            cwd=ROOT, env=processes.env(), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: len(calls(r)) == 1 or supervisor.poll() is not None, 15,
                   message="the task to start")
        supervisor.send_signal(signal.SIGTERM)
        wait_until(lambda: "waiting up to 60s" in _read(log_path), 10,
                   message="the child to wait for its task")
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(20) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(10)
    output = _read(log_path)
    assert "handing back 1 unfinished run(s)" in output, output
    assert done(r) == [], "the task was left running, not waited for"
    assert timers_client.stats().pending == 1


def _read(path: str) -> str:
    with open(path, errors="replace") as text:
        return text.read()
