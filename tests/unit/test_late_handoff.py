"""A reply read late: runs handed over by a batch of endings whose reply came after their
leases lapsed (the event loop blocked) are not run here if another listener took them."""

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
