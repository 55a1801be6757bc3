"""Replies read late (the event loop blocked past the lease): runs handed over by a batch
of endings, or claimed and then screened by the gate, are not run here if another
listener took them over meanwhile (found by ``bench.faults --keys 20``, blocked-loop)."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest

from tests.unit.sample_tasks import mod
from tests.unit.test_listener_unit import PAST, clean_calls, producer, run_burst, server
from timers import Listener, Timers

__all__ = ["clean_calls", "producer", "server"]  # the fixtures


def test_runs_handed_over_by_an_ending_read_after_their_lease_lapsed_are_not_run(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """The event loop blocked between writing an ending and reading its reply, long enough
    for the leases of the runs it handed over (the key's next timer, and the one next in
    line) to lapse and another listener to take them over: running them here too would
    run them twice (found by ``bench.faults --keys 20``, blocked-loop)."""
    for i in range(3):
        producer.schedule("mod.add", [i], at=PAST, id=f"k{i}", key="k")
    other = fakeredis.FakeRedis(server=server)

    def delay_reply(listener: Listener) -> None:
        finish = listener.endings.scripts.finish

        async def finish_then_stall(**kwargs: Any) -> Any:
            reply = await finish(**kwargs)
            handed = reply[1::3]
            for token in handed:  # what another listener's recovering claim does
                other.zrem("timers|run", token)
                other.hdel("timers|runrec", token)
            if handed:
                await asyncio.sleep(listener.lease)  # read a whole lease late
            return reply

        listener.endings.scripts.finish = finish_then_stall  # type: ignore[method-assign]

    caplog.set_level("WARNING", logger="timers")
    run_burst(server, before=delay_reply, lease=0.2)
    assert mod.CALLS == [("add", (0, 0))]  # k1 and k2 were taken over: not run here
    assert sum("another listener took the run over" in m for m in caplog.messages) == 2


def test_claimed_runs_whose_screen_was_read_after_their_lease_lapsed_are_not_run(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """The claim reply came at once, but the loop blocked while the gate screened its runs
    (before they were started, so before their leases were kept): another listener took
    them over when their leases lapsed."""
    producer.schedule("mod.add", [7], at=PAST, id="screened", key="k")
    other = fakeredis.FakeRedis(server=server)

    def stall_screen(listener: Listener) -> None:
        assert listener.claimer.parker is not None
        listener.claimer.parker.wanted = lambda: True  # type: ignore[method-assign]
        gate = listener.flow.scripts.gate

        async def gate_then_stall(lease_ms: int, runs: Any) -> Any:
            runs = list(runs)
            reply = await gate(lease_ms, runs)
            for run in runs:  # what another listener's recovering claim does
                other.zrem("timers|run", run.token)
                other.hdel("timers|runrec", run.token)
            await asyncio.sleep(listener.lease)
            return reply

        listener.flow.scripts.gate = gate_then_stall  # type: ignore[method-assign]

    caplog.set_level("WARNING", logger="timers")
    run_burst(server, before=stall_screen, lease=0.2)
    assert mod.CALLS == []
    assert any("another listener took the run over" in m for m in caplog.messages)
