"""On Redis Cluster: producers, listeners and ``timers check`` through a ``redis+cluster://``
URL, with the timers sharded over every primary, through a failover (``CLUSTER FAILOVER``
and ``kill -9``) and a slot migration mid-run (a real cluster of three primaries with a
replica each on loopback: tests/clusters.py).

The timers of the prefix ``timers`` are split into a shard per primary (the default on a
cluster): ``{timers#0.k}`` to ``{timers#2.k}``, each one hash slot, one on each primary. Runs are
recorded on the suite's own server (``$TIMERS_TEST_URL``), so what the tasks saw survives
the cluster's changes. Lateness is printed, never asserted (bench/cluster.py measures it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from tests.clusters import Cluster, migrate_slot, real_cluster
from tests.conftest import wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes, run_cli, runs, settled
from timers import AsyncTimers, Timers, TimerSpec, UnknownFormat
from timers.model.keys import Keyspace
from timers.ops.shards import ShardLayout, shard_of
from timers.store.cluster import sync_cluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.one_server]

TASKS = "tests.task_pkg"
EXPIRED = "__keyevent@0__:expired"
PRIMARIES = 3
SHARDS = [k.prefix for k in ShardLayout(Keyspace("{timers}"), PRIMARIES, "timers").keyspaces]
"""By default a prefix gets a shard per primary, when it is first used."""
MANY = 20_000


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with real_cluster() as c:
        yield c


def listeners(processes: Processes, url: str, n: int) -> list[subprocess.Popen[bytes]]:
    procs = [processes.spawn(TIMERS_COMMAND, "listen", "--url", url, "--tasks", TASKS,
                             "--lease", "2") for _ in range(n)]
    with Timers(url) as t:
        wait_until(lambda: len(t.listeners()) >= n, 30, message=f"{n} listeners to start")
    return procs


def node_of(c: Cluster, key: str) -> int:
    """The port of the primary that holds ``key``'s slot now."""
    with sync_cluster(c.url) as client:
        return int(client.get_node_from_key(key).port)  # type: ignore[attr-defined]


def schedule_spread(url: str, n: int, start: float, span: float) -> float:
    """``n`` timers due evenly from ``start`` to ``start + span`` seconds from now, each
    told its due time (epoch ms) to record its lateness; returns when the last is due."""
    first = time.time() + start
    with Timers(url) as t:
        t.schedule_many(TimerSpec("record.late", [f"f{i}", (first + span * i / n) * 1000],
                                  id=f"f{i}", at=datetime.fromtimestamp(first + span * i / n, UTC))
                        for i in range(n))
    return first + span


def lateness(r: redis.Redis) -> str:
    late = sorted(float(run[1]) for run in runs(r))
    return f"lateness p50 {late[len(late) // 2]:.1f} / p99 {late[int(len(late) * .99)]:.1f} ms"


def test_every_call_and_the_listeners_work_on_a_sharded_cluster(
        cluster: Cluster, r: redis.Redis, processes: Processes) -> None:
    last_due = schedule_spread(cluster.url, MANY, 2.0, 10.0)
    with Timers(cluster.url) as t:
        kept = t.schedule("record.hit", ["cancelled"], in_=60)
        assert t.get(kept) is not None and t.cancel(kept) and t.get(kept) is None
        # counted before any listener runs: a shard's figures are read in one pipeline,
        # not one transaction, so a claim between two of its reads would hide a timer
        assert t.stats().pending == MANY
        listeners(processes, cluster.url, 3)
        holders = {node_of(cluster, f"{s}|due") for s in SHARDS}
        assert holders == {p.port for p in cluster.primaries}  # the shards use every primary
        for primary in cluster.primaries:  # each listener hears every primary's events
            with redis.Redis(port=primary.port) as node:
                # (a listener's heartbeat can come before its subscriptions to every node)
                wait_until(lambda node=node: node.pubsub_numsub(EXPIRED)[0][1] >= 3, 10,
                           message=f"3 listeners to subscribe on node {primary.port}")
        wait_until(lambda: r.llen("test:runs") >= MANY, last_due - time.time() + 30,
                   message=f"{MANY:,} timers to fire")
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
        assert t.stats().fired == MANY
    assert Counter(run[0] for run in runs(r)) == {f"f{i}": 1 for i in range(MANY)}
    with sync_cluster(cluster.url) as client:
        assert client.get("{timers}|shards") == str(PRIMARIES).encode()
    print(f"\n{MANY:,} timers over 2..12 s on 3 primaries ({len(SHARDS)} shards), 3 listeners: "
          f"all once; "
          f"{lateness(r)}")


