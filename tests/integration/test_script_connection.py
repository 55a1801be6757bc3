"""A sync client made from a URL sends its script calls on a connection of its own when it
is free (:class:`timers.store.connect.ScriptConnection`), an asyncio one packs them with hiredis
(:class:`timers.store.connect.AsyncScriptConnection`): neither may hold back the rest of the pool,
read one call's reply as another's, or share a socket with a forked child."""

from __future__ import annotations

import asyncio
import os

import pytest
import redis

from timers import AsyncTimers, ServerTimeout, Timers

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("size", [1, 2])
def test_a_small_pool_serves_script_calls_and_reads_alike_without_waiting(
        redis_url: str, size: int) -> None:
    """With one connection there is no script connection; with two, it keeps one and every other
    call shares the other. A pool that waited would raise PoolExhausted after 0.5 s."""
    with Timers(f"{redis_url}?max_connections={size}&timeout=0.5") as t:
        first = t.schedule("a.b", [1], in_=60)
        for _ in range(3):
            assert t.get(first) is not None  # a pipeline, on the pool
            assert len(t.list()) >= 1
            assert t.reschedule(first, in_=120)  # a script call
        ids = t.schedule_many([{"task": "a.b", "in_": 60}] * 3)
        assert t.stats().pending == 4
        assert t.cancel(ids[0]) and not t.cancel(ids[0])


@pytest.mark.parametrize("size", [1, 2])
def test_a_small_async_pool_serves_script_calls_in_flight_and_reads_without_waiting(
        redis_url: str, size: int) -> None:
    """With two connections the async script connection keeps one for script calls; calls made while
    it is busy (a batch behind a lone call, reads) share the other, and none waits for
    the script connection: a pool that waited would raise after 0.5 s."""
    async def scenario() -> None:
        async with AsyncTimers(f"{redis_url}?max_connections={size}&timeout=0.5") as t:
            first = await t.schedule("a.b", [1], in_=60)
            for _ in range(3):
                got = await asyncio.gather(
                    t.schedule("a.b", [2], in_=60), t.get(first), t.list(),
                    *(t.schedule("a.b", [i], in_=60) for i in range(5)),
                    t.reschedule(first, in_=120))
                assert got[1] is not None and got[-1] is True
            assert (await t.stats()).pending == 1 + 3 * 6
            assert await t.cancel(first) and not await t.cancel(first)

    asyncio.run(scenario())


def test_after_a_script_call_timed_out_the_next_reads_its_own_reply(
        redis_url: str, r: redis.Redis, paused: redis.Redis) -> None:
    with Timers(f"{redis_url}?socket_timeout=0.3") as t:
        t.schedule("a.b", in_=60)  # the script connection is made
        paused.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        with pytest.raises(ServerTimeout):
            t.schedule("a.b", ["late"], in_=60, id="late")
        paused.execute_command("CLIENT", "UNPAUSE")
        # the connection that waited was dropped, with whatever reply was to come on it:
        # each call after reads its own
        written = r.zscore("timers|due", "late") is not None
        assert t.cancel("late") is written and not t.cancel("late")
        assert t.schedule("a.b", in_=60, id="next") == "next"
        assert t.reschedule("next", in_=30)
        assert t.cancel("next") and not t.cancel("next")


def test_after_an_async_script_call_timed_out_the_next_read_their_own_replies(
        redis_url: str, r: redis.Redis, paused: redis.Redis) -> None:
    async def scenario() -> None:
        async with AsyncTimers(f"{redis_url}?socket_timeout=0.3") as t:
            await t.schedule("a.b", in_=60)  # connections made, the library loaded
            paused.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
            with pytest.raises(ServerTimeout):
                await t.schedule("a.b", ["late"], in_=60, id="late")
            paused.execute_command("CLIENT", "UNPAUSE")
            written = r.zscore("timers|due", "late") is not None
            assert await t.cancel("late") is written and not await t.cancel("late")
            ids = await asyncio.gather(*(t.schedule("a.b", [i], in_=60, id=f"n{i}")
                                         for i in range(20)))
            assert ids == [f"n{i}" for i in range(20)]
            assert await t.cancel("n7") and not await t.cancel("n7")

    asyncio.run(scenario())


def test_a_forked_child_schedules_on_its_own_connection(
        redis_url: str, r: redis.Redis) -> None:
    with Timers(redis_url) as t:
        t.schedule("a.b", in_=60, id="before-fork")  # the script connection is made
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: 50 schedules and cancels, then says whether all read right
            ok = True
            try:
                for i in range(50):
                    ok = ok and t.schedule("a.b", in_=60, id=f"child-{i}") == f"child-{i}"
                    ok = ok and t.cancel(f"child-{i}") and not t.cancel(f"child-{i}")
            except BaseException:
                ok = False
            os.write(write, b"ok" if ok else b"bad")
            os._exit(0)
        os.close(write)
        for i in range(50):
            assert t.schedule("a.b", in_=60, id=f"parent-{i}") == f"parent-{i}"
            assert t.reschedule(f"parent-{i}", in_=30)
        os.waitpid(pid, 0)
        assert os.read(read, 10) == b"ok"
        os.close(read)
        assert t.cancel("before-fork")
    assert r.zcard("timers|due") == 50
