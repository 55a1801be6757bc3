"""A Redis restart with persistence on loses no timer, and the listener reconnects by itself.

The test uses a server of its own (not the session's), stops it with its data kept while
timers come due, and starts it again on the same port.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import lateness_line, redis_now, run_counts, settled
from tests.task_pkg import URL_ENV
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer

pytestmark = pytest.mark.integration


def due_of(t: Timers, timer_id: str) -> datetime:
    timer = t.get(timer_id)
    assert timer is not None, f"{timer_id} is not pending"
    return timer.due


@pytest.fixture
def own_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(config=ROOT / "redis.conf").start()
    try:
        monkeypatch.setenv(URL_ENV, server.url)
        yield server
    finally:
        server.stop()


def test_timers_due_while_redis_was_down_fire_after_it_is_back(
        own_server: EmbeddedServer, start_listener) -> None:
    url = own_server.url
    client = redis.Redis.from_url(url, decode_responses=True)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    listener = start_listener(url)
    during = [f"during{i}" for i in range(30)]
    after = [f"after{i}" for i in range(10)]
    with Timers(url) as t:
        t.schedule_many(
            [TimerSpec("record.hit", [tid], in_=0.8 + 0.01 * i, id=tid)
             for i, tid in enumerate(during)]
            + [TimerSpec("record.hit", [tid], in_=2.5 + 0.01 * i, id=tid)
               for i, tid in enumerate(after)]
        )
        last_during = max(due_of(t, tid) for tid in during)  # on the Redis clock
    own_server.stop(keep_data=True)
    assert listener.reports() == [], "the server went down before any timer was due"

    # stay down until every `during` timer is overdue: while the server is away the machine's
    # clock is the only one (the server reads it too; checked on its own clock once back)
    wait_until(lambda: time.time() > last_during.timestamp() + 0.2, 5,
               message="the due times to pass")
    own_server.start()
    assert own_server.url == url, "the server came back on another port"
    assert redis_now(client) > last_during, "a `during` timer was not due yet at the restart"

    with Timers(url) as t:
        wait_until(lambda: len(run_counts(client)) == 40 and settled(t), 20,
                   message="every timer to fire after the restart")
        assert t.stats().counters.get("fired") == 40
    assert run_counts(client) == Counter({tid: 1 for tid in during + after})
    reports = listener.reports()
    assert sorted(f.timer_id for f in reports) == sorted(during + after)
    client.close()
    print(lateness_line("restart: 30 timers due while Redis was down",
                        [f for f in reports if f.timer_id in during]))
    print(lateness_line("restart: 10 timers due after it was back",
                        [f for f in reports if f.timer_id in after]))
