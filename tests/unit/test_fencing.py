"""The fence (invariant 12), without processes: a run starts only while its lease is known
to hold. HeldRuns says so from the renewals it saw (a monotonic clock, patched here); a
thread about to call a function next in line asks it first; the executor revalidates a
stale run in Redis and starts it only if the lease is still the listener's."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.unit.test_next_in_line_runs import Log, until
from timers.listener import leases
from timers.listener.leases import HeldRuns
from timers.listener.runner import Runner, Turn


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(leases.time, "monotonic", clock)
    return clock


def test_a_held_run_is_fresh_until_a_stall_outlasts_its_renewals(clock: Clock) -> None:
    held = HeldRuns(lease=2.0)
    held.hold("7", "t")
    assert held.fresh("7")  # a claim's reply: fresh for half a lease
    clock.now += 0.85
    assert not held.fresh("7")  # no renewal came: not known to hold any more
    held.confirm(["7"], sent=clock.now)
    assert held.fresh("7")
    clock.now += 4.0  # the process was paused past its lease
    assert not held.fresh("7")
    assert not held.fresh("8")  # never held


def test_a_released_or_lost_run_is_never_fresh(clock: Clock) -> None:
    held = HeldRuns(lease=2.0)
    held.hold("7", "t")
    held.hold("8", "u")
    held.release(["7"])
    assert held.drop_lost("8") == "u"
    held.confirm(["7", "8"], sent=clock.now)  # a renewal's reply read after the release
    assert not held.fresh("7") and not held.fresh("8")


def test_a_function_whose_lease_is_stale_in_its_thread_is_not_called() -> None:
    log = Log()
    fresh = threading.Event()

    async def main() -> None:
        runner, turn = Runner(1), Turn()
        first = asyncio.create_task(runner.call(log.task("a", block=True), [], turn=turn))
        await until(lambda: log.order() == ["start a"])
        following = asyncio.create_task(
            runner.call(log.task("b"), [], after=turn, fence=fresh.is_set))
        await until(lambda: turn.job is not None and turn.job.then is not None)  # b chained
        log.gate.set()  # a returns while b's lease is not known to hold (a stall)
        outcomes = await asyncio.gather(first, following)
        assert outcomes[0].ok and outcomes[1].kind == "stale"

    asyncio.run(main())
    assert log.order() == ["start a", "end a"]  # b was never called


def test_a_coroutine_whose_lease_is_stale_is_not_started() -> None:
    started: list[str] = []

    async def task() -> None:
        started.append("ran")

    async def main() -> None:
        outcome = await Runner(1).call(task, [], fence=lambda: False)
        assert outcome.kind == "stale"

    asyncio.run(main())
    assert started == []
