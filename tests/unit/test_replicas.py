"""``replicas=n`` (issue 32, item 7): the option's plumbing and its error path, without a
server process.

fakeredis (2.41) knows neither ``WAIT`` nor ``WAITAOF`` ("unknown command"), so the clients
run here over a transport that sends everything but those to fakeredis (the timers are
really written) and answers them as told: how many replicas "acknowledged".
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis.exceptions

import timers
import timers.producer.async_client
import timers.producer.base
import timers.producer.client
from timers import AsyncTimers, NotReplicated, ServerError, Timers, TimerSpec
from timers.model.keys import Keyspace
from timers.ops.base import Call, Request
from timers.ops.operations import SCHEDULE_CHUNK, Operations
from timers.ops.replication import ReplicaPolicy, Replication
from timers.producer.transport import _commands, _replies, run_async, run_sync
from timers.store.script_manifest import ScriptName
from timers.testing import TimersTest


class FakeWaits:
    """A transport: the writes go to fakeredis, ``WAIT``/``WAITAOF`` get ``acked``."""

    def __init__(self) -> None:
        self.acked = 0
        self.fsynced: Any = [0, 0]
        self.requests: list[Request] = []

    def _split(self, request: Request) -> tuple[Request, list[Any]]:
        self.requests.append(request)
        writes = [c for c in request if not c.after]
        waits = [self.acked if c.command[0] == "WAIT" else self.fsynced
                 for c in request if c.after]
        return writes, waits

    def sync(self, client: Any, scripts: Mapping[ScriptName, Any],
             request: Request) -> list[Any]:
        writes, waits = self._split(request)
        return run_sync(client, scripts, writes) + waits

    async def run_async(self, client: Any, scripts: Mapping[ScriptName, Any],
                        request: Request) -> list[Any]:
        writes, waits = self._split(request)
        return await run_async(client, scripts, writes) + waits

    def waits(self) -> list[tuple[Any, ...]]:
        """The WAIT/WAITAOF commands sent, in order."""
        return [c.command for r in self.requests for c in r if c.after]


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> FakeWaits:
    fake = FakeWaits()
    monkeypatch.setattr(timers.producer.client, "run_sync", fake.sync)
    monkeypatch.setattr(timers.producer.async_client, "run_async", fake.run_async)
    # fakeredis plays a server with replicas here (a client on it would not wait, below)
    monkeypatch.setattr(timers.producer.base, "in_memory", lambda client: False)
    return fake


# -- the operations, sans I/O ---------------------------------------------------------


def test_without_replicas_a_schedule_is_one_script_call_as_before() -> None:
    op = Operations(Keyspace()).schedule(TimerSpec("a.b", in_=60))
    request = next(op)
    assert len(request) == 1 and request[0].script == "schedule" and not request[0].after


def test_with_replicas_the_wait_follows_the_write_in_the_same_round_trip() -> None:
    op = Operations(Keyspace()).schedule(TimerSpec("a.b", in_=60, id="o1"),
                                         replication=Replication(2, 0.25))
    request = next(op)
    assert [c.script for c in request] == ["schedule", None]
    assert request[1] == Call(command=("WAIT", 2, 250), after=True)
    with pytest.raises(StopIteration) as done:
        op.send([[0, 1234], 2])
    assert done.value.value == "o1"


def test_too_few_replicas_raise_naming_the_id_and_saying_it_exists() -> None:
    op = Operations(Keyspace()).schedule(TimerSpec("a.b", in_=60, id="o1"),
                                         replication=Replication(2, 0.25))
    next(op)
    with pytest.raises(NotReplicated) as caught:
        op.send([[0, 1234], 1])
    err = caught.value
    assert err.timer_ids == ["o1"] and (err.replicas, err.acked, err.fsynced) == (2, 1, None)
    assert "timer 'o1' exists on the primary" in str(err)
    assert "only 1 of the 2 replicas" in str(err) and "0.25 s" in str(err)


def test_fsync_adds_waitaof_which_a_server_without_it_may_refuse() -> None:
    wanted = Replication(1, 1.0, fsync=True)
    waitaof = wanted.calls()[1]
    assert waitaof == Call(command=("WAITAOF", 0, 1, 1000), after=True, may_fail=True)
    assert wanted.shortfall([1, [0, 1]]) is None
    assert wanted.shortfall([1, [1, 0]]) == (1, 0)  # in memory, not yet on disk
    unknown = redis.exceptions.ResponseError("unknown command 'WAITAOF', with args …")
    assert wanted.shortfall([1, unknown]) is None  # Redis < 7.2: WAIT alone counts
    with pytest.raises(ServerError, match="WAITAOF"):
        wanted.shortfall([1, redis.exceptions.ResponseError("ERR something else")])
    assert "fsynced to their AOF" in str(wanted.error((1, 0), ["x"], "exists"))


def test_a_batch_over_several_chunks_waits_once_and_names_every_id() -> None:
    n = SCHEDULE_CHUNK * 2 + 1
    op = Operations(Keyspace()).schedule_many(
        [TimerSpec("a.b", in_=60, id=f"i{k}") for k in range(n)],
        replication=Replication(1))
    request = next(op)
    assert [c.after for c in request] == [False, False, False, True]
    replies = [[0, *[1] * SCHEDULE_CHUNK], [0, *[1] * SCHEDULE_CHUNK], [0, 1], 0]
    with pytest.raises(NotReplicated) as caught:
        op.send(replies)
    assert caught.value.timer_ids == [f"i{k}" for k in range(n)]
    assert f"({n} in all) exist on the primary" in str(caught.value)


def test_cancel_and_reschedule_wait_and_only_a_change_made_is_reported() -> None:
    ops, wanted = Operations(Keyspace()), Replication(1)
    op = ops.cancel("c1", wanted)
    assert next(op)[1].command[0] == "WAIT"
    with pytest.raises(NotReplicated, match="timer 'c1' was cancelled on the primary"):
        op.send([1, 0])
    op = ops.cancel("c1", wanted)
    next(op)
    with pytest.raises(StopIteration) as done:
        op.send([0, 0])  # not pending: nothing was written, nothing to confirm
    assert done.value.value is False
    op2 = ops.reschedule("r1", 5, None, wanted)
    next(op2)
    with pytest.raises(NotReplicated, match="timer 'r1' was moved on the primary"):
        op2.send([1234, 0])


# -- the transport's framing, sans I/O ------------------------------------------------


class _Script:
    sha = "abc"


def test_several_writes_go_in_an_explicit_multi_exec_before_the_wait() -> None:
    request = [Call(script="schedule", keys=("k",), args=(1,), atomic=True),
               Call(script="schedule", keys=("k",), args=(2,), atomic=True),
               *Replication(1, 0.5, fsync=True).calls()]
    scripts: Any = {"schedule": _Script()}
    commands, wrap = _commands(scripts, request)
    assert wrap and [c[0] for c in commands] == ["MULTI", "EVALSHA", "EVALSHA", "EXEC",
                                                 "WAIT", "WAITAOF"]
    unknown = redis.exceptions.ResponseError("unknown command 'WAITAOF'")
    assert _replies(request, [b"OK", b"QUEUED", b"QUEUED", [[0, 1], [0, 2]], 1, unknown],
                    wrap) == [[0, 1], [0, 2], 1, unknown]
    refused = redis.exceptions.ResponseError("ERR in the script")
    with pytest.raises(redis.exceptions.ResponseError, match="in the script"):
        _replies(request, [b"OK", b"QUEUED", b"QUEUED", [[0, 1], refused], 1, [0, 1]], wrap)
    oom = redis.exceptions.OutOfMemoryError("OOM command not allowed")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        _replies(request, [b"OK", oom, oom, redis.exceptions.ExecAbortError("EXECABORT"), 0,
                           [0, 0]], wrap)
    with pytest.raises(redis.exceptions.ResponseError, match="replica instances"):
        _replies(request, [b"OK", b"QUEUED", b"QUEUED", [[0, 1], [0, 2]],
                           redis.exceptions.ResponseError("WAIT cannot be used with replica "
                                                          "instances"), [0, 1]], wrap)


def test_one_write_needs_no_multi() -> None:
    request = [Call(script="schedule", keys=("k",), atomic=True), *Replication(1).calls()]
    commands, wrap = _commands({"schedule": _Script()}, request)  # type: ignore[dict-item]
    assert not wrap and [c[0] for c in commands] == ["EVALSHA", "WAIT"]


# -- the options, per client and per call ---------------------------------------------


@pytest.mark.parametrize("bad", [{"replicas": -1}, {"replicas": True}, {"replicas": 1.5},
                                 {"replicas": 1, "replicas_timeout": 0},
                                 {"replicas": 1, "replicas_timeout": float("nan")},
                                 {"replicas_timeout": -1}])
def test_bad_options_are_refused_when_the_client_is_made(
        fake: fakeredis.FakeRedis, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="replicas"):
        Timers(fake, **bad)


def test_a_call_overrides_the_clients_options() -> None:
    policy = ReplicaPolicy(1, 2.0, fsync=True)
    assert policy.for_call() == Replication(1, 2.0, True)
    assert policy.for_call(replicas=0) is None
    assert policy.for_call(replicas=2) == Replication(2, 2.0, True)
    assert policy.for_call(timeout=0.1) == Replication(1, 0.1, True)
    none = ReplicaPolicy()
    assert none.for_call() is None and none.for_call(timeout=3) is None
    assert none.for_call(replicas=1) == Replication(1, 1.0, False)


def test_the_sync_client_waits_per_client_and_per_call(
        fake: fakeredis.FakeRedis, transport: FakeWaits) -> None:
    with Timers(fake, replicas=1, replicas_timeout=0.25) as t:
        with pytest.raises(NotReplicated) as caught:
            t.schedule("a.b", in_=60)
        (tid,) = caught.value.timer_ids
        assert t.get(tid) is not None  # the timer exists on the primary
        transport.acked = 1
        kept = t.schedule("a.b", in_=60)
        assert transport.waits()[-1] == ("WAIT", 1, 250)
        waits = len(transport.waits())
        t.schedule("a.b", in_=60, replicas=0)  # not this one (sent straight, without WAIT)
        assert len(transport.waits()) == waits
        with pytest.raises(NotReplicated, match="only 1 of the 2 replicas"):
            t.schedule("a.b", in_=60, replicas=2, replicas_timeout=0.1)
        assert transport.waits()[-1] == ("WAIT", 2, 100)
        assert t.schedule_many([TimerSpec("a.b", in_=60)] * 3, replicas=1) is not None
        assert len(transport.requests[-1]) == 2
        assert t.reschedule(kept, in_=5) and transport.waits()[-1] == ("WAIT", 1, 250)
        transport.acked = 0
        with pytest.raises(NotReplicated, match="cancelled on the primary"):
            t.cancel(kept)
        assert t.get(kept) is None
    with Timers(fake) as plain:
        waits = len(transport.waits())
        plain.schedule("a.b", in_=60)
        plain.schedule("a.b", in_=60)
        assert len(transport.waits()) == waits


def test_a_sharded_prefix_writes_every_shard_then_names_every_id_not_confirmed(
        fake: fakeredis.FakeRedis, transport: FakeWaits) -> None:
    with Timers(fake, shards=3, replicas=1) as t:
        with pytest.raises(NotReplicated) as caught:
            ids = [f"s{i}" for i in range(30)]
            t.schedule_many([TimerSpec("a.b", in_=60, id=i) for i in ids])
        assert sorted(caught.value.timer_ids) == sorted(ids)
        assert "exist on the primaries" in str(caught.value)
        assert t.stats().pending == 30
        assert len(transport.waits()) == 3  # a WAIT in each shard's round trip


def test_the_module_level_functions_pass_the_options_on(
        fake: fakeredis.FakeRedis, transport: FakeWaits, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(timers, "_default", Timers(fake))
    transport.acked = 1
    tid = timers.schedule("a.b", in_=60, replicas=1, replicas_timeout=0.5)
    timers.schedule_many([TimerSpec("a.b", in_=60)], replicas=1)
    timers.reschedule(tid, in_=30, replicas=1)
    timers.cancel(tid, replicas=1, replicas_timeout=0.3)
    assert transport.waits() == [("WAIT", 1, 500), ("WAIT", 1, 1000), ("WAIT", 1, 1000),
                                 ("WAIT", 1, 300)]


def test_the_asyncio_client_shares_one_wait_among_calls_in_flight_and_each_gets_its_id(
        transport: FakeWaits) -> None:
    server = fakeredis.FakeServer()

    async def main() -> None:
        async with AsyncTimers(fakeredis.aioredis.FakeRedis(server=server), replicas=1) as t:
            results = await asyncio.gather(*(t.schedule("a.b", [i], in_=60) for i in range(3)),
                                           t.schedule("a.b", in_=60, replicas=0),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, NotReplicated)]
            assert len(errors) == 3 and isinstance(results[3], str)
            ids = [e.timer_ids[0] for e in errors]
            assert len(set(ids)) == 3 and all(len(e.timer_ids) == 1 for e in errors)
            for tid in ids:
                assert await t.get(tid) is not None
            # the first went alone; the two made while it was in flight shared a round trip
            # and its WAIT
            assert len(transport.waits()) == 2
            transport.acked = 1
            await t.schedule_many([TimerSpec("a.b", in_=60)], replicas_timeout=0.2)
            assert transport.waits()[-1] == ("WAIT", 1, 200)
            assert await t.cancel(ids[0]) and await t.reschedule(ids[1], in_=1)

        timers.aio.configure(fakeredis.aioredis.FakeRedis(server=server))
        await timers.aio.schedule("a.b", in_=60, replicas=1)
        await timers.aio.schedule_many([TimerSpec("a.b", in_=60)], replicas=1)

    try:
        asyncio.run(main())
    finally:
        timers.aio.configure()
    assert transport.waits()[-2:] == [("WAIT", 1, 1000), ("WAIT", 1, 1000)]


def test_an_in_memory_server_has_no_replicas_to_wait_for(fake: fakeredis.FakeRedis) -> None:
    """An app's tests (timers.testing, fakeredis) run its replicas=1 code as written."""
    with Timers(fake, replicas=1) as t:
        tid = t.schedule("a.b", in_=60, replicas=2)
        assert t.cancel(tid, replicas=1) and t.replicas.for_call() is None
        with pytest.raises(ValueError, match="replicas"):
            t.schedule("a.b", in_=60, replicas=-1)  # still checked
    with TimersTest():
        assert timers.schedule("a.b", in_=60, replicas=1)

    async def main() -> None:
        async with AsyncTimers(fakeredis.aioredis.FakeRedis(), replicas=1) as a:
            assert await a.schedule("a.b", in_=60)

    asyncio.run(main())


def test_not_replicated_is_exported_and_a_timers_error() -> None:
    assert "NotReplicated" in timers.__all__ and issubclass(NotReplicated, timers.TimersError)
