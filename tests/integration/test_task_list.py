"""A listener's task list in ``P|tasks`` (what lets the others hand it timers of its
tasks, :mod:`timers.ops.fleet`) comes back after a flush or a failover lost it: its
heartbeat says the list is gone, and the next one sends it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

import timers.listener.lanes
from tests.conftest import wait_until
from tests.integration.helpers import TASKS, ListenerThread
from timers.model.keys import Keyspace
from timers.ops.fleet import decode_task_set

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

KEYS = Keyspace()


def test_a_task_list_lost_from_the_server_is_sent_again_by_the_next_heartbeats(
        r: redis.Redis, start_listener: Callable[..., ListenerThread],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timers.listener.lanes, "HEARTBEAT_INTERVAL", 0.1)
    start_listener(tasks=TASKS)
    wait_until(lambda: r.hlen(KEYS.task_sets) == 1, 5, message="the task list to be stored")
    (digest, listed), = r.hgetall(KEYS.task_sets).items()
    r.delete(KEYS.task_sets)  # a flush, a failover that lost it
    wait_until(lambda: r.hlen(KEYS.task_sets) == 1, 5,
               message="the heartbeats to store the task list again")
    assert r.hget(KEYS.task_sets, digest) == listed
    assert "record.hit" in decode_task_set(listed)
