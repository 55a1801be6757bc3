"""FIFO per key (invariant 13), on a real server with real listener processes: a key's
timers start in (priority, due, scheduling) order, at a burst and on a fresh server, whichever
listener claims them. What ran and when is what the tasks wrote (tests/task_pkg/flow.py)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, Processes, settled
from tests.integration.test_flow import listeners, wait_listening
from tests.task_pkg import STARTED
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

DEVICES, COMMANDS = 3, 10
ROUNDS = int(os.environ.get("TIMERS_TEST_FIFO_ROUNDS", "3"))
"""Rounds per listener setup (a soak: ``TIMERS_TEST_FIFO_ROUNDS=10``, 20 in all)."""
EARLY_COUNT = int(os.environ.get("TIMERS_TEST_EARLY_COUNT", "2000"))
"""Keyed timers in the never-early test (a soak: ``TIMERS_TEST_EARLY_COUNT=20000``)."""


def starts_by_device(r: redis.Redis) -> dict[str, list[int]]:
    """The command numbers of each device, in the order they started."""
    order: dict[str, list[int]] = defaultdict(list)
    for item in r.lrange(STARTED, 0, -1):
        tag, key, _, _ = json.loads(item)
        order[key].append(int(tag.split(".")[1]))
    return order


@pytest.mark.parametrize("extra", [(), ("--processes", "2")], ids=["two", "two-by-two"])
def test_a_burst_of_commands_starts_in_order_per_device_on_a_fresh_server(
        r: redis.Redis, redis_url: str, processes: Processes, extra: tuple[str, ...]) -> None:
    procs = listeners(processes, redis_url, 2, "--tasks", TASKS, *extra)
    wait_listening(r, 2, procs, processes)
    out_of_order = []
    with Timers(redis_url) as t:
        for round_ in range(ROUNDS):
            r.delete(STARTED)
            t.schedule_many(
                TimerSpec("flow.device_command", [f"{device}.{n}", 100 * round_ + device],
                          in_=0.3)
                for n in range(COMMANDS) for device in range(DEVICES))
            wait_until(lambda: r.llen(STARTED) == DEVICES * COMMANDS, 30,
                       message="every command to start")
            wait_until(lambda: settled(t), 20, message="nothing pending or running")
            out_of_order += [(key, order) for key, order in starts_by_device(r).items()
                             if order != sorted(order)]
    assert out_of_order == []


def test_keyed_timers_never_start_before_their_due_time(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """A keyed timer claimed a few ms ahead of its due time and held back for its key is
    handed over later with the due time it had: its listener still waits for it (Redis
    clock on both sides: the due time, and the task's own TIME at its start)."""
    from tests.task_pkg.flow import DUE_CHECKS

    procs = listeners(processes, redis_url, 2, "--tasks", TASKS)
    wait_listening(r, 2, procs, processes)
    count = EARLY_COUNT
    spread_ms = max(3_000, count * 3 // 2)  # 2,000 over 3 s; 20,000 over 30 s
    with Timers(redis_url) as t:
        t.schedule_many(TimerSpec("flow.due_checked", [i % 20],
                                  in_=0.5 + (i * 7 % spread_ms) / 1000)
                        for i in range(count))
        wait_until(lambda: r.llen(DUE_CHECKS) == count, 90 + count / 100,
                   message="every timer to run")
        wait_until(lambda: settled(t), 20, message="nothing pending or running")
    checks = [json.loads(item) for item in r.lrange(DUE_CHECKS, 0, -1)]
    early = [(due, start) for due, start in checks if start < due]
    assert early == []
