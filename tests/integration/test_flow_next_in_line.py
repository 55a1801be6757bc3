"""The run next in line on a key slot, on a real server with real listener processes: a
key's next timer is handed to the listener along with the run before it and starts in
its thread the moment that one returns; a higher-priority timer that arrives meanwhile
goes right after it, ahead of the key's other waiting timers; a SIGTERM hands both back,
and the key never runs two at once.

What ran, where and when is what the tasks wrote (tests/task_pkg/flow.py)."""

from __future__ import annotations

import json
import signal

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import KEYS, TASKS, Processes, runs, settled
from tests.integration.test_flow import listeners, wait_listening
from tests.task_pkg import STARTED
from tests.task_pkg.slow import RELEASE
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def started(r: redis.Redis) -> list[list[object]]:
    """``[tag, key, pid, start ms]`` of every run that started, in order."""
    return [json.loads(item) for item in r.lrange(STARTED, 0, -1)]


def first_then_holder_then(t: Timers, r: redis.Redis, tags: list[str]) -> None:
    """Key k: "first" runs 0.3 s, then "holder" (handed over as it ends) runs until
    RELEASE is set, with ``tags`` waiting behind them; returns once the holder runs.
    (Timers due in the same ms leave a queue in id order: each tag sorts after "holder".)"""
    t.schedule("flow.keyed", ["first", "k", 0.3], in_=0, key="k", id="first")
    wait_until(lambda: len(started(r)) == 1, 10, message="the first run to start")
    t.schedule("flow.keyed", ["holder", "k", -1], in_=0, key="k", id="holder")
    t.schedule_many(TimerSpec("flow.keyed", [tag, "k"], id=tag, in_=0, key="k")
                    for tag in tags)
    wait_until(lambda: [s[0] for s in started(r)] == ["first", "holder"], 10,
               message="the holder, handed over as the first run ended")


def test_a_higher_priority_timer_goes_right_after_the_run_already_next_in_line(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    procs = listeners(processes, redis_url, 1, "--tasks", TASKS)
    wait_listening(r, 1, procs, processes)
    lows = [f"low{i}" for i in range(4)]
    with Timers(redis_url) as t:
        first_then_holder_then(t, r, lows)
        # low0 is next in line (handed along with the holder), low1-3 wait in the queue
        wait_until(lambda: r.zcard(KEYS.key_queue("k")) == 3, 10,
                   message="low0 to be next in line")
        t.schedule("flow.keyed", ["high", "k"], in_=0, key="k", id="high", priority=10)
        # high waits at the head of the queue; low0 keeps its turn (it was given the
        # slot when it was handed along with the holder)
        wait_until(lambda: r.zcard(KEYS.key_queue("k")) == 4, 10,
                   message="high to wait in the queue")
        assert r.zrange(KEYS.key_queue("k"), 0, 0) == ["high"]
        r.set(RELEASE, 1)
        wait_until(lambda: len(runs(r)) == 7, 20, message="all seven to run")
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
        assert t.stats().failed == 0
    assert [run[0] for run in runs(r)] == ["first", "holder", "low0", "high", *lows[1:]]


def test_a_sigterm_hands_back_the_run_and_the_one_next_in_line_and_the_key_stays_single(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    first = listeners(processes, redis_url, 1, "--tasks", TASKS, "--shutdown-timeout", "0.2")
    wait_listening(r, 1, first, processes)
    with Timers(redis_url) as t:
        first_then_holder_then(t, r, ["later"])
        second = listeners(processes, redis_url, 1, "--tasks", TASKS)
        wait_listening(r, 2, first + second, processes)
        first[0].send_signal(signal.SIGTERM)
        assert first[0].wait(10) == 0
        r.set(RELEASE, 1)  # the holder, run again by the second listener, may end
        wait_until(lambda: "later" in {run[0] for run in runs(r)}, 20,
                   message="the holder again, then the one after it")
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
    starts = [(tag, pid) for tag, _, pid, _ in started(r)]
    assert [tag for tag, _ in starts] == ["first", "holder", "holder", "later"]
    assert [pid for _, pid in starts[:2]] == [first[0].pid] * 2 and starts[3][1] == second[0].pid
    # the holder, cut by the stop, again: a rerun, so in a quarantine process of the second
    assert starts[2][1] not in (first[0].pid, second[0].pid)
    assert t.stats().counters.get("reruns") == 1
    done = runs(r)
    assert [run[0] for run in done] == ["first", "holder", "later"]
    assert done[2][3] >= done[1][4], "the key ran two at once"


def test_the_run_next_in_line_after_a_timer_held_for_its_rate_waits_behind_it(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """The rate-wait FIFO rule with a real listener: "rated" (key k, two starts a second) is
    handed over holding k's slot as "holder" ends, with "after" next in line; its rate is
    spent (r0 started less than 500 ms before), so its gate holds it: "after" goes back
    into k's queue behind it, and starts only after it (before: at once, ahead of it)."""
    procs = listeners(processes, redis_url, 1, "--tasks", TASKS)
    wait_listening(r, 1, procs, processes)
    with Timers(redis_url) as t:
        t.schedule("flow.keyed_and_paced", ["r0", "other"], in_=0, key="other", id="r0")
        wait_until(lambda: len(started(r)) == 1, 10, message="r0 to start")
        t.schedule("flow.keyed", ["holder", "k", 0.25], in_=0, key="k", id="holder")
        wait_until(lambda: len(started(r)) == 2, 10, message="the holder to start")
        t.schedule("flow.keyed_and_paced", ["rated", "k"], in_=0, key="k", id="k1-rated")
        t.schedule("flow.keyed", ["after", "k"], in_=0, key="k", id="k2-after")
        wait_until(lambda: len(runs(r)) == 4, 20, message="all four to run")
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
        assert t.stats().failed == 0
    on_k = sorted((run for run in runs(r) if run[1] == "k"), key=lambda run: run[3])
    assert [run[0] for run in on_k] == ["holder", "rated", "after"]
    assert max(run[5] for run in on_k) == 1
