"""Shards on fakeredis: where a timer goes, how the layout is fixed at first use, every call
of the API over four shards, and a listener that serves them all (one lane per shard).

fakeredis is one server, so the shards' hash tags change nothing here; the cluster itself
is tests/integration/test_cluster.py's business.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
from redis.crc import key_slot

import timers
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import mod
from tests.unit.test_task_check import announce
from timers import Listener, Timers, TimerSpec
from timers.exceptions import ShardLayoutMismatch, TimersError
from timers.listener.flow.gate import _WARNED
from timers.model.history import TimerState
from timers.model.keys import Keyspace
from timers.ops.shards import (
    MAX_SHARDS,
    ShardLayout,
    check_shards,
    configured_shards,
    shard_of,
    shard_of_key,
    shard_prefix,
)
from timers.store.script_rows import NewTimer
from timers.store.scripts import Scripts

SHARDS = ShardLayout(Keyspace("timers"), 4, "timers").keyspaces


def test_a_timer_id_always_goes_to_the_same_shard_and_ids_spread_evenly() -> None:
    assert shard_of("order-17", 16) == shard_of("order-17", 16)
    counts = Counter(shard_of(f"user:{i}:reminder", 16) for i in range(16_000))
    assert len(counts) == 16
    assert min(counts.values()) > 800 and max(counts.values()) < 1200  # 1,000 each ideally
    assert {shard_of(f"x{i}", 1) for i in range(100)} == {0}


def test_a_recurrences_occurrences_go_to_the_shard_of_its_name() -> None:
    for name in ("nightly", "report@weekly", "a"):
        assert shard_of(f"{name}@1764000000000", 16) == shard_of(name, 16)
    assert shard_of("a@b", 16) == shard_of("a@b", 16)  # not digits: the whole id routes


@pytest.mark.parametrize("bad", [0, -1, MAX_SHARDS + 1, "x", "4.5", True, ""])
def test_a_bad_shard_count_is_one_clear_line(bad: object) -> None:
    with pytest.raises(ValueError, match="shards must be a whole number from 1 to 1024"):
        check_shards(bad)


def test_the_shard_count_comes_from_the_environment_when_not_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_SHARDS", "8")
    assert configured_shards() == 8 and configured_shards(2) == 2
    monkeypatch.setenv("TIMERS_SHARDS", "lots")
    with pytest.raises(ValueError, match=r"\$TIMERS_SHARDS must be"):
        configured_shards()


@pytest.mark.parametrize("count", [2, 3, 6, 12, 16])
def test_a_layout_names_one_hash_tag_per_shard_in_evenly_spread_slots(count: int) -> None:
    """Shard i's slot is in the i-th of ``count`` equal slot ranges: primaries holding
    equal ranges (as ``redis-cli --cluster create`` makes them) get equal shares."""
    layout = ShardLayout(Keyspace("{timers}"), count, "timers")
    for i, keys in enumerate(layout.keyspaces):
        assert keys.prefix.startswith(f"{{timers#{i}.") and keys.prefix.endswith("}")
        assert i * 16384 // count <= key_slot(keys.due.encode()) < (i + 1) * 16384 // count
    assert ShardLayout(Keyspace("{timers}"), 1, "timers").keyspaces == (Keyspace("{timers}"),)
    assert shard_prefix("app{x}", 2, 4) == "app{x}#2"  # its own tag: kept


def test_a_single_server_stores_no_layout_unless_asked_and_a_later_client_follows_it(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake) as plain:
        plain.schedule("a.b", in_=60)
    assert fake.get("timers|shards") is None
    fake.flushall()
    with Timers(fake, shards=4) as sharded:
        sharded.schedule_many(TimerSpec("a.b", [i], in_=60) for i in range(40))
    assert fake.get("timers|shards") == b"4"
    with Timers(fake) as later:
        assert later.stats().pending == 40
        assert later.ops.layout is not None and later.ops.layout.count == 4
    with pytest.raises(ShardLayoutMismatch, match=r"prefix 'timers' is split into 4 shard"):
        Timers(fake, shards=8).stats()


def test_a_prefix_in_use_before_it_had_a_layout_stays_one_shard(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake) as old:
        old.schedule("a.b", in_=60, id="kept")
    with pytest.raises(ShardLayoutMismatch, match="split into 1 shard"):
        Timers(fake, shards=4).stats()
    assert fake.get("timers|shards") == b"1"  # fixed now: nothing stranded
    with Timers(fake) as t:
        assert t.get("kept") is not None


def test_every_call_works_over_four_shards(fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, shards=4) as t:
        ids = t.schedule_many(TimerSpec("a.b", [i], in_=60 + i, id=f"t{i}") for i in range(100))
        assert ids == [f"t{i}" for i in range(100)]
        assert all(fake.zcard(k.due) > 10 for k in SHARDS)  # spread over every shard
        assert fake.zcard("timers|due") == 0
        assert t.get("t7") is not None and t.get("t7").args == [7]  # type: ignore[union-attr]
        assert t.reschedule("t7", in_=1)
        assert [p.id for p in t.list(3)] == ["t7", "t0", "t1"]  # soonest first, merged
        assert t.cancel("t7") and not t.cancel("t7") and t.get("t7") is None
        assert t.stats().pending == 99
        generated = t.schedule("a.b", in_=5)
        assert fake.zscore(SHARDS[shard_of(generated, 4)].due, generated) is not None


def test_a_keys_timers_all_live_in_the_keys_shard_and_are_found_by_id(
        fake: fakeredis.FakeRedis) -> None:
    devices = [f"device-{d}" for d in range(12)]
    with Timers(fake, shards=4) as t:
        ids = t.schedule_many(TimerSpec("a.b", [i], in_=60, key=devices[i % 12])
                              for i in range(240))
        assert ids == sorted(ids)  # still in the order they were made
        for i, timer_id in enumerate(ids):
            home = SHARDS[shard_of_key(devices[i % 12], 4)]
            assert fake.zscore(home.due, timer_id) is not None
        assert {shard_of_key(d, 4) for d in devices} == {0, 1, 2, 3}  # keys spread
        assert t.get(ids[7]) is not None and t.reschedule(ids[7], in_=5)
        assert t.cancel(ids[7]) and t.get(ids[7]) is None
        one = t.schedule("a.b", in_=60, key="device-3")
        assert shard_of(one, 4) == shard_of_key("device-3", 4)


@timers.task(name="registered.command", concurrency=1,
             key=lambda device, *_: f"device:{device}")
def registered_command(device: int, command: str) -> None:
    """Its key worked out from its args, declared where the producer can see it."""


@timers.task(name="registered.paced", concurrency=1, key=lambda device: f"device:{device}",
             rate="600/m")
def registered_paced(device: int) -> None:
    """A rate wins over the key: every timer in the rate's shard."""


