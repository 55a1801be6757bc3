"""Recycling, the child's side: limits, messages on the pipe, draining.

The supervisor's side (fake children: processes) is in
``tests/integration/test_supervisor_recycling.py``; the listeners themselves in
``tests/integration/test_recycling.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest

from tests.conftest import wait_until_async
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import mod
from timers import Listener, Timers, TimerSpec
from timers.cli import app
from timers.cli.errors import run_app
from timers.exceptions import MemoryLimitTooLow
from timers.listener import RecycleLimits
from timers.listener.supervision import recycling
from timers.listener.supervision.recycling import Recycler
from timers.listener.supervision.supervisor import ListenOptions

QUIET = 0.1
"""Seconds in which a drain that must go on is given the chance to end wrongly."""

# -- the child's side ---------------------------------------------------------------------


def test_limits_name_what_was_reached() -> None:
    limits = RecycleLimits(max_runs=500, max_memory_mb=100)
    assert limits.reached(499, rss=lambda: 10_000_000) is None
    assert limits.reached(500, rss=lambda: 10_000_000) == "500 runs"
    assert limits.reached(3, rss=lambda: 120_000_000) == "120 MB of memory (limit 100 MB)"
    assert not RecycleLimits().enabled
    with pytest.raises(ValueError, match="--max-runs-per-child must be at least 1"):
        RecycleLimits(max_runs=0)


def test_a_child_asks_once_and_announces_that_it_claims_once() -> None:
    read_end, write_end = os.pipe()
    stopped: list[bool] = []
    try:
        recycler = Recycler(RecycleLimits(max_runs=2), lambda: stopped.append(True),
                            fd=write_end)
        recycler.published()
        recycler.published()
        for runs in (1, 2, 3, 4):
            recycler.after_run(runs)
        assert os.read(read_end, 4096).decode() == "claiming\nrecycle 2 runs\n"
        assert stopped == [], "it claims until the supervisor says its replacement does"
        assert recycler.heartbeat_info(stopping=False) == {"state": "claiming",
                                                           "recycling": "2 runs"}
    finally:
        os.close(read_end)
        os.close(write_end)


def test_without_a_supervisor_a_child_at_its_limit_stops_claiming_at_once() -> None:
    stopped: list[bool] = []
    recycler = Recycler(RecycleLimits(max_runs=1), lambda: stopped.append(True), fd=None)
    recycler.after_run(1)
    assert stopped == [True] and recycler.draining


def test_the_limits_reach_the_children_command_line() -> None:
    options = ListenOptions(max_runs_per_child=500, max_memory_per_child=256.0)
    command = options.child_command()
    assert command[command.index("--max-runs-per-child") + 1] == "500"
    assert command[command.index("--max-memory-per-child") + 1] == "256.0"
    assert options.recycles and not ListenOptions().recycles


def test_a_memory_limit_below_the_memory_at_start_is_refused_in_one_line() -> None:
    recycler = Recycler(RecycleLimits(max_memory_mb=1), lambda: None, fd=None)

    async def start() -> None:
        recycler.start(asyncio.get_running_loop())

    with pytest.raises(MemoryLimitTooLow, match=r"^--max-memory-per-child 1 MB is below this "
                                                r"listener's memory at start \(\d+ MB"):
        asyncio.run(start())


def test_draining_waits_for_every_run_unless_a_stop_signal_comes() -> None:
    async def scenario() -> tuple[bool, bool, list[str]]:
        published: list[str] = []
        recycler = Recycler(RecycleLimits(max_runs=1), lambda: None, fd=None)
        recycler.after_run(1)  # no supervisor: drains at once

        async def publish() -> None:
            published.append(recycler.state(stopping=True))

        quick_ends = asyncio.Event()
        quick = asyncio.create_task(quick_ends.wait())  # a run, ended below
        endless = asyncio.create_task(asyncio.Event().wait())  # a run that never ends
        waiting = asyncio.create_task(recycler.wait_for_runs([quick, endless], publish))
        await wait_until_async(lambda: published, message="the recycler to say it drains")
        quick_ends.set()
        await quick
        await asyncio.sleep(QUIET)  # a chance to stop waiting wrongly, once a run ended
        still_waiting = not waiting.done()  # no shutdown timeout: the endless run goes on
        recycler.hurry.set()  # SIGTERM: the ordinary shutdown takes over
        await asyncio.wait_for(waiting, 5)
        endless.cancel()
        return still_waiting, quick.done(), published

    still_waiting, quick_done, published = asyncio.run(scenario())
    assert still_waiting and quick_done
    assert published == ["draining"], "the heartbeat says it drains"


def test_the_command_refuses_a_memory_limit_below_a_listeners_size_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before starting any child (each would refuse, and be restarted until the budget
    ran out); and a run limit of 0 is a usage error."""
    code = run_app(app, ["listen", "--max-memory-per-child", "5", "--tasks", "tests.task_pkg"])
    err = capsys.readouterr().err
    assert code == 1
    assert re.fullmatch(r"error: --max-memory-per-child 5 MB is below this listener's memory "
                        r"at start \(\d+ MB, tasks loaded\): raise it\n", err), err
    assert run_app(app, ["listen", "--max-runs-per-child", "0"]) == 2
    assert "--max-runs-per-child" in capsys.readouterr().err


def test_a_listener_without_a_supervisor_stops_at_its_limit_and_hands_nothing_back() -> None:
    """The library's listener (fakeredis): at its limit it stops claiming, finishes what it
    runs and returns from run() by itself."""
    server = fakeredis.FakeServer()
    producer = Timers(fakeredis.FakeRedis(server=server))
    mod.CALLS.clear()
    producer.schedule_many(TimerSpec("mod.add", [i], in_=0) for i in range(10))

    async def scenario() -> Listener:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                            search_path=str(ROOT), concurrency=1,
                            recycle=RecycleLimits(max_runs=3))
        await asyncio.wait_for(listener.run(), 15)
        return listener

    listener = asyncio.run(scenario())
    assert listener.ended_count == 3 and len(mod.CALLS) == 3
    stats = producer.stats()
    assert (stats.pending, stats.running) == (7, 0), "the rest waits for the next listener"
    assert stats.counters.get("handed_back", 0) == 0


@pytest.mark.parametrize(("platform", "ru_maxrss"), [("linux", 200_000),
                                                     ("darwin", 204_800_000)])
def test_without_proc_the_memory_is_the_peak_in_bytes_on_each_platform(
        monkeypatch: pytest.MonkeyPatch, platform: str, ru_maxrss: int) -> None:
    """Where /proc is missing (macOS) the memory a limit is checked against is the peak
    resident memory, which getrusage gives in kilobytes on Linux and in bytes on macOS."""

    def no_proc(path: str, *args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(path)

    monkeypatch.setattr(recycling, "open", no_proc, raising=False)
    monkeypatch.setattr(recycling, "sys", SimpleNamespace(platform=platform))
    monkeypatch.setattr(recycling, "resource", SimpleNamespace(
        RUSAGE_SELF=0, getrusage=lambda who: SimpleNamespace(ru_maxrss=ru_maxrss)))
    assert recycling.rss_bytes() == 204_800_000  # 195.3 MB either way
