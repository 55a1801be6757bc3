"""The run history on Redis Cluster: timers on every shard of three primaries end
(completed, dead, cancelled) through a real listener process, and ``status(id)``,
``timers history`` (with ``--failed`` and ``--task``), ``timers get`` and the per-task
series read them back from every shard (a real cluster on loopback: tests/clusters.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.clusters import Cluster, real_cluster
from tests.conftest import wait_until
from tests.integration.helpers import TASKS, run_cli
from timers import Timers
from timers.model.encoding import escape_id
from timers.model.history import TimerState
from timers.model.keys import Keyspace
from timers.ops.shards import ShardLayout, shard_of
from timers.store.cluster import sync_cluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.one_server]

PRIMARIES = 3
SHARDS = ShardLayout(Keyspace("{timers}"), PRIMARIES, "timers").keyspaces
"""A shard per primary: the default on a cluster."""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with real_cluster(PRIMARIES, replicas=False) as c:
        yield c


def ids_on_every_shard(stem: str, per_shard: int) -> list[str]:
    """``per_shard`` ids ``<stem>-<n>`` on each shard, shard by shard."""
    found: list[list[str]] = [[] for _ in range(PRIMARIES)]
    n = 0
    while any(len(ids) < per_shard for ids in found):
        timer_id = f"{stem}-{n}"
        ids = found[shard_of(timer_id, PRIMARIES)]
        if len(ids) < per_shard:
            ids.append(timer_id)
        n += 1
    return [timer_id for ids in found for timer_id in ids]


def listed(*args: str, url: str) -> list[list[str]]:
    """``timers history ARGS``: its rows (after the header), split into columns."""
    done = run_cli("history", *args, "--url", url)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["ENDED", "(UTC)"], done.stdout
    return [line.split() for line in lines[1:]]


def burst(url: str) -> None:
    """A listener process, till nothing is due, keeping the history two days."""
    done = run_cli("listen", "--burst", "--url", url, "--tasks", TASKS, "--history-age",
                   "2d", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr


def test_history_status_and_series_read_every_shard(cluster: Cluster) -> None:
    url = cluster.url
    done = ids_on_every_shard("ok", 2)
    dead, cancelled = ids_on_every_shard("dead", 1)[1], ids_on_every_shard("off", 1)[2]
    with Timers(url) as t:
        burst(url)  # nothing ended on any shard yet: the retention is stored on each
        t.schedule("record.late", [cancelled, 0], in_=3600, id=cancelled)
        assert t.cancel(cancelled)  # kept for the listener's two days, not the default
        t.schedule_many([{"task": "record.hit", "args": [i], "in_": 0, "id": i} for i in done])
        t.schedule("fail.boom", [dead], in_=0, id=dead)
        burst(url)

        for timer_id in done:
            assert t.status(timer_id).state is TimerState.COMPLETED, timer_id
        ended = t.status(dead)
        assert ended.state is TimerState.DEAD and ended.ended is not None
        assert ended.ended.error.startswith("TaskBroke: boom"), ended.ended
        assert t.status(cancelled).state is TimerState.CANCELLED
        assert t.status("never-was").state is TimerState.UNKNOWN
        assert {r.id for r in t.history()} == {*done, dead, cancelled}

        # each shard keeps its own: every record on its timer's shard, kept for the age
        with sync_cluster(url) as client:
            for index, keys in enumerate(SHARDS):
                mine = {i for i in (*done, dead, cancelled) if shard_of(i, PRIMARIES) == index}
                kept = {escape_id(i) for i in mine}
                assert {k.decode() for k in client.hkeys(keys.history_records)} == kept, index
                ends = dict(client.zrange(keys.history, 0, -1, withscores=True))
                expiries = dict(client.zrange(keys.history_expiry, 0, -1, withscores=True))
                listed_ids = {i for b in client.hmget(keys.history_batches, list(ends))
                              for i in b.decode().split(":")}
                assert listed_ids == kept, index  # every record indexed by its batch there
                assert {b: expiries[b] - ends[b] for b in ends} == {
                    b: 2 * 86_400_000 for b in ends}
                assert client.get(keys.history_retention) == b"172800000 100000", index

        # the listener's series: the runs of every shard, summed per task
        wait_until(lambda: sum(m.runs for m in t.series("record.hit", 2)) == len(done), 10,
                   message="the series to count every run")
        assert sum(m.failures for m in t.series("fail.boom", 2)) == 1
        assert sum(m.runs for m in t.series(minutes=2)) == len(done) + 1
        assert set(t.tasks_seen()) == {"record.hit", "fail.boom"}

    rows = listed(url=url)
    assert {row[3] for row in rows} == {*done, dead, cancelled}
    assert [row[3] for row in listed("--failed", url=url)] == [dead]
    assert {row[3] for row in listed("--task", "record.hit", url=url)} == set(done)
    assert [row[3] for row in listed("--task", "record.late", url=url)] == [cancelled]
    got = run_cli("get", dead, "--url", url)
    assert got.returncode == 0 and "status:   dead" in got.stdout, got.stdout + got.stderr
    unknown = run_cli("get", "never-was", "--url", url)
    assert unknown.returncode == 1 and "never-was: unknown" in unknown.stderr


def test_a_task_count_holds_per_shard(cluster: Cluster) -> None:
    url = cluster.url
    counted = ids_on_every_shard("n", 4)  # four on each shard: each keeps its newest three
    with Timers(url) as t:
        t.schedule_many([{"task": "record.counted", "args": [i], "in_": 0, "id": i}
                         for i in counted])
        burst(url)
        kept = {r.id for r in t.history(task="record.counted")}
        assert len(kept) == 3 * PRIMARIES
        assert sum(t.status(i).state is TimerState.UNKNOWN for i in counted) == PRIMARIES
        off = ids_on_every_shard("off", 1)[0]
        t.schedule("record.counted", [off], in_=3600, id=off)
        assert t.cancel(off)  # its shard's task zset is asked for, then written
        assert off in {r.id for r in t.history(task="record.counted")}
        with sync_cluster(url) as client:
            for index, keys in enumerate(SHARDS):
                assert client.zcard(keys.history_task("record.counted")) == 3, index
                assert client.hlen(keys.history_records) == 3, index
