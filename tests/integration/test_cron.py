"""Recurring timers on a real server: several listeners, downtime, overlap, changes, crashes.

Intervals are a few hundred ms, so each test sees a dozen occurrences in a few seconds;
nothing sleeps: the tests wait on conditions with deadlines.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis

from tests.conftest import wait_until
from tests.cron_tasks import RELEASE, RUNS, STARTED
from tests.integration.helpers import ListenerThread, Processes, lateness_line
from timers import Fired, Recurrence, Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TASKS = "tests.cron_tasks"
StartListener = Callable[..., ListenerThread]


def due_of(fired: Fired) -> int:
    return int(fired.timer_id.rpartition("@")[2])


def reports(listeners: list[ListenerThread], name: str) -> list[Fired]:
    """Every run of an occurrence of ``name``, from every listener, by due time."""
    found = [f for lt in listeners for f in lt.reports()
             if f.timer_id.rpartition("@")[0] == name]
    return sorted(found, key=lambda f: (due_of(f), f.started_ms))


def ok_dues(listeners: list[ListenerThread], name: str) -> list[int]:
    return [due_of(f) for f in reports(listeners, name) if f.outcome.ok]


def task_runs(r: redis.Redis) -> list[list[Any]]:
    return [json.loads(item) for item in r.lrange(RUNS, 0, -1)]


def first_due(rec: Recurrence) -> int:
    assert rec.next_due is not None
    return round(rec.next_due.timestamp() * 1000)


def assert_contiguous(dues: list[int], step_ms: int, start: int | None = None) -> None:
    """Each due time once, one step apart, none missing."""
    assert dues, "no runs"
    assert Counter(dues).most_common(1)[0][1] == 1, f"an occurrence ran twice: {dues}"
    if start is not None:
        assert dues[0] == start
    steps = [b - a for a, b in itertools.pairwise(dues)]
    assert steps == [step_ms] * (len(dues) - 1), f"a gap: {dues}"


def stop_all(listeners: list[ListenerThread]) -> None:
    for lt in listeners:
        lt.stop()


# -- exactly once, with several listeners ------------------------------------------------


def test_four_listeners_run_every_occurrence_exactly_once(
    timers_client: Timers, redis_url: str, r: redis.Redis, start_listener: StartListener
) -> None:
    listeners = [start_listener(tasks=TASKS) for _ in range(4)]
    rec = timers_client.every("tick", "jobs.hit", ["tick"], interval=timedelta(milliseconds=250))
    # meanwhile, "web workers" declare the same recurrence again and again
    stop_declaring = threading.Event()
    declared: list[int] = []

    def web_worker() -> None:
        with Timers(redis_url) as t:
            while not stop_declaring.is_set():
                declared.append(t.every("tick", "jobs.hit", ["tick"], interval=0.25).version)

    workers = [threading.Thread(target=web_worker) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: len(ok_dues(listeners, "tick")) >= 16, 15,
                   message="16 occurrences to run")
    finally:
        stop_declaring.set()
        for w in workers:
            w.join(10)
    stop_all(listeners)

    dues = ok_dues(listeners, "tick")
    assert_contiguous(dues, 250, start=first_due(rec))
    everything = reports(listeners, "tick")
    assert [f.outcome.kind for f in everything] == ["ok"] * len(dues)
    assert all(f.attempt == 1 for f in everything)
    assert len(task_runs(r)) == len(dues)
    assert set(declared) == {1} and len(declared) > 10
    [left] = timers_client.list()  # the chain goes on: exactly the next one is pending
    assert left.id == f"tick@{dues[-1] + 250}"
    stats = timers_client.stats()
    assert stats.fired == len(dues)
    assert stats.counters.get("reruns", 0) == 0 and stats.counters.get("skipped", 0) == 0
    per_listener = [sum(1 for f in lt.reports() if f.outcome.ok) for lt in listeners]
    assert sum(per_listener) == len(dues)
    print(lateness_line(f"{len(dues)} occurrences every 250 ms, 4 listeners "
                        f"(runs each: {per_listener}), {len(declared)} re-declarations",
                        everything))


# Catch-up after every listener was down is tested without waiting and without the Redis
# clock: tests/unit/test_cron_hook.py runs the listener's hook with injected start times
# (latest, all and none after downtime), tests/unit/test_cron_plan.py the pure planner.


# -- overlap -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True])
def test_overlap_off_skips_occurrences_while_a_run_goes_on_across_listeners(
    timers_client: Timers, r: redis.Redis, start_listener: StartListener, overlap: bool
) -> None:
    listeners = [start_listener(tasks=TASKS) for _ in range(3)]
    timers_client.every("slow", "jobs.slow", ["slow", 0.5], interval=0.2, overlap=overlap)
    wait_until(lambda: len(task_runs(r)) >= 5, 15, message="5 slow runs")
    timers_client.pause("slow")
    stop_all(listeners)
    spans = sorted((started, ended) for _, started, ended in task_runs(r))
    overlapping = sum(1 for (_, end), (start, _) in itertools.pairwise(spans) if start < end)
    kinds = Counter(f.outcome.kind for f in reports(listeners, "slow"))
    if overlap:
        assert overlapping > 0
        assert kinds["skipped"] <= 1  # at most one claimed as the pause came
        return
    assert overlapping == 0, f"runs overlapped: {spans}"
    assert kinds["skipped"] >= 2 * kinds["ok"] - 2  # 0.5 s runs every 0.2 s
    skipped = [f for f in reports(listeners, "slow") if f.outcome.kind == "skipped"]
    assert any("overlap" in f.outcome.message for f in skipped)
    assert timers_client.stats().counters.get("skipped", 0) == kinds["skipped"]


def test_overlap_off_holds_for_a_recurrence_in_a_group_of_its_own(
    timers_client: Timers, r: redis.Redis, start_listener: StartListener
) -> None:
    """A group's runs are leased in the group's running set (``P|run|<group>``): the
    overlap check looks for the previous run's lease there, so a slow run still blocks."""
    listeners = [start_listener(tasks=TASKS, groups=["nightly"]) for _ in range(2)]
    timers_client.every("grouped", "jobs.slow", ["grouped", 0.5], interval=0.2,
                        overlap=False, group="nightly")
    wait_until(lambda: len(task_runs(r)) >= 4, 15, message="4 slow runs")
    timers_client.pause("grouped")
    stop_all(listeners)
    spans = sorted((started, ended) for _, started, ended in task_runs(r))
    overlapping = [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert not overlapping, f"runs overlapped: {overlapping}"
    found = reports(listeners, "grouped")
    assert {f.group for f in found} == {"nightly"}
    skipped = [f for f in found if f.outcome.kind == "skipped"]
    assert any("overlap is off" in f.outcome.message for f in skipped)


# -- change in place ---------------------------------------------------------------------


def test_changing_args_while_listeners_run_has_no_double_run_and_no_gap(
    timers_client: Timers, r: redis.Redis, start_listener: StartListener
) -> None:
    listeners = [start_listener(tasks=TASKS) for _ in range(2)]
    rec = timers_client.every("change", "jobs.hit", ["v1"], interval=0.25)
    wait_until(lambda: len(task_runs(r)) >= 4, 10, message="4 runs of v1")
    changed = timers_client.every("change", "jobs.hit", ["v2"], interval=0.25)
    assert changed.version == 2
    wait_until(lambda: sum(1 for run in task_runs(r) if run[0] == "v2") >= 4, 10,
               message="4 runs of v2")
    stop_all(listeners)
    dues = ok_dues(listeners, "change")
    assert_contiguous(dues, 250, start=first_due(rec))
    tags = [run[0] for run in task_runs(r)]
    switch = tags.index("v2")
    assert set(tags[:switch]) == {"v1"} and set(tags[switch:]) == {"v2"}
    assert len(tags) == len(dues)


def test_changing_the_schedule_replaces_the_pending_occurrence(
    timers_client: Timers, r: redis.Redis, start_listener: StartListener
) -> None:
    listener = start_listener(tasks=TASKS)
    timers_client.every("change", "jobs.hit", ["slow"], interval=3600)
    changed = timers_client.every("change", "jobs.hit", ["fast"], interval=0.2)
    wait_until(lambda: len(ok_dues([listener], "change")) >= 3, 10, message="3 runs")
    listener.stop()
    assert_contiguous(ok_dues([listener], "change"), 200, start=first_due(changed))
    assert {run[0] for run in task_runs(r)} == {"fast"}


# -- a listener killed in the middle of an occurrence ------------------------------------


def test_a_rerun_after_kill_9_does_not_schedule_the_next_occurrence_twice(
    timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
    start_listener: StartListener,
) -> None:
    victim = processes.timers("listen", "--url", redis_url, "--tasks", TASKS, "--lease", "1")
    # (were it still starting when the first occurrence came due, catch-up would skip it)
    wait_until(timers_client.listeners, 15, message="the victim to start")
    rec = timers_client.every("held", "jobs.hold", ["held"], interval=0.3)
    wait_until(lambda: r.llen(STARTED) >= 2, 15, message="the victim to start two runs")
    victim.kill()
    victim.wait(10)
    r.set(RELEASE, "1")
    survivor = start_listener(tasks=TASKS)
    wait_until(lambda: len(ok_dues([survivor], "held")) >= 8, 15, message="8 runs")
    survivor.stop()
    dues = ok_dues([survivor], "held")
    assert_contiguous(dues, 300, start=first_due(rec))
    reruns = [f for f in reports([survivor], "held") if f.attempt > 1]
    assert len(reruns) >= 2  # what the victim held ran again, once each
    assert timers_client.stats().counters.get("reruns", 0) == len(reruns)
