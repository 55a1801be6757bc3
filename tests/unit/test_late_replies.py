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


def test_a_run_next_in_line_after_one_taken_over_is_handed_back_to_wait_for_its_key(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """Only the handed run was taken over: the one next in line after it is still this
    listener's, but would start holding no slot while the first runs elsewhere. It is not
    run here: it goes back to wait for its key."""
    for i in range(3):
        producer.schedule("mod.add", [i], at=PAST, id=f"k{i}", key="k")
    other = fakeredis.FakeRedis(server=server)

    def delay_reply(listener: Listener) -> None:
        finish = listener.endings.scripts.finish

        async def finish_then_stall(**kwargs: Any) -> Any:
            reply = await finish(**kwargs)
            items = reply[1:]
            handed = [items[i] for i in range(0, len(items), 3) if items[i + 2] == b"h"]
            for token in handed:  # only the handed run is taken over
                other.zrem("timers|run", token)
                other.hdel("timers|runrec", token)
            if handed:  # past half the lease, not past the lease: k2 is still held
                await asyncio.sleep(listener.lease * 0.7)
            return reply

        listener.endings.scripts.finish = finish_then_stall  # type: ignore[method-assign]

    caplog.set_level("WARNING", logger="timers")
    run_burst(server, before=delay_reply, lease=0.4)
    assert mod.CALLS == [("add", (0, 0))]  # k1 was taken over; k2 did not start
    assert producer.stats().counters.get("handed_back") == 1
    # k2 waits for its key again (k1's slot stays taken until the one running k1 ends)
    waiting = producer.get("k2")
    assert waiting is not None and waiting.key == "k"