def test_the_asyncio_client_works_on_a_cluster(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with AsyncTimers(cluster.url) as t:
            one = await t.schedule("reminders.sms", [1], in_=60)
            many = await t.schedule_many(
                [TimerSpec("reminders.sms", [i], in_=60) for i in range(300)])
            assert (await t.get(one)) is not None and len(many) == 300
            assert (await t.stats()).pending == 301
            assert len(await t.list(1000)) == 301
            assert await t.cancel(one) and not await t.cancel(one)
            assert (await t.stats()).pending == 300

    asyncio.run(scenario())


def test_a_lookup_on_every_shard_reloads_the_scripts_a_primary_lost(cluster: Cluster) -> None:
    """A cancel or reschedule of a timer its own shard does not hold asks the other shards in
    one pipeline; a primary whose script cache was emptied after the client loaded its
    scripts there (``SCRIPT FLUSH``, or a replica promoted that never loaded them) answers
    that pipeline NOSCRIPT: the scripts are loaded again and the pipeline sent once more,
    by the sync client and the asyncio one alike."""

    def flush_the_others(timer_id: str) -> None:
        home = node_of(cluster, f"{SHARDS[shard_of(timer_id, PRIMARIES)]}|due")
        for primary in cluster.primaries:
            if primary.port != home:
                with redis.Redis(port=primary.port) as node:
                    node.script_flush()

    with Timers(cluster.url) as t:
        gone = t.schedule("reminders.sms", [1], in_=60)
        assert t.cancel(gone)
        assert not t.cancel(gone) and not t.reschedule(gone, in_=5)  # (scripts loaded)
        flush_the_others(gone)
        assert not t.cancel(gone) and not t.reschedule(gone, in_=5)

    async def scenario() -> None:
        async with AsyncTimers(cluster.url) as t:
            gone = await t.schedule("reminders.sms", [1], in_=60)
            assert await t.cancel(gone)
            assert not await t.cancel(gone) and not await t.reschedule(gone, in_=5)
            flush_the_others(gone)
            assert not await t.cancel(gone)
            flush_the_others(gone)
            assert not await t.reschedule(gone, in_=5)

    asyncio.run(scenario())


def test_the_data_format_is_one_key_of_the_home_shard_and_a_newer_one_is_refused(
        cluster: Cluster, processes: Processes) -> None:
    """A listener gives the sharded prefix its format in the home shard (``{timers}``,
    beside the shard count); on a newer one a listener exits with one line and producers,
    sync and asyncio, refuse to write."""
    with Timers(cluster.url) as t:
        t.schedule("record.hit", ["before"], in_=0)
    first = processes.spawn(TIMERS_COMMAND, "listen", "--burst", "--url", cluster.url,
                            "--tasks", TASKS)
    assert first.wait(60) == 0, processes.output(first)
    with sync_cluster(cluster.url) as client:
        assert client.get("{timers}|format") == b"1"
        assert all(client.get(f"{s}|format") is None for s in SHARDS)
        client.set("{timers}|format", "2")
    refused = processes.spawn(TIMERS_COMMAND, "listen", "--burst", "--url", cluster.url,
                              "--tasks", TASKS)
    assert refused.wait(60) == 1
    assert "error: {timers}|format holds data format 2" in processes.output(refused)
    with Timers(cluster.url) as t, pytest.raises(UnknownFormat, match="this producer knows"):
        t.schedule("record.hit", ["refused"], in_=60)

    async def scenario() -> None:
        async with AsyncTimers(cluster.url) as t:
            with pytest.raises(UnknownFormat, match="this producer knows"):
                await t.schedule("record.hit", ["refused"], in_=60)
            assert (await t.stats()).pending == 0

    asyncio.run(scenario())


def test_a_listener_keys_far_timers_as_they_come_within_the_horizon_on_a_cluster(
        cluster: Cluster, processes: Processes) -> None:
    with sync_cluster(cluster.url) as client, Timers(cluster.url) as t:
        t.stats()  # fixes the layout
        for shard in SHARDS:
            client.hset(f"{shard}|near", "horizon", 1000)  # as if an hour were a second
        t.schedule_many(TimerSpec("record.hit", [f"f{i}"], id=f"f{i}", in_=120)
                        for i in range(300))

        def keyed() -> int:
            return sum(_count(p.port, "{timers#*}:*") for p in cluster.primaries)

        assert keyed() == 0  # beyond the horizon: no keys
        for shard in SHARDS:
            client.hdel(f"{shard}|near", "horizon")  # within the default hour now
        listeners(processes, cluster.url, 1)
        wait_until(lambda: keyed() == 300, 20,
                   message="the listener to key the 300 timers in every shard")
        assert t.stats().pending == 300


def test_check_reads_every_node_and_names_each(cluster: Cluster) -> None:
    replica = cluster.replicas[0]
    with redis.Redis(port=replica.port) as r:
        r.config_set("notify-keyspace-events", "")
    result = run_cli("check", "--url", cluster.url)
    out = result.stdout + result.stderr
    for server in cluster.primaries:
        assert f"primary 127.0.0.1:{server.port}" in out, out
    assert any(line.startswith("WARN") and f"replica 127.0.0.1:{replica.port}" in line
               and "notify-keyspace-events" in line for line in out.splitlines()), out


@pytest.mark.parametrize("how", ["CLUSTER FAILOVER", "kill -9"])
def test_a_failover_of_a_primary_mid_run_loses_nothing(
        cluster: Cluster, r: redis.Redis, processes: Processes, how: str) -> None:
    procs = listeners(processes, cluster.url, 3)
    last_due = schedule_spread(cluster.url, MANY, 2.0, 10.0)
    port = node_of(cluster, f"{SHARDS[0]}|due")
    replica = next(s for s in cluster.replicas if _replica_of(s.port) == f"127.0.0.1:{port}")
    with redis.Redis(port=port) as primary:
        assert primary.execute_command("WAIT", 1, 10_000) == 1  # the replica has them all
    wait_until(lambda: r.llen("test:runs") >= MANY // 4, 30, message="some timers to fire")
    before = r.llen("test:runs")  # runs recorded before the primary went
    if how == "kill -9":
        server = next(s for s in cluster.primaries if s.port == port)
        os.kill(server.pid or 0, signal.SIGKILL)
    else:
        with redis.Redis(port=replica.port) as rep:
            rep.execute_command("CLUSTER", "FAILOVER")
    wait_until(lambda: _role(replica.port) == "master", 30, message="the replica's promotion")

    wait_until(lambda: len({run[0] for run in runs(r)}) >= MANY, last_due - time.time() + 60,
               message="every timer to fire after the failover")
    fired = Counter(run[0] for run in runs(r))
    assert set(fired) == {f"f{i}" for i in range(MANY)}
    for p in procs:
        assert p.poll() is None, processes.output(p)
    with redis.Redis(port=replica.port) as new_primary:
        wait_until(lambda: new_primary.pubsub_numsub(EXPIRED)[0][1] >= 3, 20,
                   message="the listeners to subscribe to the new primary's events")
    with Timers(cluster.url) as t:
        counters = t.stats().counters
    # a run in flight on the failed node runs again: after its lease (a rerun), or, when
    # the claim had not reached the replica yet, as a claim anew whose first run's end
    # finds no lease (a late finish). A kill -9 also loses what the dead node acknowledged
    # and had not yet passed on (a claim and its end both): such a timer runs again with
    # nothing counted. Either way only runs of the moments before the failover run twice.
    reruns = counters.get("reruns", 0) + counters.get("late_finishes", 0)
    twice = sum(n - 1 for n in fired.values() if n > 1)
    print(f"\n{how} of a primary with {MANY:,} timers over 2..12 s, 3 listeners: all fired; "
          f"{twice} ran twice ({counters.get('reruns', 0)} reruns and "
          f"{counters.get('late_finishes', 0)} late finishes counted); {lateness(r)}")
    first_runs: dict[str, int] = {}
    for i, run in enumerate(runs(r)):
        first_runs.setdefault(run[0], i)
    early = [tag for tag, n in fired.items() if n > 1 and first_runs[tag] < before - 2000]
    assert not early, f"ran twice though their first run was long before the failover: {early}"
    if how == "CLUSTER FAILOVER":  # a handover loses no write: every second run is counted
        assert twice <= reruns, "a timer ran twice with neither a rerun nor a late finish"


def test_a_shard_migrating_to_another_primary_mid_run_loses_nothing(
        cluster: Cluster, r: redis.Redis, processes: Processes) -> None:
    procs = listeners(processes, cluster.url, 3)
    last_due = schedule_spread(cluster.url, 5000, 1.0, 5.0)
    with sync_cluster(cluster.url) as client:
        slot = int(client.keyslot(f"{SHARDS[1]}|due"))
    source = node_of(cluster, f"{SHARDS[1]}|due")
    target = next(p.port for p in cluster.primaries if p.port != source)
    wait_until(lambda: r.llen("test:runs") >= 1000, 30, message="some timers to fire")
    moved = migrate_slot(cluster, slot, target, batch=20, pause=0.01)
    assert node_of(cluster, f"{SHARDS[1]}|due") == target
    wait_until(lambda: len({run[0] for run in runs(r)}) >= 5000, last_due - time.time() + 30,
               message="every timer to fire after the migration")
    fired = Counter(run[0] for run in runs(r))
    assert set(fired) == {f"f{i}" for i in range(5000)}
    assert max(fired.values()) == 1, "a timer ran twice through a migration"
    for p in procs:
        assert p.poll() is None, processes.output(p)
    with Timers(cluster.url) as t:
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
    print(f"\nslot of shard 1 moved ({moved} keys) mid-run: 5,000 timers all once; "
          f"{lateness(r)}")


def _count(port: int, pattern: str) -> int:
    with redis.Redis(port=port) as node:
        return len(node.keys(pattern))


def _replica_of(port: int) -> str:
    with redis.Redis(port=port, decode_responses=True) as rep:
        info = rep.info("replication")
    return f"{info.get('master_host')}:{info.get('master_port')}"


def _role(port: int) -> str:
    try:
        with redis.Redis(port=port, decode_responses=True) as node:
            return str(node.info("replication")["role"])
    except redis.exceptions.RedisError:
        return "unknown"
