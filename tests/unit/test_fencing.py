"""The fence (invariant 12), without processes: a run starts only while its lease is known
to hold. HeldRuns says so from the renewals it saw (a monotonic clock, patched here); a
thread about to call a function next in line asks it first; the executor revalidates a
stale run in Redis and starts it only if the lease is still the listener's."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import pickle
import threading
import time
from datetime import UTC, datetime

import pytest

import timers
from tests.unit.test_next_in_line_runs import Log, until
from timers.listener import leases, quarantine
from timers.listener.context import TimerContext
from timers.listener.leases import HeldRuns, fresh_in
from timers.listener.runner import Runner, Turn
from timers.model.runs import Outcome


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


def test_a_run_in_another_process_sees_its_lease_as_the_listener_does(clock: Clock) -> None:
    """The cell a quarantine child reads (HeldRuns.share) holds the lease's end as the
    listener knows it: fresh after a claim and each renewal, stale after a stall, and 0
    the moment the run is lost (taken over) or released."""
    held = HeldRuns(lease=2.0)
    held.hold("7", "t")
    cell, other = ctypes.c_double(), ctypes.c_double()
    held.share("7", cell)
    assert fresh_in(cell, held.margin) == held.fresh("7") is True
    clock.now += 0.85  # no renewal came
    assert fresh_in(cell, held.margin) == held.fresh("7") is False
    held.confirm(["7"], sent=clock.now)
    assert fresh_in(cell, held.margin)
    clock.now += 1.5
    held.confirm(["7"], sent=clock.now)  # every renewal moves it on
    assert fresh_in(cell, held.margin)
    assert held.drop_lost("7") == "t"  # a renewal found it taken over
    assert cell.value == 0 and not fresh_in(cell, held.margin)
    held.hold("8", "u")
    held.share("8", other)
    held.release(["8"])
    assert other.value == 0


NOTES: list[tuple[int, bool]] = []
GO = threading.Event()


def ledger_task() -> None:
    """A task that notes its fencing token and still_held() at its start, waits for
    :data:`GO`, and notes still_held() again (in :data:`NOTES`)."""
    timer = timers.current()
    NOTES.append((timer.fencing_token, timer.still_held()))
    GO.wait(10)
    NOTES.append((timer.fencing_token, timer.still_held()))


CONTEXT = TimerContext(id="t", task="fenced.command", attempt=2,
                       due=datetime(2026, 1, 1, tzinfo=UTC),
                       original_due=datetime(2026, 1, 1, tzinfo=UTC), lateness=0.0,
                       fencing_token=41)


def in_child(cell: ctypes.c_double, margin: float) -> tuple[list[str], asyncio.Future[Outcome]]:
    """What a quarantine child does with a run (``quarantine._run_in_child``, without a
    process: the task resolved by reference), the lease shared in ``cell``."""
    said: list[str] = []
    NOTES.clear()
    return said, asyncio.ensure_future(quarantine._run_in_child(
        "tests", None, "t", pickle.dumps(ledger_task), "[]", lambda: said.append("started"),
        CONTEXT, functools.partial(fresh_in, cell, margin)))


def test_a_quarantine_child_starts_no_task_whose_lease_is_stale() -> None:
    """The listener stalled (or the run was taken over) after it handed the rerun to its
    child: the child checks the shared lease right before the task's code and calls
    nothing (before, a rerun that waited for its loading turn started with an older token
    than a rerun started elsewhere meanwhile)."""
    GO.set()

    async def main() -> Outcome:
        _, outcome = in_child(ctypes.c_double(time.monotonic() + 0.1), 0.2)
        return await outcome

    assert asyncio.run(main()).kind == "stale"
    assert NOTES == []


def test_still_held_in_a_quarantine_child_turns_false_when_its_lease_does() -> None:
    """A child started under a fresh lease; its listener is then stopped (no renewal: the
    lease's end passes) or learns the run was taken over (0): still_held() says so in
    the child, as it does in a thread of the listener (before, always True there)."""
    for stale in (0.0, time.monotonic() - 1):
        GO.clear()
        cell = ctypes.c_double(time.monotonic() + 30)

        async def main() -> Outcome:
            said, outcome = in_child(cell, 0.2)  # noqa: B023 (run within the iteration)
            await until(lambda: len(NOTES) == 1)
            assert said == ["started"]
            cell.value = stale  # noqa: B023
            GO.set()
            return await outcome

        assert asyncio.run(main()).ok
        assert NOTES == [(41, True), (41, False)]
