"""A recycled child whose task does not return: it drains beside its replacement (the fleet
keeps claiming), the supervisor says so once, and it exits 0 when the task returns."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes
from tests.retry_tasks import RELEASE, done
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def _read(path: str) -> str:
    with open(path, errors="replace") as text:
        return text.read()


def test_a_child_stuck_draining_is_named_and_does_not_stop_the_fleet(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        tmp_path: os.PathLike[str]) -> None:
    timers_client.schedule("slow.hold", ["stuck", 60], in_=0)
    timers_client.schedule("slow.nap", ["quick", 0.1], in_=0.5)  # its end: the limit
    log_path = os.path.join(tmp_path, "supervisor.log")
    with open(log_path, "wb") as log_file:
        supervisor = subprocess.Popen(
            [TIMERS_COMMAND, "listen", "--max-runs-per-child", "1", "--url", redis_url,
             "--tasks", "tests.retry_tasks", "--shutdown-timeout", "1"],
            cwd=ROOT, env=processes.env(), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "still finishing its runs" in _read(log_path), 15,
                   message="the supervisor to name the stuck child")
        timers_client.schedule("slow.nap", ["later", 0.1], in_=0)  # the replacement runs it
        wait_until(lambda: "later" in [tag for tag, _ in done(r)], 10,
                   message="the replacement to run a new timer")
        r.set(RELEASE, 1)
        wait_until(lambda: "recycled: its runs finished" in _read(log_path), 10,
                   message="the stuck child to exit once its task returned")
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(20) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(10)
    output = _read(log_path)
    assert output.count("still finishing its runs") == 1, output
    assert sorted(tag for tag, _ in done(r)) == ["later", "quick", "stuck"], output
    assert "handing back" not in output, output
