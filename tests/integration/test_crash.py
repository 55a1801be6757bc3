"""``kill -9`` of a listener in the middle of a task: the timer runs again elsewhere once
the dead listener's lease lapses, and the second run is counted where a user sees it."""

from __future__ import annotations

import signal

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, Processes, runs, settled, started
from tests.task_pkg.slow import RELEASE
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_timer_runs_again_after_its_listener_is_killed_mid_task(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        start_listener) -> None:
    timers_client.schedule("slow.block", ["victim", 30], in_=0, id="victim")
    victim = processes.timers("listen", "--url", redis_url, "--tasks", TASKS,
                              "--concurrency", "4", "--lease", "1")
    wait_until(lambda: started(r) == ["victim"] or victim.poll() is not None, 20,
               message="the subprocess listener to start the slow task")
    assert victim.poll() is None, processes.output(victim)
    assert timers_client.stats().running == 1

    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    assert runs(r) == [], "the killed run never finished"
    r.set(RELEASE, 1)  # the second run finishes at once

    rescuer = start_listener(lease=1.0)
    wait_until(lambda: runs(r) == [["victim", "released"]] and settled(timers_client), 15,
               message="the timer to run again after the lease lapsed")

    assert started(r) == ["victim", "victim"]
    (report,) = rescuer.reports()
    assert (report.timer_id, report.source, report.attempt) == ("victim", "recovered", 2)
    assert report.outcome.ok
    counters = timers_client.stats().counters
    assert counters.get("reruns") == 1
    assert counters.get("fired") == 1
