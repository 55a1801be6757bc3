"""Concurrent ``AsyncTimers.schedule`` calls (:mod:`timers.producer.coalesce`): a lone call
goes to the wire at once, calls made while one is in flight share a round trip in the order
they were made, and each caller gets its own id, error or cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import fakeredis
import pytest

from timers import AsyncTimers
from timers.exceptions import InvalidArgs
from timers.producer.coalesce import Coalescer

FAR = 3600.0


class Wire:
    """A ``send`` that records each list it is given, and replies only when released."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.fail: set[str] = set()

    async def send(self, batch: list[str]) -> list[str]:
        self.sent.append(list(batch))
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        if self.fail & set(batch):
            raise ConnectionError(f"lost {batch}")
        return [f"id-{p}" for p in batch]

    def release(self) -> None:
        for gate in self.gates:
            if not gate.done():
                gate.set_result(None)


def run(scenario: Callable[[Wire, Coalescer[str]], Awaitable[None]]) -> None:
    async def main() -> None:
        wire = Wire()
        await scenario(wire, Coalescer(wire.send, lambda p: f"id-{p}"))

    asyncio.run(main())


async def turn() -> None:
    """Let every task ready to run take its next step (one turn of the loop)."""
    await asyncio.sleep(0)


async def sent(wire: Wire, count: int) -> None:
    """Turn the loop until ``count`` sends were made (at most 50 turns: no clock)."""
    for _ in range(50):
        if len(wire.sent) >= count:
            return
        await turn()
    raise AssertionError(f"{len(wire.sent)} sends made, {count} awaited: {wire.sent}")


def test_a_lone_call_is_written_in_its_own_first_step() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        call = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()  # the call's first step, and nothing after it
        assert wire.sent == [["a"]], "a lone call waited for a later turn"
        wire.release()
        assert await call == "id-a"

    run(scenario)


def test_calls_made_while_one_is_in_flight_share_one_send_in_their_order() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        first = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()
        rest = [asyncio.ensure_future(coalescer.schedule(p)) for p in "bcd"]
        await sent(wire, 2)
        assert wire.sent == [["a"], ["b", "c", "d"]]
        wire.release()
        assert await asyncio.gather(first, *rest) == ["id-a", "id-b", "id-c", "id-d"]
        later = asyncio.ensure_future(coalescer.schedule("e"))  # nothing in flight again
        await turn()
        assert wire.sent[-1] == ["e"]
        wire.release()
        assert await later == "id-e"

    run(scenario)


def test_the_error_of_a_send_is_its_callers_own_and_fails_no_other_send() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        wire.fail = {"a", "c"}
        lone = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()
        batch = [asyncio.ensure_future(coalescer.schedule(p)) for p in "bc"]
        await sent(wire, 2)
        other = asyncio.ensure_future(coalescer.schedule("d"))  # a later turn's send
        await sent(wire, 3)
        assert wire.sent == [["a"], ["b", "c"], ["d"]]
        wire.release()
        got = await asyncio.gather(lone, *batch, other, return_exceptions=True)
        assert isinstance(got[0], ConnectionError) and got[3] == "id-d"
        assert all(isinstance(e, ConnectionError) for e in got[1:3])
        assert got[1] is not got[2], "callers of one batch share one exception object"

    run(scenario)


def test_a_cancelled_lone_call_leaves_the_next_call_to_go_at_once() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        lone = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()
        lone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lone
        nxt = asyncio.ensure_future(coalescer.schedule("b"))
        await turn()
        assert wire.sent == [["a"], ["b"]], "the next call waited after a cancelled one"
        wire.release()
        assert await nxt == "id-b"

    run(scenario)


def test_a_caller_cancelled_before_its_batch_is_sent_is_not_written() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        lone = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()
        kept = asyncio.ensure_future(coalescer.schedule("b"))
        dropped = asyncio.ensure_future(coalescer.schedule("c"))
        await turn()  # both queued for the end of this turn
        dropped.cancel()
        await sent(wire, 2)
        assert wire.sent == [["a"], ["b"]]
        wire.release()
        assert list(await asyncio.gather(lone, kept)) == ["id-a", "id-b"]
        with pytest.raises(asyncio.CancelledError):
            await dropped

    run(scenario)


def test_drain_waits_for_a_lone_call_in_flight() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        lone = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()
        drained = asyncio.ensure_future(coalescer.drain())
        await turn()
        assert not drained.done(), "drain returned with a call on the wire"
        wire.release()
        await drained
        assert lone.done() and lone.result() == "id-a"

    run(scenario)


def test_async_timers_writes_concurrent_calls_each_with_its_own_args_and_bad_input_alone(
) -> None:
    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        async with AsyncTimers(client) as producer:
            calls = [producer.schedule("a.b", [i], in_=FAR) for i in range(50)]
            calls.insert(7, producer.schedule("a.b", [object()], in_=FAR))  # not JSON
            got = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(got.pop(7), InvalidArgs)
            assert all(isinstance(g, str) for g in got), got
            for i, tid in enumerate(got):
                timer = await producer.get(str(tid))
                assert timer is not None and timer.args == [i]
            assert (await producer.stats()).pending == 50
        await client.aclose()

    asyncio.run(scenario())


def test_drain_waits_for_a_batch_in_flight_after_the_lone_call_before_it_ended() -> None:
    async def scenario(wire: Wire, coalescer: Coalescer[str]) -> None:
        lone = asyncio.ensure_future(coalescer.schedule("a"))
        await turn()
        batch = [asyncio.ensure_future(coalescer.schedule(p)) for p in "bc"]
        await sent(wire, 2)
        wire.gates[0].set_result(None)  # the lone call ends; the batch is still on the wire
        assert await lone == "id-a"
        drained = asyncio.ensure_future(coalescer.drain())
        await turn()
        assert not drained.done(), "drain returned with a batch on the wire"
        wire.release()
        await drained
        assert [f.result() for f in batch] == ["id-b", "id-c"]

    run(scenario)
