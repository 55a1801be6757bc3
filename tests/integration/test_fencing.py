"""Fencing (invariant 12), on a real server with real listener processes: a listener
paused past its lease (SIGSTOP: a VM freeze, a GC pause, a swap storm) starts nothing it no
longer holds when it resumes. Only the run it was already in may overlap its rerun, and
that overlap is counted.

One device, ``concurrency=1``, 1 s commands, two listeners with ``--lease 2``: the listener
running a command is stopped until the other one has taken the command over, then resumed.
What ran, where and when is what the tasks wrote (tests/task_pkg/flow.py)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, Processes, runs, settled
from tests.integration.test_flow import listeners, wait_listening
from tests.task_pkg import STARTED
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

COMMANDS = 8


def test_a_listener_paused_past_its_lease_starts_nothing_it_no_longer_holds(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    procs = listeners(processes, redis_url, 2, "--tasks", TASKS, "--lease", "2")
    wait_listening(r, 2, procs, processes)
    pids = {p.pid for p in procs}
    with Timers(redis_url) as t:
        t.schedule_many(TimerSpec("flow.device_command", [f"c{i}", 7, 1.0], in_=0.2)
                        for i in range(COMMANDS))
        wait_until(lambda: r.llen(STARTED) >= 2, 20, message="a second command to start")
        tag, _, paused, _ = json.loads(r.lindex(STARTED, -1))
        assert paused in pids
        os.kill(paused, signal.SIGSTOP)
        try:
            # past its lease: the other listener takes the cut command over (a rerun)
            wait_until(lambda: any(json.loads(s)[0] == tag and json.loads(s)[2] != paused
                                   for s in r.lrange(STARTED, 0, -1)), 20,
                       message="the other listener to take the cut command over")
        finally:
            os.kill(paused, signal.SIGCONT)
        wait_until(lambda: {run[0] for run in runs(r)} >= {f"c{i}" for i in range(COMMANDS)},
                   60, message="every command to run")
        wait_until(lambda: settled(t), 20, message="nothing pending or running")
        stats = t.stats()
    starts = [json.loads(s) for s in r.lrange(STARTED, 0, -1)]
    twice = sorted({s[0] for s in starts if sum(1 for o in starts if o[0] == s[0]) > 1})
    # the paused command itself may run again (its rerun, counted); no other one does
    assert twice in ([], [tag]), starts
    assert stats.counters.get("reruns", 0) >= 1
    # the paused run ended after the other listener took it over: counted as such
    assert stats.counters.get("late_finishes", 0) == 1
    # no two commands of the device at once, but for the paused run itself
    done = runs(r)
    for i, (a_tag, _, a_pid, a_start, a_end, _) in enumerate(done):
        for b_tag, _, b_pid, b_start, b_end, _ in done[i + 1:]:
            if (a_tag, a_pid) == (tag, paused) or (b_tag, b_pid) == (tag, paused):
                continue  # the paused run itself: it overlaps whatever ran meanwhile
            overlap = min(a_end, b_end) - max(a_start, b_start)
            assert overlap <= 0, (a_tag, a_pid, b_tag, b_pid, overlap)
