"""A Redis outage under a supervisor: a child started while the server is down (a
replacement, the standby, a restart) waits for it instead of exiting at once, which would
use up the restart budget in seconds and take the whole fleet down. The supervisor itself
waits for it at start up to ``--wait-for-redis`` seconds, a line per try, then exits 1
with one error line."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import Processes, run_cli
from tests.retry_tasks import done
from timers import Timers
from timers.dev.server import EmbeddedServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(config=ROOT / "redis.conf").start()
    yield server
    server.stop()



def test_a_standby_started_during_an_outage_waits_for_redis(
        own_server: EmbeddedServer, processes: Processes) -> None:
    env = {**processes.env(), "TIMERS_TEST_URL": own_server.url}
    supervisor = processes.timers_session(
        "listen", "--max-runs-per-child", "5", "--url", own_server.url,
        "--tasks", "tests.retry_tasks", env=env)
    wait_until(lambda: processes.output(supervisor).count("starting on") == 2, 15,
               message="the child and the standby to be up")
    standby = int(re.findall(r"standby listener started \(pid (\d+)\)",
                             processes.output(supervisor))[-1])
    own_server.stop(keep_data=True)
    os.kill(standby, signal.SIGKILL)  # its replacement starts while Redis is down
    wait_until(lambda: "waiting until it answers" in processes.output(supervisor), 15,
               message="the new standby to wait for Redis")
    assert supervisor.poll() is None, processes.output(supervisor)
    own_server.restart()
    with Timers(own_server.url) as client:
        client.schedule("slow.nap", ["after", 0.05], in_=0)
    r = redis.Redis.from_url(own_server.url)
    wait_until(lambda: [tag for tag, _ in done(r)] == ["after"], 20,
               message="a timer to fire once Redis is back")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
    output = processes.output(supervisor)
    assert "giving up" not in output, output
    assert output.count("restarting") == 1, output  # the standby killed, nothing else


def test_a_supervisor_told_not_to_wait_refuses_a_server_that_does_not_answer() -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    done_ = run_cli("listen", "--processes", "2", "--url", url, "--tasks", "tests.retry_tasks",
                    "--wait-for-redis", "0")
    assert done_.returncode == 1
    assert done_.stderr == (f"error: cannot connect to Redis at 127.0.0.1:{port}: "
                            f"connection refused\n"), done_.stderr


def test_a_supervisor_gives_up_after_its_wait_in_one_error_line() -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    done_ = run_cli("listen", "--processes", "2", "--url", url, "--tasks", "tests.retry_tasks",
                    "--wait-for-redis", "2")
    assert done_.returncode == 1
    *tries, last = done_.stderr.splitlines()
    assert [re.search(r"try (\d+), next in", line)[1] for line in tries] == ["1", "2", "3"], tries
    assert last == (f"error: cannot connect to Redis at 127.0.0.1:{port}: connection refused "
                    f"(waited 2 s: --wait-for-redis)")
