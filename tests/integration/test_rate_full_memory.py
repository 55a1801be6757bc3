"""A rate limit through a full server (invariant 13, finding 4 of issue 28): a listener whose
gate call Redis refuses for want of memory (``maxmemory`` reached, ``noeviction``) hands
its claimed run back, and the rate's starts stay an interval apart when memory frees.

The listeners use a server of their own, filled in advance (``fill:*`` keys) with no cap.
Each time the rate's next slot is given to a timer (its pacer) and a listener has claimed
it, the test caps memory under what is used (one ``CONFIG SET``: the server is full at
once, between the claim and the gate), so the gate is refused and the run handed back
(``finish.lua`` ``release``, which a full server lets through). Memory stays short until
the pacer's slot lies a few intervals behind on the Redis clock, while claims and gates
are refused, and is then freed (the cap lifted).

The starts are the gate's own (every ``last`` it writes to the rate's hash, read off
``MONITOR``: :class:`RateStarts`); the bound is the interval less the gate's 5 ms of
jitter. The time each task reads on entry adds its listener's dispatch to that and is
only reported. Without the pacer's floor (a paid start moves the rate's next slot to an
interval, less 5 ms, after itself: ``gate.lua``, T7) the pacer handed back started when
memory freed, and the next slot was the one it had been given, long past: two starts 0 to
6 ms apart at this 100 ms interval (finding 4 saw 16.7 ms)."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import KEYS, TASKS, Processes, redis_now_ms, settled
from tests.integration.rate_starts import RateStarts
from tests.integration.test_flow import listeners
from tests.task_pkg import RUNS
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.flow.names import TASK_KEY
from timers.model.wire import Counter as Counted

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TASK = "flow.paced"  # 600/m: records [tag, priority, pid, entry ms, start ms], Redis clock
TIMERS = 60
INTERVAL_MS = 100  # 600/m
JITTER_MS = 5  # gate.lua RATE_JITTER_MS: how much closer than its interval a start may come
HAND_BACKS = 3
"""Full-memory episodes in which a claimed pacer was handed back."""
FULL_FOR_INTERVALS = 3
"""Each episode keeps the server full until the handed-back pacer's slot lies this many of
the rate's intervals in the past on the Redis clock: once memory frees, the slot it had
been given is long past (what the pacer's floor is for)."""


def runs_seen(r: redis.Redis) -> list[tuple[str, float]]:
    """``(tag, ms the task read on entry, Redis clock)`` of every run so far."""
    return [(tag, entry) for tag, _, _, entry, _ in (json.loads(x) for x in r.lrange(RUNS, 0, -1))]


def handed_back(broker: redis.Redis) -> int:
    return int(broker.hget(KEYS.stats, Counted.HANDED_BACK.value) or 0)


def pacer_claimed(broker: redis.Redis) -> bool:
    """Whether the rate's next slot is a timer's (its pacer) that a listener has claimed
    and not gated yet (its record is out of ``P|rec`` while it runs)."""
    pacer = broker.hget(KEYS.rate(TASK_KEY + TASK), "pacer")
    return pacer is not None and not broker.hexists(KEYS.records, pacer)


def full_while_the_pacer_is_claimed(broker: redis.Redis) -> bool:
    """Fill the server the moment a listener has claimed the rate's pacer, keep it full
    until the pacer's slot is :data:`FULL_FOR_INTERVALS` intervals past on the Redis clock,
    then free it. Whether the pacer was handed back (else its gate came first)."""
    wait_until(lambda: pacer_claimed(broker), 10, interval=0.0002,
               message="a listener to claim the rate's pacer")
    # the rate's next slot is an interval after the pacer's (flow.lua promote_rate); read
    # now, it may already be a later pacer's: the wait below is then only longer
    tat = broker.hget(KEYS.rate(TASK_KEY + TASK), "tat")
    assert tat is not None, "a pacer without its rate's state"
    next_slot = float(tat)
    before = handed_back(broker)
    broker.config_set("maxmemory", int(broker.info("memory")["used_memory"]) - 500_000)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            broker.set("fill:probe", "x")
        wait_until(lambda: handed_back(broker) > before or not pacer_claimed(broker), 5,
                   message="the pacer handed back, or gated")
        slot_past = next_slot - INTERVAL_MS + FULL_FOR_INTERVALS * INTERVAL_MS
        wait_until(lambda: redis_now_ms(broker) >= slot_past, 5, interval=0.005,
                   message=f"the pacer's slot {FULL_FOR_INTERVALS} intervals past, by TIME")
    finally:
        broker.config_set("maxmemory", 0)
    return handed_back(broker) > before


def test_a_rate_limit_keeps_its_interval_through_hand_backs_on_a_full_server(
        own_server: EmbeddedServer, r: redis.Redis, processes: Processes) -> None:
    url = own_server.url
    broker = redis.Redis.from_url(url, decode_responses=True)
    for n in range(200):  # 2 MB the cap will leave no room beside
        broker.set(f"fill:{n}", b"x" * 10_000)
    procs = listeners(processes, url, 2, "--tasks", TASKS, env=processes.env())
    wait_until(lambda: broker.zcard(KEYS.listeners) >= 2, 20, message="2 listeners")
    with RateStarts(url, KEYS.rate(TASK_KEY + TASK)) as gate_starts, Timers(url) as t:
        t.schedule_many(TimerSpec(TASK, [f"p{i}", 0], id=f"p{i}", in_=0.2)
                        for i in range(TIMERS))
        wait_until(lambda: r.llen(RUNS) >= 3, 20, message="3 starts")
        episodes = tries = 0
        while episodes < HAND_BACKS:
            tries += 1
            assert tries <= 30, f"no hand-back in {tries - 1} tries ({episodes} so far)"
            episodes += full_while_the_pacer_is_claimed(broker)
        wait_until(lambda: len({tag for tag, _ in runs_seen(r)}) >= TIMERS, 60,
                   message="every timer to run")
        wait_until(lambda: settled(t), 30, message="nothing pending or running")
        assert t.stats().failed == 0
    for p in procs:
        assert p.poll() is None, processes.output(p)
    seen = runs_seen(r)
    assert Counter(tag for tag, _ in seen) == {f"p{i}": 1 for i in range(TIMERS)}, seen
    # a run that reached its call past its start window gave its slot back: let go twice
    assert len(gate_starts.times()) >= TIMERS, gate_starts.times()
    gaps = gate_starts.gaps()
    entry_gaps = [round(b - a, 1) for a, b in itertools.pairwise(sorted(e for _, e in seen))]
    print(f"hand-backs {handed_back(broker)} in {tries} tries; smallest gap on the gate's "
          f"clock {min(gaps)} ms, by the tasks' entry {min(entry_gaps)} ms")
    assert min(gaps) >= INTERVAL_MS - JITTER_MS, (gaps, entry_gaps)
