"""Replies read late (the event loop blocked past the lease): runs handed over by a batch
of endings, or claimed and then screened by the gate, are not run here if another
listener took them over meanwhile (found by ``bench.faults --keys 20``, blocked-loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import run_burst
from tests.unit.sample_tasks import mod
from tests.unit.test_listener_unit import PAST, clean_calls
from timers import Listener, Timers

__all__ = ["clean_calls"]  # the fixture


def take_over(server: fakeredis.FakeServer, tokens: list[Any]) -> None:
    """What another listener's recovering claim does to runs whose leases lapsed."""
    other = fakeredis.FakeRedis(server=server)
    for token in tokens:
        other.zrem("timers|run", token)
        other.hdel("timers|runrec", token)


def three_for_one_key(producer: Timers) -> None:
    """k0 runs first; k1 is handed over as it ends, and k2 comes as next in line."""
    for i in range(3):
        producer.schedule("mod.add", [i], at=PAST, id=f"k{i}", key="k")


def stalled(call: Callable[..., Any], server: fakeredis.FakeServer, seconds: float,
            taken: Callable[[tuple[Any, ...], Any], list[Any]],
            when: Callable[[Any], bool] = lambda reply: True) -> Callable[..., Any]:
    """``call`` (a script call of the listener's) whose reply, ``when`` it is one to
    stall, is read ``seconds`` late, the runs ``taken(args, reply)`` names taken over by
    another listener meanwhile."""

    async def call_then_stall(*args: Any, **kwargs: Any) -> Any:
        reply = await call(*args, **kwargs)
        if when(reply):
            take_over(server, taken(args, reply))
            await asyncio.sleep(seconds)  # the stall itself (the fake link's), not a wait
        return reply

    return call_then_stall


def stall_endings(server: fakeredis.FakeServer, taken: bytes, stall: float
                  ) -> Callable[[Listener], None]:
    """Make a listener read each reply that hands runs over ``stall`` leases late, the
    runs of sources starting with ``taken`` taken over meanwhile."""

    def handed(_: tuple[Any, ...], reply: Any) -> list[Any]:
        items = reply[1:]
        return [items[i] for i in range(0, len(items), 3) if items[i + 2].startswith(taken)]

    def before(listener: Listener) -> None:
        listener.lanes[0].endings.scripts.finish = stalled(  # type: ignore[method-assign]
            listener.lanes[0].endings.scripts.finish, server, listener.lease * stall, handed,
            when=lambda reply: len(reply) > 1)

    return before


def test_runs_handed_over_by_an_ending_read_after_their_lease_lapsed_are_not_run(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """The event loop blocked between writing an ending and reading its reply, long enough
    for the leases of the runs it handed over (the key's next timer, and the one next in
    line) to lapse and another listener to take them over: running them here too would
    run them twice (found by ``bench.faults --keys 20``, blocked-loop)."""
    three_for_one_key(producer)
    caplog.set_level("WARNING", logger="timers")
    run_burst(server, before=stall_endings(server, b"", 1.0), lease=0.2)
    assert mod.CALLS == [("add", (0, 0))]  # k1 and k2 were taken over: not run here
    assert sum("another listener took the run over" in m for m in caplog.messages) == 2


def test_claimed_runs_whose_screen_was_read_after_their_lease_lapsed_are_not_run(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """The claim reply came at once, but the loop blocked while the gate screened its runs
    (before they were started, so before their leases were kept): another listener took
    them over when their leases lapsed."""
    producer.schedule("mod.add", [7], at=PAST, id="screened", key="k")

    def stall_screen(listener: Listener) -> None:
        assert listener.lanes[0].claimer.parker is not None
        listener.lanes[0].claimer.parker.wanted = lambda: True  # type: ignore[method-assign]
        listener.lanes[0].flow.scripts.gate = stalled(  # type: ignore[method-assign]
            listener.lanes[0].flow.scripts.gate, server, listener.lease,
            lambda args, reply: [run.token for run in args[1]])

    caplog.set_level("WARNING", logger="timers")
    run_burst(server, before=stall_screen, lease=0.2)
    assert mod.CALLS == []
    assert any("another listener took the run over" in m for m in caplog.messages)


def test_a_run_next_in_line_after_one_taken_over_is_handed_back_to_wait_for_its_key(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    """Only the handed run was taken over: the one next in line after it is still this
    listener's, but would start holding no slot while the first runs elsewhere. It is not
    run here: it goes back to wait for its key."""
    three_for_one_key(producer)
    # read past half the lease, not past the lease: k2 is still held (a lease of 1 s
    # leaves 0.4 s for a loaded machine's delays; 0.4 s left it 0.12 s)
    run_burst(server, before=stall_endings(server, b"h", 0.6), lease=1.0)
    assert mod.CALLS == [("add", (0, 0))]  # k1 was taken over; k2 did not start
    assert producer.stats().counters.get("handed_back") == 1
    # k2 waits for its key again (k1's slot stays taken until the one running k1 ends)
    waiting = producer.get("k2")
    assert waiting is not None and waiting.key == "k"


def test_a_claim_read_after_its_lease_lapsed_and_was_taken_over_is_not_run(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    """The event loop blocked between the claim and reading its reply, long enough for the
    lease to lapse and another listener to take the run over: running it here too would
    run the timer twice."""
    producer.schedule("mod.add", [1, 2], at=PAST, id="taken-over")

    def delay_reply(listener: Listener) -> None:
        listener.lanes[0].claimer.scripts.claim = stalled(  # type: ignore[method-assign]
            listener.lanes[0].claimer.scripts.claim, server, listener.lease,
            lambda args, reply: reply[3::3])

    caplog.set_level("WARNING", logger="timers")
    run_burst(server, before=delay_reply, lease=0.2)
    assert mod.CALLS == []
    assert any("another listener took the run over" in m for m in caplog.messages)
