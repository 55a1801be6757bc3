"""The run history on a real server through the command line: ``timers get`` on each end
state and on an id past retention, ``timers history`` and its filters, and a listener
process's history options."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, run_cli
from timers import Timers
from timers.model.history import TimerState

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def burst(redis_url: str, *options: str) -> None:
    done = run_cli("listen", "--burst", "--url", redis_url, "--tasks", TASKS, *options,
                   url=redis_url, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_get_says_how_each_timer_ended_and_history_lists_them(
        redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule("record.hit", ["old"], in_=0, id="old")
    burst(redis_url, "--history-count", "3")
    timers_client.schedule("record.hit", ["ok"], in_=0, id="ok")
    timers_client.schedule("fail.boom", ["x"], in_=0, id="dead")
    timers_client.schedule("record.hit", ["off"], in_=3600, id="off")
    assert timers_client.cancel("off")
    burst(redis_url, "--history-count", "3")  # the three newest ends: "old" is past it

    for timer_id, state in (("ok", "completed"), ("dead", "dead"), ("off", "cancelled")):
        got = run_cli("get", timer_id, "--url", redis_url)
        assert got.returncode == 0, got.stderr
        assert f"status:   {state}" in got.stdout, got.stdout
    assert "error:" in run_cli("get", "dead", "--url", redis_url).stdout
    assert timers_client.status("old").state is TimerState.UNKNOWN
    past = run_cli("get", "old", "--url", redis_url)
    assert past.returncode == 1 and "old: unknown" in past.stderr

    listed = run_cli("history", "--url", redis_url).stdout.splitlines()
    assert listed[0].split()[:2] == ["ENDED", "(UTC)"]
    assert {line.split()[3] for line in listed[1:]} == {"ok", "dead", "off"}
    failed = run_cli("history", "--failed", "--since", "1h", "--url", redis_url).stdout
    assert [line.split()[3] for line in failed.splitlines()[1:]] == ["dead"]
    by_task = run_cli("history", "--task", "record.hit", "-n", "1", "--url", redis_url).stdout
    assert len(by_task.splitlines()) == 2


def test_a_listener_process_writes_series_and_zero_keeps_no_history(
        redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule_many([{"task": "record.hit", "args": [str(i)], "in_": 0}
                                 for i in range(5)])
    burst(redis_url, "--history-count", "0")
    assert timers_client.history() == []
    assert wait_until(lambda: sum(m.runs for m in timers_client.series("record.hit", 2)) == 5,
                      5.0)
    assert timers_client.tasks_seen() == ["record.hit"]


def test_a_task_count_keeps_its_newest_ends(redis_url: str, timers_client: Timers) -> None:
    def ended(tags: range) -> None:
        timers_client.schedule_many([{"task": "record.counted", "args": [f"c{i}"], "in_": 0,
                                      "id": f"c{i}"} for i in tags])

    ended(range(7))
    timers_client.schedule("record.hit", ["other"], in_=0, id="other")
    burst(redis_url)
    ended(range(7, 10))  # ten runs of it in all, these three the newest
    burst(redis_url)

    listed = run_cli("history", "--task", "record.counted", "--url", redis_url).stdout
    assert {line.split()[3] for line in listed.splitlines()[1:]} == {"c7", "c8", "c9"}
    past = run_cli("get", "c0", "--url", redis_url)
    assert past.returncode == 1 and "c0: unknown" in past.stderr
    assert "history_count=" in past.stderr, "it names where a task's count is set"
    assert timers_client.status("other").state is TimerState.COMPLETED  # no count of its own
    timers_client.schedule("record.counted", ["off"], in_=3600, id="off")
    assert timers_client.cancel("off")  # a cancel counts too
    kept = {r.id for r in timers_client.history(task="record.counted")}
    assert len(kept) == 3 and "off" in kept