@timers.task(name="registered.broken", concurrency=1, key=lambda device: 1 / 0)
def registered_broken(device: int) -> None:
    """A key function that fails: the listener reports it."""


def test_a_producer_that_knows_a_tasks_declared_limit_places_its_timers_in_its_shard(
        fake: fakeredis.FakeRedis) -> None:
    """A task registered by name in the producer's process (the module that declares it
    imported there) is placed by its declaration: its timers are born in their key's (or
    rate's) shard and never move. An id the producer chose, and a key function that fails,
    leave the timer in its id's shard, as for a task the producer does not know."""
    devices = range(12)
    with Timers(fake, shards=4) as t:
        ids = t.schedule_many(TimerSpec("registered.command", [d, f"c{i}"], in_=60)
                              for i in range(3) for d in devices)
        assert ids == sorted(ids)
        for timer_id, (_, d) in zip(ids, [(i, d) for i in range(3) for d in devices],
                                    strict=True):
            assert shard_of(timer_id, 4) == shard_of_key(f"device:{d}", 4)
        paced = [t.schedule("registered.paced", [d], in_=60) for d in devices]
        assert {shard_of(i, 4) for i in paced} == {
            shard_of_key("task:registered.paced", 4)}
        chosen = t.schedule("registered.command", [1, "x"], in_=60, id="mine")
        broken = [t.schedule("registered.broken", [d], in_=60) for d in devices]
        unknown = [t.schedule("unregistered.command", [d, "x"], in_=60) for d in devices]
    assert chosen == "mine" and fake.zscore(SHARDS[shard_of("mine", 4)].due, "mine")
    assert len({shard_of(i, 4) for i in broken + unknown}) > 1  # by their ids


