"""Ctrl-C in a terminal signals every process of the foreground job at once.

Under ``timers listen --processes N`` the supervisor passes a stop signal on to its
children; had they received the terminal's SIGINT as well, the second signal would make
them exit at once and hand their running tasks back instead of letting them finish.
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


def test_ctrl_c_on_a_supervisor_lets_running_tasks_finish(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        tmp_path: os.PathLike[str]) -> None:
    tags = ["nap-0", "nap-1"]
    timers_client.schedule_many(TimerSpec("slow.nap", [tag, 1.5], in_=0) for tag in tags)
    log_path = os.path.join(tmp_path, "supervisor.log")
    with open(log_path, "wb") as log_file:
        # a terminal's foreground job: its own process group, as a shell would start it
        supervisor = subprocess.Popen(
            [TIMERS_COMMAND, "listen", "--processes", "2", "--url", redis_url,
             "--tasks", "tests.retry_tasks", "--shutdown-timeout", "20"],
            cwd=ROOT, env=processes.env(), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: len(calls(r)) == 2 or supervisor.poll() is not None, 15,
                   message="both naps to start")
        assert len(children_of(supervisor.pid)) == 2
        os.killpg(supervisor.pid, signal.SIGINT)  # what Ctrl-C does
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
