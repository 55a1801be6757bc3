"""A recycled child whose task does not return: it drains beside its replacement (the fleet
keeps claiming), the supervisor says so once, and it exits 0 when the task returns."""

from __future__ import annotations

import signal

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes
from tests.retry_tasks import RELEASE, done
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]



def test_a_child_stuck_draining_is_named_and_does_not_stop_the_fleet(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    timers_client.schedule("slow.hold", ["stuck", 60], in_=0)
    timers_client.schedule("slow.nap", ["quick", 0.1], in_=0.5)  # its end: the limit
    supervisor = processes.timers_session(
        "listen", "--max-runs-per-child", "1", "--url", redis_url,
        "--tasks", "tests.retry_tasks", "--shutdown-timeout", "1")
    wait_until(lambda: "still finishing its runs" in processes.output(supervisor), 15,
               message="the supervisor to name the stuck child")
    timers_client.schedule("slow.nap", ["later", 0.1], in_=0)  # the replacement runs it
    wait_until(lambda: "later" in [tag for tag, _ in done(r)], 10,
               message="the replacement to run a new timer")
    r.set(RELEASE, 1)
    wait_until(lambda: "recycled: its runs finished" in processes.output(supervisor), 10,
               message="the stuck child to exit once its task returned")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
    output = processes.output(supervisor)
    assert output.count("still finishing its runs") == 1, output
    assert sorted(tag for tag, _ in done(r)) == ["later", "quick", "stuck"], output
    assert "handing back" not in output, output