def test_a_chosen_id_with_a_key_must_name_the_keys_shard(fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, shards=4) as t:
        wrong = next(f"order-{i}" for i in range(100)
                     if shard_of(f"order-{i}", 4) != shard_of_key("dev-7", 4))
        with pytest.raises(timers.InvalidTimer, match="in braces"):
            t.schedule_many([TimerSpec("a.b", in_=60, id="fine", key=None),
                             TimerSpec("a.b", in_=60, id=wrong, key="dev-7")])
        assert t.stats().pending == 0  # all or nothing
        tagged = wrong + "{dev-7}"
        assert t.schedule("a.b", in_=60, id=tagged, key="dev-7") == tagged
        assert fake.zscore(SHARDS[shard_of_key("dev-7", 4)].due, tagged) is not None
        assert t.cancel(tagged)
    with Timers(fake) as one:  # one shard: any id goes with any key
        fake.delete("timers|shards")
        assert one.schedule("a.b", in_=60, id="x", key="dev-7") == "x"


def test_an_id_routes_by_its_tag_and_an_occurrence_by_its_name() -> None:
    assert shard_of("order-9{dev-7}", 16) == shard_of_key("dev-7", 16)
    assert shard_of("daily{dev-7}@1764000000000", 16) == shard_of_key("dev-7", 16)
    assert shard_of("a{}b", 16) == shard_of("a{}b", 16) != -1  # an empty tag: the whole id


def test_recurrences_live_beside_their_occurrences_over_four_shards(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, shards=4) as t:
        for name in ("alpha", "beta", "gamma", "delta"):
            t.every(name, "a.b", interval=60)
        assert [r.name for r in t.recurrences()] == ["alpha", "beta", "delta", "gamma"]
        for name in ("alpha", "beta", "gamma", "delta"):
            home = SHARDS[shard_of(name, 4)]
            assert fake.hexists(home.recurrences, name)
            (occurrence,) = [i.decode() for i in fake.zrange(home.due, 0, -1)
                             if i.decode().startswith(name + "@")]
            assert t.get(occurrence) is not None
            found = t.get_recurrence(name)
            assert found is not None and found.next_due is not None
        assert t.pause("beta") and t.unschedule_recurring("gamma")
        assert [r.name for r in t.recurrences()] == ["alpha", "beta", "delta"]


def _listener(server: fakeredis.FakeServer) -> Listener:
    return Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                    search_path=str(ROOT), concurrency=8)


def test_one_listener_serves_every_shard_and_its_failures_merge() -> None:
    server = fakeredis.FakeServer()
    mod.CALLS.clear()
    past = datetime.now(UTC) - timedelta(seconds=1)
    with Timers(fakeredis.FakeRedis(server=server), shards=4) as t:
        t.schedule_many(TimerSpec("mod.add", [i], at=past) for i in range(60))
        t.schedule_many(TimerSpec("mod.boom", [i], at=past, id=f"bad{i}") for i in range(3))

        async def burst() -> None:
            listener = _listener(server)
            await asyncio.wait_for(listener.run(burst=True), 15)
            await listener.redis.aclose()

        asyncio.run(burst())
        assert sorted(mod.CALLS) == [("add", (i, 0)) for i in range(60)]  # each once
        stats = t.stats()
        assert (stats.pending, stats.failed, stats.fired) == (0, 3, 60)
        assert sorted(f.timer_id or "" for f in t.failed()) == ["bad0", "bad1", "bad2"]
        assert t.get_failure("bad1") is not None
        # while a live listener runs mod.add only, every shard's mod.boom is left dead
        fake = fakeredis.FakeRedis(server=server)
        for keys in SHARDS:
            announce(fake, ["mod.add"], keys=keys)
        left = t.retry_all_failures()
        assert (left.retried, left.unrunnable) == (0, 3)
        assert left.unrunnable_example is not None and "mod.boom" in left.unrunnable_example
        for keys in SHARDS:  # that listener goes: one started later may run them
            fake.zrem(keys.listeners, "h:1:ab")
        assert t.retry_all_failures().retried == 3
        assert t.stats().pending == 3 and t.stats().failed == 0
    mod.CALLS.clear()


