"""How plain functions' results reach the event loop (:class:`timers.listener.calling.thread_pool.
ThreadPool`): each at once while the process is not busy; while it is, the first at once
and the next ones gathered for a moment, up to a quarter of the pool's threads, except a
prompt job's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from timers.listener.calling import thread_pool as pool_module
from timers.listener.calling.thread_pool import Job, ThreadPool

WINDOW = 30.0
"""The gathering window in these tests: far longer than any of them waits."""


@pytest.fixture(autouse=True)
def long_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "DELIVERY_GATHER_S", WINDOW)


async def handed_back(job: Job, seconds: float = 5.0) -> Any:
    return await asyncio.wait_for(asyncio.shield(job.future), seconds)


async def over_in_its_thread(job: Job, seconds: float = 5.0) -> None:
    """Wait until ``job``'s result is queued for the loop (its thread marked it finished
    under the pool's lock, after queueing it), then let a wake on its way arrive."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not job.finished:
        assert asyncio.get_running_loop().time() < deadline, "the job did not finish"
        await asyncio.sleep(0.001)
    for _ in range(20):
        await asyncio.sleep(0.001)


@pytest.mark.parametrize(("threads", "busy"), [(2, False), (8, False), (7, True)],
                         ids=["not busy", "not busy, 8 threads", "busy, 7 threads"])
def test_each_result_reaches_the_loop_at_once_unless_a_busy_pool_of_8_or_more_gathers(
        threads: int, busy: bool) -> None:
    """Not busy, every result is handed over as it comes; a pool of fewer than 8 threads
    never gathers, busy or not (each result waits for the window otherwise)."""
    async def scenario() -> None:
        pool = ThreadPool(threads, busy=lambda: busy)
        for _ in range(3):
            assert await handed_back(pool.submit(lambda: "ok", [], {})) == "ok"
        pool.shutdown()

    asyncio.run(scenario())


def test_while_busy_the_first_result_comes_at_once_and_the_next_wait_for_the_window(
) -> None:
    async def scenario() -> None:
        pool = ThreadPool(8, busy=lambda: True)  # 2 results waiting wake the loop
        assert await handed_back(pool.submit(lambda: "first", [], {})) == "first"
        gathered = pool.submit(lambda: "ok", [], {})
        await over_in_its_thread(gathered)
        assert not gathered.future.done(), "handed over at once though results gather"
        prompt = pool.submit(lambda: "prompt", [], {}, prompt=True)
        assert await handed_back(prompt) == "prompt"
        assert gathered.future.done(), "the prompt job's wake hands over all that waits"
        assert await handed_back(gathered) == "ok"
        pool.shutdown()

    asyncio.run(scenario())


def test_results_gathered_are_handed_over_when_the_window_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "DELIVERY_GATHER_S", 0.05)
    busy = [True]

    async def scenario() -> None:
        pool = ThreadPool(8, busy=lambda: busy[0])
        await handed_back(pool.submit(lambda: "first", [], {}))
        busy[0] = False
        assert await handed_back(pool.submit(lambda: "next", [], {})) == "next"
        # the window ended with a result to hand over; the process is not busy now: the
        # one after that wakes the loop itself (the 30 s window would hold it otherwise)
        monkeypatch.setattr(pool_module, "DELIVERY_GATHER_S", WINDOW)
        assert await handed_back(pool.submit(lambda: "third", [], {})) == "third"
        pool.shutdown()

    asyncio.run(scenario())


def test_while_busy_a_quarter_of_the_threads_worth_of_results_wakes_the_loop() -> None:
    async def scenario() -> None:
        pool = ThreadPool(8, busy=lambda: True)
        await handed_back(pool.submit(lambda: "first", [], {}))
        waiting = pool.submit(lambda: "second", [], {})
        await over_in_its_thread(waiting)
        assert not waiting.future.done()
        assert await handed_back(pool.submit(lambda: "third", [], {})) == "third"
        assert await handed_back(waiting) == "second"
        pool.shutdown()

    asyncio.run(scenario())
