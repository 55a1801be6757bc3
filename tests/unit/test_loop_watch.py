"""The loop watch (:mod:`timers.listener.health.loop_watch`) rests while no run is going, and the
first run to start wakes it: an idle listener's loop is not probed four times a second,
and a task that blocks the loop is still named."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from tests.conftest import wait_until_async
from timers.listener.health import loop_watch
from timers.listener.health.loop_watch import LoopWatch

QUIET_WINDOW = 0.3
"""Seconds a resting watch is watched for a probe (it rests until a run starts)."""


def counted_probes(loop: asyncio.AbstractEventLoop,
                   monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each callback was posted to ``loop`` from another thread (the watch's
    probes), from now on."""
    probes: list[float] = []
    posted = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any) -> Any:
        probes.append(time.monotonic())
        return posted(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    return probes


def test_an_idle_watch_rests_and_the_first_run_wakes_it_to_name_a_blocking_task(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loop_watch, "REST_AFTER", 0.05)

    async def blocking_task() -> None:
        time.sleep(0.6)  # noqa: ASYNC251 (blocks the loop: what the watch is there to name)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        probes = counted_probes(loop, monkeypatch)
        busy = [False]
        watch = LoopWatch(loop, lambda: [(blocking_task.__code__, "blocking.task")],
                          threshold=0.2, busy=lambda: busy[0]).start()
        try:
            await wait_until_async(lambda: watch.resting, 5, message="the watch to rest")
            rested = len(probes)
            await asyncio.sleep(QUIET_WINDOW)
            assert len(probes) == rested, "a resting watch posts no probe"

            busy[0] = True
            watch.work_started()
            await wait_until_async(lambda: len(probes) >= rested + 2, 5,
                                   message="the woken watch to probe again")
            with caplog.at_level(logging.WARNING, logger="timers.listener"):
                await blocking_task()
                await wait_until_async(lambda: "ran again" in caplog.text, 5,
                                       message="the watch to see the loop run again")
            blocked = [r for r in caplog.records if r.getMessage().startswith("event loop blocked")]
            assert len(blocked) == 1, "one warning for one block"
            assert "blocking.task" in caplog.text

            busy[0] = False  # idle again: it rests again, and stays at rest
            await wait_until_async(lambda: watch.resting, 5, message="the watch to rest again")
            rested = len(probes)
            await asyncio.sleep(QUIET_WINDOW)
            assert len(probes) == rested and watch.resting, "a watch idle again rests again"
        finally:
            watch.close()

    asyncio.run(scenario())


def test_a_watch_told_nothing_of_runs_never_rests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``busy`` (a loop watched outside a listener) it probes all the time."""
    monkeypatch.setattr(loop_watch, "REST_AFTER", 0.01)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        probes = counted_probes(loop, monkeypatch)
        watch = LoopWatch(loop, lambda: [], threshold=0.04).start()
        try:
            await wait_until_async(lambda: len(probes) >= 5, 5,
                                   message="probes long past the rest's delay")
            assert not watch.resting
        finally:
            watch.close()

    asyncio.run(scenario())
