"""A claim in a backlog of a busy listener waits a moment for several slots
(:mod:`timers.listener.finding.claimer`): when the process is busy, and only as long as slots
keep freeing."""

from __future__ import annotations

import asyncio
import time

from timers.listener.finding.claimer import BUSY_WINDOW, CpuGauge, wait_for_slots


def test_the_gauge_says_busy_when_the_process_used_most_of_a_core() -> None:
    clock, cpu = [100.0], [5.0]
    gauge = CpuGauge(cpu=lambda: cpu[0], monotonic=lambda: clock[0])
    assert not gauge.busy(), "nothing known yet"
    clock[0] += 1.1 * BUSY_WINDOW
    cpu[0] += 1.0 * BUSY_WINDOW
    assert gauge.busy()
    clock[0] += BUSY_WINDOW / 2
    assert gauge.busy(), "read again only once a window has passed"
    clock[0] += BUSY_WINDOW
    cpu[0] += 0.3 * BUSY_WINDOW  # the tasks wait: the CPU is not what holds the runs
    assert not gauge.busy()


def test_a_claim_waits_for_the_slots_it_gathers_and_no_longer() -> None:
    async def scenario() -> tuple[int, float]:
        free, freed, stopping = [1], asyncio.Event(), asyncio.Event()

        async def runs_ending() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
                free[0] += 1
                freed.set()

        ending = asyncio.create_task(runs_ending())
        start = time.monotonic()
        await wait_for_slots(lambda: free[0], 4, freed, stopping, time.monotonic, most=30)
        await ending
        return free[0], time.monotonic() - start

    free, took = asyncio.run(scenario())
    assert free == 4
    assert took < 10, "it returned as the fourth slot freed, not at its limit"


def test_a_claim_goes_with_what_is_free_when_slots_stop_freeing_or_on_stop() -> None:
    async def scenario() -> None:
        freed, stopping = asyncio.Event(), asyncio.Event()
        await asyncio.wait_for(
            wait_for_slots(lambda: 1, 4, freed, stopping, time.monotonic, most=0.01), 10)
        stopping.set()
        await asyncio.wait_for(
            wait_for_slots(lambda: 1, 4, freed, stopping, time.monotonic, most=30), 1)

    asyncio.run(scenario())
