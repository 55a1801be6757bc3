"""The history's bounds kept by the listener idle or not, a bounded step at a time
(``trim.lua``, :class:`timers.listener.endings.history.HistoryTrimmer`), and the filtered reads
from its indexes (``timers history --failed``, ``--task``), records written before the
indexes included. On fakeredis: no process, no traffic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import fakeredis
import pytest

import timers.ops.history
from tests.conftest import wait_until_async
from tests.history_layout import records_of, write_history
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.helpers import redis_now_ms
from timers import Listener, Timers
from timers.listener.endings import history
from timers.listener.endings.history import TRIM_BUDGET, HistoryPolicy, HistoryTrimmer
from timers.model.keys import Keyspace
from timers.store.scripts import Scripts

DAY_MS = 86_400_000
BATCH = 8


def fill(fake: fakeredis.FakeRedis, ks: Keyspace, n: int, *, expired: bool = False,
         indexed: bool = True, prefix: str = "r", dead_every: int = 0,
         rare: dict[int, str] | None = None, ago_ms: int = 60_000, batch: int = BATCH) -> None:
    """``n`` records, written ``ago_ms`` ago (:func:`records_of`)."""
    now = redis_now_ms(fake)
    write_history(fake, ks, records_of(n, now - ago_ms, prefix=prefix, dead_every=dead_every,
                                       rare=rare),
                  ended_ms=now - ago_ms, expiry_ms=now - 1 if expired else now + DAY_MS,
                  batch=batch, indexed=indexed)


async def steps(server: fakeredis.FakeServer, ks: Keyspace, count: int,
                budget: int = TRIM_BUDGET) -> list[int]:
    """One trimmer's calls till none owes more: the records each dropped or indexed."""
    client = fakeredis.FakeAsyncRedis(server=server)
    trimmer = HistoryTrimmer(Scripts(client, ks), HistoryPolicy(count=count), asyncio.Event(),
                             budget=budget)
    done: list[int] = []
    while True:
        n, more = await trimmer.step()
        done.append(n)
        if not more:
            break
    await client.aclose()
    return done


async def idle_listener(server: fakeredis.FakeServer, history: HistoryPolicy,
                        until: object, message: str) -> None:
    """A listener with nothing to run, until ``until()`` holds (else the test fails)."""
    listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                        search_path=str(ROOT), history=history)
    stop = asyncio.Event()
    running = asyncio.create_task(listener.run(stop))
    try:
        await wait_until_async(until, 20.0, message=message)  # type: ignore[arg-type]
    finally:
        stop.set()
        await asyncio.wait_for(running, 10.0)
        await listener.redis.aclose()


