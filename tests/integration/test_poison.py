"""A poison timer: its task kills the listener process (``os._exit``, a segfault).

Before: it ran again after every lease lapse, without limit, never recorded failed; under
``--processes 2 --lease 2`` the supervisor gave up after 10 restarts and stranded the
unrelated timers. Now the third crash makes it a dead timer and everything else runs once.
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes, settled
from tests.retry_tasks import calls, done
from timers import Timers, TimerSpec

pytestmark = pytest.mark.integration

ORDINARY = 200


def test_a_poison_timer_dies_after_three_crashes_and_the_rest_run_once(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    timers_client.schedule("poison.die", ["poison", ORDINARY], in_=0, id="poison")
    timers_client.schedule_many(TimerSpec("ok.hit", [f"t{i}"], in_=0, id=f"t{i}")
                                for i in range(ORDINARY))
    supervisor = processes.timers("listen", "--processes", "2", "--lease", "2", "--url",
                                  redis_url, "--tasks", "tests.retry_tasks")

    def poison_dead() -> bool:
        return bool(timers_client.failed()) or supervisor.poll() is not None

    wait_until(poison_dead, 40, message="the poison timer to be recorded dead")
    assert supervisor.poll() is None, processes.output(supervisor)
    (failure,) = timers_client.failed()
    assert failure.timer_id == "poison"
    message = failure.data["message"]
    assert message.startswith("listener died while running it 3 times; last listener "), message
    wait_until(lambda: settled(timers_client), 10, message="nothing pending or running")

    poison_calls = [n for tag, n in calls(r) if tag == "poison"]
    assert poison_calls == [1, 2, 3], "run three times, then recorded dead"
    runs = Counter(tag for tag, _ in done(r))
    assert runs == Counter({f"t{i}": 1 for i in range(ORDINARY)}), "lost 0, runs per timer 1"
    stats = timers_client.stats()
    assert (stats.fired, stats.failed, stats.counters.get("reruns")) == (ORDINARY, 1, 3)

    # the supervisor still runs its two listeners: new timers fire
    timers_client.schedule_many(TimerSpec("ok.hit", [f"after-{i}"], in_=0) for i in range(5))
    wait_until(lambda: len(done(r)) == ORDINARY + 5, 10, message="timers after the poison")
    output = processes.output(supervisor)
    assert output.count("killed by") + output.count("exited with code 1") == 3, output[-3000:]
    assert "giving up" not in output
