"""Timers due beyond the near horizon on a real server: pended without their expiring key,
fired on time by the sweeper all the same (once each, across listeners), and keyed by a
listener as they come within the horizon. The horizon is shortened through
``<prefix>|near`` so the test does not wait an hour."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

import timers.listener.finding.near_keys
from tests.conftest import wait_until
from tests.integration.helpers import KEYS, run_counts, settled
from timers import Timers, TimerSpec
from timers.model.encoding import Record, entry_text

pytestmark = pytest.mark.integration


def key_of(timer_id: str, tag: str) -> str:
    return KEYS.timer_key(entry_text(timer_id, Record("record.hit", [tag]).encode()))


@pytest.fixture
def short_horizon(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> int:
    """A horizon of 1 s, and the listeners' keying turns every second (not every 30 s)."""
    monkeypatch.setattr(timers.listener.finding.near_keys, "NEAR_INTERVAL", 1.0)
    r.hset(KEYS.near, "horizon", 1000)
    return 1000


def test_timers_beyond_the_horizon_fire_once_each_with_no_key_ever_written(
        short_horizon: int, timers_client: Timers, r: redis.Redis, start_listener) -> None:
    ids = [f"far{i}" for i in range(200)]
    timers_client.schedule_many(TimerSpec("record.hit", [tid], id=tid, in_=1.5 + i / 100)
                                for i, tid in enumerate(ids))
    assert not any(r.exists(key_of(tid, tid)) for tid in ids)
    listeners = [start_listener(), start_listener()]

    wait_until(lambda: len(run_counts(r)) == 200 and settled(timers_client), 20,
               message="all 200 timers to fire")
    assert run_counts(r) == Counter({tid: 1 for tid in ids})
    reports = [f for listener in listeners for f in listener.reports()]
    assert sorted(f.timer_id for f in reports) == sorted(ids)
    assert timers_client.stats().counters.get("reruns", 0) == 0
    assert r.dbsize() > 0 and not r.keys(KEYS.timer_key_start + "*")


def test_a_listener_keys_the_timers_that_came_within_the_horizon(
        short_horizon: int, timers_client: Timers, r: redis.Redis, start_listener) -> None:
    ids = [f"n{i}" for i in range(300)]
    timers_client.schedule_many(TimerSpec("record.hit", [tid], id=tid, in_=120)
                                for tid in ids)
    assert not r.keys(KEYS.timer_key_start + "*")
    r.hdel(KEYS.near, "horizon")  # back to the default hour: they are all within it now
    start_listener()
    wait_until(lambda: all(r.exists(key_of(tid, tid)) for tid in ids), 10,
               message="the listener to write the keys of 300 timers now within the horizon")
    ttl = r.pttl(key_of("n0", "n0"))
    assert 100_000 < ttl <= 120_000  # each expires at its timer's due time
    assert timers_client.stats().pending == 300


def _refused(r: redis.Redis) -> int:
    """Commands the server refused for want of memory so far."""
    return int(r.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


def test_a_full_server_leaves_the_keys_unwritten_until_memory_is_back(
        short_horizon: int, timers_client: Timers, r: redis.Redis, start_listener) -> None:
    ids = [f"m{i}" for i in range(300)]
    timers_client.schedule_many(TimerSpec("record.hit", [tid], id=tid, in_=120)
                                for tid in ids)
    listener = start_listener()
    old = r.config_get("maxmemory*")
    refused_before = _refused(r)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        r.hdel(KEYS.near, "horizon")  # all 300 are within the default hour now
        # near.lua needs memory: a full server refuses it before its first write (the
        # heartbeat frees or keeps memory and goes on; nothing is due, so nothing claims)
        wait_until(lambda: _refused(r) >= refused_before + 2, 20,
                   message="the server to refuse two of the listener's keying turns")
        assert not r.keys(KEYS.timer_key_start + "*")
        assert listener.error is None and listener.subscribed
    finally:
        r.config_set("maxmemory", old["maxmemory"])
        r.config_set("maxmemory-policy", old["maxmemory-policy"])
    wait_until(lambda: all(r.exists(key_of(tid, tid)) for tid in ids), 15,
               message="the listener to key the 300 timers once memory is back")
    soon = timers_client.schedule("record.hit", ["soon"], in_=0.3)
    wait_until(lambda: run_counts(r)["soon"] == 1, 10, message="a timer due now to fire")
    assert timers_client.get(soon) is None and timers_client.stats().pending == 300