def test_a_lowered_count_is_reached_in_bounded_steps_and_keeps_the_newest(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    fill(fake, ks, 3000, dead_every=10)
    done = asyncio.run(steps(server, ks, 1000))
    assert sum(done) == 2000 and max(done) <= TRIM_BUDGET  # about 8 calls, none more
    assert len(done) >= 2000 // TRIM_BUDGET
    assert fake.hlen(ks.history_records) == 1000
    kept = {r.id for r in producer.history(limit=5000)}
    assert kept == {f"r{i}" for i in range(2000, 3000)}  # the newest
    # the indexes lose what the history lost
    assert fake.zcard(ks.history_task("reminders.sms")) == 1000
    assert fake.zcard(ks.history_failed) == 100
    assert fake.zcard(ks.history) == 1000 // BATCH


def test_a_trim_says_when_the_history_is_empty_and_only_then(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    """An empty history is said so (its trimmer then waits long); one with records, or one
    a call has just emptied of expired records, only once nothing is left."""
    ks = producer.keys

    async def emptiness() -> bool:
        client = fakeredis.FakeAsyncRedis(server=server)
        trimmer = HistoryTrimmer(Scripts(client, ks), HistoryPolicy(count=10), asyncio.Event())
        while (await trimmer.step())[1]:
            pass
        await client.aclose()
        return trimmer.empty

    assert asyncio.run(emptiness()) is True
    fill(fake, ks, 20)
    assert asyncio.run(emptiness()) is False  # 10 kept
    fake.delete(ks.history, ks.history_expiry, ks.history_batches)
    assert asyncio.run(emptiness()) is False  # records left, though no batch names them
    fake.delete(ks.history_records)
    fill(fake, ks, 30, expired=True)
    assert asyncio.run(emptiness()) is True  # all expired: dropped, then empty


def test_an_idle_listener_trims_to_its_count(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis) -> None:
    ks = Keyspace("timers")
    fill(fake, ks, 2000)
    asyncio.run(idle_listener(server, HistoryPolicy(count=500),
                              lambda: fake.hlen(ks.history_records) == 500,
                              "the history down to its count"))


def test_an_idle_listener_drops_records_past_their_age(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    fill(fake, ks, 400, expired=True, prefix="old")
    fill(fake, ks, 100, prefix="new")
    asyncio.run(idle_listener(server, HistoryPolicy(),
                              lambda: fake.hlen(ks.history_records) == 100,
                              "the expired records dropped"))
    assert {r.id for r in producer.history(limit=1000)} == {f"new{i}" for i in range(100)}
    assert fake.zcard(ks.history_task("reminders.sms")) == 100


def test_two_trimmers_with_different_counts_end_at_the_lower(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis) -> None:
    ks = Keyspace("timers")
    fill(fake, ks, 3000)

    async def both() -> None:
        await asyncio.gather(steps(server, ks, 1200), steps(server, ks, 700))

    asyncio.run(both())
    assert fake.hlen(ks.history_records) == 700
    assert fake.zcard(ks.history_task("reminders.sms")) == 700


@pytest.fixture
def short_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filtered reads look at no more than 300 records one by one (written one a batch,
    as ended one at a time): a client scan would miss what is older."""
    monkeypatch.setattr(timers.ops.history, "HISTORY_SCAN", 300)


@pytest.mark.usefixtures("short_scan")
def test_failed_and_a_rare_tasks_history_come_from_the_index(
        fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    fill(fake, ks, 2000, dead_every=400, rare={0: "rare.task", 1500: "rare.task"}, batch=1)
    assert {r.id for r in producer.history(task="rare.task")} == {"r0", "r1500"}
    failed = producer.history(failed=True)
    assert [r.id for r in failed] == ["r1600", "r1200", "r800", "r400", "r0"]
    assert producer.history(failed=True, task="rare.task")[0].id == "r0"
    assert [r.id for r in producer.history(task="rare.task", limit=1)] == ["r1500"]


@pytest.mark.usefixtures("short_scan")
def test_records_written_before_the_index_are_indexed_by_the_trimmer(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    fill(fake, ks, 2000, indexed=False, prefix="old", dead_every=500, rare={3: "rare.task"},
         batch=1)
    done = asyncio.run(steps(server, ks, 100_000))
    assert sum(done) == 2000 and max(done) <= TRIM_BUDGET
    assert {r.id for r in producer.history(task="rare.task")} == {"old3"}
    assert len(producer.history(failed=True)) == 4
    # new ends after the cursor, written by a listener of 0.1.0, still read
    fill(fake, ks, 10, indexed=False, prefix="late", rare={9: "rare.task"}, ago_ms=0)
    assert "late9" in {r.id for r in producer.history(task="rare.task")}


def test_a_batch_whose_ids_ended_again_or_lost_their_records_is_trimmed_all_the_same(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    """A batch past its age whose ids are no longer all its own: ``r1``'s record is gone (a
    task's own count dropped it as it was written), ``r0`` (a dead end) ended again since,
    completed, in a newer batch. The trim drops the batch's live records, keeps ``r0``'s
    newer end, and takes ``r0``'s stale entry out of the failed zset (``--failed``)."""
    ks = producer.keys
    fill(fake, ks, BATCH, expired=True, dead_every=BATCH, ago_ms=120_000)
    assert fake.zrange(ks.history_failed, 0, -1) == [b"r0"]
    fake.hdel(ks.history_records, "r1")
    now = redis_now_ms(fake)
    write_history(fake, ks, records_of(1, now - 1_000), ended_ms=now - 1_000,
                  expiry_ms=now + DAY_MS)
    done = asyncio.run(steps(server, ks, 100_000))
    assert sum(done) == BATCH - 2
    assert fake.hkeys(ks.history_records) == [b"r0"]
    assert fake.zcard(ks.history_failed) == 0, "r0's newest end is not a dead end"
    assert producer.history(failed=True) == []
    assert [(r.id, r.outcome.name) for r in producer.history()] == [("r0", "COMPLETED")]


class CountedTrims:
    """A shard's scripts whose every trim call finds nothing owed and drops ``dropped``
    (``empty``: and the history empty)."""

    def __init__(self, dropped: int = 0, empty: bool = False) -> None:
        self.calls, self.dropped, self.empty = 0, dropped, empty

    async def trim(self, count: int, budget: int) -> tuple[int, int, int]:
        self.calls += 1
        return self.dropped, 0, int(self.empty)


def test_an_idle_listener_trims_ever_less_often_and_one_that_writes_each_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle, a trim call every half minute at most (the idle bench's commands), not every
    second, and none for five minutes after one that found the history empty; a listener
    that writes history, or whose calls still drop records, trims each second. The waits
    are counted, not slept: each pause of the loop is one second here."""
    async def seconds_of(scripts: CountedTrims, writes: bool, seconds: int = 120) -> int:
        closed, waited = asyncio.Event(), []
        trimmer = HistoryTrimmer(scripts, HistoryPolicy(count=10), closed)

        async def one_second(wait: float, until: asyncio.Event) -> None:
            assert wait == history.TRIM_EVERY
            waited.append(wait)
            if writes:
                trimmer.written()
            if len(waited) >= seconds:
                closed.set()

        monkeypatch.setattr(history, "pause", one_second)
        await trimmer.run()
        return scripts.calls

    # in 120 s: 1 at the start, then after 2, 4, 8, 16, 30 and 30 seconds of nothing
    assert asyncio.run(seconds_of(CountedTrims(), writes=False)) == 7
    assert asyncio.run(seconds_of(CountedTrims(), writes=True)) == 120
    assert asyncio.run(seconds_of(CountedTrims(dropped=5), writes=False)) == 120
    # empty: 1 at the start, the next after 300 s of nothing; writing, each second again
    assert asyncio.run(seconds_of(CountedTrims(empty=True), writes=False, seconds=299)) == 1
    assert asyncio.run(seconds_of(CountedTrims(empty=True), writes=False, seconds=301)) == 2
    assert asyncio.run(seconds_of(CountedTrims(empty=True), writes=True)) == 120


class Ticks:
    """The trim loop's waits, each one second of the loop's count, ended by the test."""

    def __init__(self) -> None:
        self.given = self.taken = 0
        self.changed = asyncio.Condition()

    async def pause(self, seconds: float, until: asyncio.Event) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.given > self.taken)
            self.taken += 1
            self.changed.notify_all()

    async def tick(self, n: int = 1) -> None:
        """End ``n`` waits, one after another."""
        for _ in range(n):
            async with self.changed:
                self.given += 1
                self.changed.notify_all()
                await self.changed.wait_for(lambda: self.taken == self.given)

    async def release(self) -> None:
        async with self.changed:
            self.given += 10**6
            self.changed.notify_all()


async def trimmed(condition: Callable[[], bool], within: float) -> bool:
    """Whether ``condition`` comes true within ``within`` seconds (the loop runs on)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def test_a_listener_that_writes_after_a_long_idle_trims_its_writes_at_once(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its trim loop waited longer and longer while idle; the endings it writes bring the
    next trim call after a wait or two (:data:`TRIM_EVERY` each), not after the idle one
    (127 waits on). The waits are the test's to end (:class:`Ticks`), none slept."""
    ticks = Ticks()
    monkeypatch.setattr(history, "pause", ticks.pause)
    monkeypatch.setattr(history, "TRIM_IDLE_MAX", 3600.0)
    ks = producer.keys

    async def idle_then_busy() -> None:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), tasks=SAMPLE_TASKS,
                            search_path=str(ROOT), history=HistoryPolicy(count=5))
        stop = asyncio.Event()
        running = asyncio.create_task(listener.run(stop))
        try:
            await ticks.tick(127)  # idle: trim calls after 2, 4, … 64 waits; the next at 254
            for i in range(20):
                producer.schedule("mod.add", [i, 1], in_=0, id=f"w{i}")
            await wait_until_async(lambda: fake.hlen(ks.history_records) == 20, 10.0,
                                   message="20 runs in the history")
            # the listener hears of its last write a moment after Redis has it: the wait
            # that ends first may have begun before, so a trim call comes within two waits
            # (how exactly it keeps the count is trim.lua's, tested above)
            for _ in range(3):
                await ticks.tick()
                if await trimmed(lambda: fake.hlen(ks.history_records) < 20, 1.0):
                    break
            assert fake.hlen(ks.history_records) < 20, "a trim call within a few waits"
        finally:
            stop.set()
            await ticks.release()
            await asyncio.wait_for(running, 10.0)
            await listener.redis.aclose()

    asyncio.run(idle_then_busy())


@pytest.mark.parametrize("scan", [300, 100_000])
def test_a_read_of_the_failed_index_looks_at_no_more_than_its_scan_allows(
        monkeypatch: pytest.MonkeyPatch, fake: fakeredis.FakeRedis, producer: Timers,
        scan: int) -> None:
    """1,000 entries of ``--failed``'s index newer than the one dead timer name records no
    longer kept: a read looks at the first ``HISTORY_SCAN`` of them, 100 a round trip, and
    finds the dead timer behind them only when the scan reaches that far."""
    monkeypatch.setattr(timers.ops.history, "HISTORY_SCAN", scan)
    monkeypatch.setattr(timers.ops.history, "HISTORY_PAGE", 100)
    ks = producer.keys
    fill(fake, ks, 1, dead_every=1)
    assert [r.id for r in producer.history(failed=True)] == ["r0"]
    newer = redis_now_ms(fake) - 1000
    fake.zadd(ks.history_failed, {f"gone{i}": newer + i for i in range(1000)})
    assert [r.id for r in producer.history(failed=True)] == ([] if scan == 300 else ["r0"])