def test_lanes_that_take_the_slots_while_another_gathers_leave_it_claiming_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy lane waits a moment for slots to gather (:mod:`timers.listener.finding.claimer`);
    the other lanes may take them meanwhile, more than were free (each claims for the
    slots it saw free). It then claims nothing and waits for a slot: once, a claim for a
    negative count failed, the lane's loop died, and a burst never ended (the others
    waited for that shard)."""
    from timers.listener import lanes
    from timers.listener.finding import claimer

    taken = [0]  # slots the other lanes took beyond the free ones, as the gathering ends
    counted = lanes.Shared.free_slots

    def free_slots(self: lanes.Shared) -> int:
        over, taken[0] = taken[0], 0
        return counted(self) - over

    overtaken: set[int] = set()

    async def others_take_the_slots(self: claimer.Claimer) -> None:
        await asyncio.sleep(0)
        if id(self) not in overtaken:  # once per lane: the count it reads next
            overtaken.add(id(self))
            taken[0] = self.hooks.free_slots() + 3

    made = claimer.Claimer.__init__

    def gathering_always(self: claimer.Claimer, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self.gather = 1_000  # more than there are: every claim in the backlog gathers

    monkeypatch.setattr(lanes.Shared, "free_slots", free_slots)
    monkeypatch.setattr(claimer.Claimer, "__init__", gathering_always)
    monkeypatch.setattr(claimer.CpuGauge, "busy", lambda self: True)
    monkeypatch.setattr(claimer.Claimer, "gather_slots", others_take_the_slots)
    server = fakeredis.FakeServer()
    mod.CALLS.clear()
    past = datetime.now(UTC) - timedelta(seconds=1)
    with Timers(fakeredis.FakeRedis(server=server), shards=4) as t:
        t.schedule_many(TimerSpec("mod.add", [i], at=past) for i in range(200))

        async def burst() -> None:
            listener = _listener(server)
            await asyncio.wait_for(listener.run(burst=True), 30)
            await listener.redis.aclose()

        asyncio.run(burst())
        assert len(overtaken) >= 2, "lanes were overtaken as they gathered"
        assert sorted(mod.CALLS) == [("add", (i, 0)) for i in range(200)]  # each once
        assert t.stats().pending == 0
    mod.CALLS.clear()


def test_subscribed_awaited_before_the_run_is_set_once_the_lanes_listen() -> None:
    """``listener.subscribed`` is taken before ``run()`` knows the shards (the bench and
    apps wait on it): it must be the event the first lane sets."""
    server = fakeredis.FakeServer()
    Timers(fakeredis.FakeRedis(server=server), shards=4).stats()  # fixes the layout

    async def scenario() -> None:
        listener = _listener(server)
        subscribed, stop = listener.subscribed, asyncio.Event()
        task = asyncio.create_task(listener.run(stop))
        await asyncio.wait_for(subscribed.wait(), 10)
        assert len(listener.lanes) == 4
        stop.set()
        await task
        await listener.redis.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("junk", [b"lots", b"0", b"99999", b"2.5"])
def test_a_garbled_stored_layout_is_one_clear_error_not_a_guess(
        fake: fakeredis.FakeRedis, junk: bytes) -> None:
    """Guessing a count would put timers in shards no listener sweeps: refuse, say where."""
    fake.set("timers|shards", junk)
    with Timers(fake) as t, pytest.raises(TimersError, match=r"timers\|shards holds .* not a "
                                                             r"shard count"):
        t.stats()


@timers.task(concurrency=1)
def _limited(i: int) -> None:
    """One at a time fleet-wide: a limit that shards weaken."""


@timers.task(concurrency=1)
def _keyed(i: int) -> None:
    """One at a time per key given when scheduling: exact on any number of shards."""


@timers.task(concurrency=1, rate="600/m")
def _keyed_and_rated(i: int) -> None:
    """One at a time per key given when scheduling, ten starts a second."""


def test_a_listener_moves_a_declared_limits_timers_into_its_shard_and_its_burst_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    """(A burst's lane that finished first once kept its loops going, and the burst never
    ended: each lane's loops now stop with the lane.) A task's own limit lives in one
    shard: the timers of other shards move there at their first claim (rule 3)."""
    server = fakeredis.FakeServer()
    past = datetime.now(UTC) - timedelta(seconds=1)
    with Timers(fakeredis.FakeRedis(server=server), shards=4) as t:
        ids = t.schedule_many(TimerSpec("lim.one", [i], at=past) for i in range(8))

        async def burst() -> None:
            listener = Listener(fakeredis.FakeAsyncRedis(server=server),
                                registry={"lim.one": _limited})
            await asyncio.wait_for(listener.run(burst=True), 15)
            await listener.redis.aclose()

        with caplog.at_level("WARNING", logger="timers.listener"):
            asyncio.run(burst())
        assert t.stats().fired == 8
        home = shard_of_key("task:lim.one", 4)
        away = sum(1 for i in ids if shard_of(i, 4) != home)
        assert away and t.stats().counters.get("placed") == away
        assert all(t.status(i).state is TimerState.COMPLETED for i in ids)  # found by id
    said = [r.getMessage() for r in caplog.records if "counted in each shard" in r.getMessage()]
    assert said == []


def test_a_listener_says_once_that_a_rate_of_keyed_timers_holds_per_shard(
        caplog: pytest.LogCaptureFixture) -> None:
    server = fakeredis.FakeServer()
    past = datetime.now(UTC) - timedelta(seconds=1)
    rate_home = shard_of_key("task:lim.rated", 4)
    key = next(k for k in (f"k{i}" for i in range(100)) if shard_of_key(k, 4) != rate_home)
    _WARNED.discard("lim.rated")
    with Timers(fakeredis.FakeRedis(server=server), shards=4) as t:
        t.schedule("lim.rated", [0], at=past, key=key)

        async def burst() -> None:
            listener = Listener(fakeredis.FakeAsyncRedis(server=server),
                                registry={"lim.rated": _keyed_and_rated})
            await asyncio.wait_for(listener.run(burst=True), 15)
            await listener.redis.aclose()

        # a run its rate let go that reached its call past its start window (a loaded
        # machine) is handed back, due at the rate's next slot, after the burst: burst again
        deadline = time.monotonic() + 30
        with caplog.at_level("WARNING", logger="timers.listener"):
            while t.stats().fired == 0 and time.monotonic() < deadline:
                asyncio.run(burst())
        assert t.stats().fired == 1
        assert "placed" not in t.stats().counters  # a key given when scheduling places it
    said = [r.getMessage() for r in caplog.records if "counted in each shard" in r.getMessage()]
    assert len(said) == 1 and "task lim.rated" in said[0] and "prefix is split into 4" in said[0]


def test_a_listener_says_nothing_of_shards_for_timers_in_their_keys_shard(
        caplog: pytest.LogCaptureFixture) -> None:
    server = fakeredis.FakeServer()
    past = datetime.now(UTC) - timedelta(seconds=1)
    _WARNED.discard("lim.keyed")
    with Timers(fakeredis.FakeRedis(server=server), shards=4) as t:
        t.schedule_many(TimerSpec("lim.keyed", [i], at=past, key=f"dev-{i % 3}")
                        for i in range(9))

        async def burst() -> None:
            listener = Listener(fakeredis.FakeAsyncRedis(server=server),
                                registry={"lim.keyed": _keyed})
            await asyncio.wait_for(listener.run(burst=True), 15)
            await listener.redis.aclose()

        with caplog.at_level("WARNING", logger="timers.listener"):
            asyncio.run(burst())
        assert t.stats().fired == 9
    assert not [r for r in caplog.records if "counted in each shard" in r.getMessage()]


def test_a_timer_moved_to_its_limits_shard_is_found_by_its_id(
        fake: fakeredis.FakeRedis) -> None:
    """A timer whose task declares a limit moves, at its first claim, to the shard of its
    limit (timers/listener/flow/placer.py): by id, the API looks there in a round trip more."""
    with Timers(fake, shards=4) as t:
        t.stats()  # fixes the layout
        elsewhere = (shard_of("moved", 4) + 1) % 4
        Scripts(fake, SHARDS[elsewhere]).schedule(
            [NewTimer("moved", "a.b;sh=0:[1]", "in", 60_000, "n")])
        found = t.get("moved")
        assert found is not None and found.args == [1]
        assert t.status("moved").state is TimerState.PENDING
        assert t.reschedule("moved", in_=5)
        assert t.cancel("moved") and not t.cancel("moved") and t.get("moved") is None
        assert t.status("moved").state is TimerState.CANCELLED
        assert t.status("never").state is TimerState.UNKNOWN


@timers.task(concurrency=1)
def _failing(i: int) -> None:
    """One at a time fleet-wide, and fails."""
    raise RuntimeError("no")


def test_a_timer_that_died_in_its_limits_shard_is_retried_there(
        caplog: pytest.LogCaptureFixture) -> None:
    server = fakeredis.FakeServer()
    past = datetime.now(UTC) - timedelta(seconds=1)
    home = shard_of_key("task:lim.fails", 4)
    timer_id = next(f"f{i}" for i in range(100) if shard_of(f"f{i}", 4) != home)
    with Timers(fakeredis.FakeRedis(server=server), shards=4) as t:
        t.schedule("lim.fails", [0], at=past, id=timer_id)

        async def burst() -> None:
            listener = Listener(fakeredis.FakeAsyncRedis(server=server),
                                registry={"lim.fails": _failing})
            await asyncio.wait_for(listener.run(burst=True), 15)
            await listener.redis.aclose()

        asyncio.run(burst())
        (failure,) = t.failed()
        assert t.get_failure(timer_id) is not None  # found in its limit's shard
        assert t.retry_failure(failure) == timer_id
        assert t.failed() == [] and t.get(timer_id) is not None
