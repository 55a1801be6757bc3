"""A listener sends a claim only when a timer is due: one at its concurrency limit does not
claim each time a run ends while nothing else is due (that was a script call per run, on a
busy fleet, for nothing)."""

from __future__ import annotations

import hashlib

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS
from timers import Timers, TimerSpec
from timers.store.lua_source import script_library, source

pytestmark = pytest.mark.integration

CLAIM_SHA = hashlib.sha1(source("claim").encode()).hexdigest()


CLAIM_FUNCTION = f"{script_library()[0]}_claim"


def claims_logged(r: redis.Redis) -> int:
    """Claims the server ran, as a function of the library or by EVALSHA."""
    return sum(1 for entry in r.slowlog_get(10_000)
               if entry["command"].startswith((f"FCALL {CLAIM_FUNCTION} ".encode(),
                                               f"EVALSHA {CLAIM_SHA}".encode())))


def test_a_full_listener_whose_runs_end_sends_no_claim_when_nothing_is_due(
        r: redis.Redis, redis_url: str, start_listener) -> None:
    # concurrency 1: the listener is full during each run; ten timers 250 ms apart, so
    # nothing is due when a run ends. A claim per timer takes it; one more per run end
    # (the old behaviour: 21 in all) doubles that. A loaded host adds an empty claim now
    # and then (an expired event read after the sweep took its timer): 11-12 quiet, 15
    # once in a full CI run.
    start_listener(tasks=TASKS, concurrency=1)
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 10_000)
    r.slowlog_reset()
    try:
        with Timers(redis_url) as t:
            t.schedule_many(TimerSpec("record.hit", [f"t{i}"], in_=0.3 + 0.25 * i)
                            for i in range(10))
            wait_until(lambda: t.stats().counters.get("fired") == 10, 10,
                       message="the ten timers to fire")
        claims = claims_logged(r)
    finally:
        r.config_set("slowlog-log-slower-than", 10_000)
        r.config_set("slowlog-max-len", 128)
    print(f"\n{claims} claims for 10 timers due one at a time, concurrency 1")
    assert claims <= 16, f"{claims} claims for 10 timers due one at a time"
