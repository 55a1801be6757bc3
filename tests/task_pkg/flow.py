"""Tasks behind flow limits, which record how many of their kind ran at once themselves.

Each run adds ``[tag, key, pid, start, end, concurrent]`` to ``test:runs`` (times in epoch ms
from the Redis clock, ``TIME``: the clock the limits are enforced with); ``concurrent`` is how many
runs of the same key were inside the task when this one entered it (an INCR/DECR counter
per key), so a test checks the limit with what the tasks saw, not with timers' books.
"""

from __future__ import annotations

import json
import os
import time

import redis

import timers
from tests.task_pkg import RUNS, STARTED, client
from tests.task_pkg.slow import RELEASE
from timers.model.flow.names import TASK_KEY
from timers.model.keys import Keyspace

ACTIVE = "test:active:"
SPANS_ENV = "TIMERS_TEST_SPANS"
"""A directory: when set, each run appends ``[tag, key, pid, start, end]`` to a file of its
process there, one write and no Redis call (a test that times runs measures the runs,
not four Redis round trips each from a thread)."""
_span_files: dict[tuple[str, int], int] = {}


def _write_span(folder: str, span: list[object]) -> None:
    where = (folder, os.getpid())
    fd = _span_files.get(where)
    if fd is None:
        fd = _span_files[where] = os.open(os.path.join(folder, f"spans.{os.getpid()}"),
                                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (json.dumps(span) + "\n").encode())


def redis_ms(r: redis.Redis) -> float:
    """Now on the Redis clock (``TIME``) in epoch ms: the clock a rate is enforced with."""
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) / 1000


def _run(tag: str, key: str, seconds: float) -> None:
    folder = os.environ.get(SPANS_ENV)
    if folder:
        start = time.time() * 1000
        time.sleep(seconds)  # the work itself, not a wait for an outcome
        _write_span(folder, [tag, key, os.getpid(), start, time.time() * 1000])
        return
    r = client()
    start = redis_ms(r)
    r.rpush(STARTED, json.dumps([tag, key, os.getpid(), start]))
    concurrent = r.incr(ACTIVE + key)
    try:
        time.sleep(seconds)  # the work itself, not a wait for an outcome
    finally:
        r.decr(ACTIVE + key)
    r.rpush(RUNS, json.dumps([tag, key, os.getpid(), start, redis_ms(r), concurrent]))


@timers.task(concurrency=1, key=lambda tag, device, seconds=0.02: f"device:{device}")
def device_command(tag: str, device: int, seconds: float = 0.02) -> None:
    """One command at a time per device, whichever listener runs it."""
    _run(tag, f"device:{device}", seconds)


@timers.task(concurrency=1)
def keyed(tag: str, key: str, seconds: float = 0.0) -> None:
    """Runs one at a time per ``schedule(..., key=...)``, else one at a time fleet-wide.
    Waits for ``test:release`` when ``seconds`` is negative."""
    if seconds < 0:
        r = client()
        r.rpush(STARTED, json.dumps([tag, key, os.getpid(), redis_ms(r)]))
        deadline = time.monotonic() + 20
        while not r.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.01)  # polls for the release, with the deadline above
        r.rpush(RUNS, json.dumps([tag, key, os.getpid(), 0, redis_ms(r), 1]))
        return
    _run(tag, key, seconds)


@timers.task(rate="600/m")
def paced(tag: str, priority: int) -> None:
    """At most ten starts a second, fleet-wide: notes ``[tag, priority, pid, entry ms, start
    ms]``, the ms the task entered (on the suite's server) and the ms its listener started
    it, just before its gate let it go (due time plus lateness, on the listener's reading of
    the Redis clock): the gate's order, without the dispatch to a thread in between."""
    r = client()
    context = timers.current()
    started = context.due.timestamp() * 1000 + context.lateness * 1000
    r.rpush(RUNS, json.dumps([tag, priority, os.getpid(), redis_ms(r), started]))


@timers.task(group="video")
def encode(tag: str) -> None:
    """Declares its group: a listener of another group that claims it moves it there."""
    client().rpush(RUNS, json.dumps([tag, os.getpid()]))


@timers.task(concurrency=5, rate="120/m")
def capped_and_paced(tag: str, seconds: float) -> None:
    """At most five at once and two starts a second, fleet-wide."""
    _run(tag, "capped", seconds)


@timers.task(concurrency=1, rate="120/m")
def keyed_and_paced(tag: str, key: str) -> None:
    """One at a time per ``schedule(..., key=...)``, two starts a second fleet-wide."""
    _run(tag, key, 0.0)


DUE_CHECKS = "test:due-checks"


@timers.task(concurrency=1, key=lambda device: f"dev:{device}")
def due_checked(device: int) -> None:
    """Notes ``[due ms, Redis time ms at the start]``: both on the Redis clock."""
    r = client()
    seconds, micros = r.time()
    due = timers.current().due.timestamp() * 1000
    r.rpush(DUE_CHECKS, json.dumps([due, seconds * 1000 + micros / 1000]))


RATE_URL_ENV = "TIMERS_TEST_RATE_URL"
"""The listeners' own server, where :func:`paced_on_redis_clock` reads its rate's state."""
_rate_clients: dict[str, redis.Redis] = {}


@timers.task(rate="120/m")
def paced_on_redis_clock(tag: str) -> None:
    """One start every 500 ms, fleet-wide: notes ``[tag, ms]``, the ms of this run's start
    on the Redis clock as the gate let it go (the rate's ``last``, read from the listeners'
    server at ``$TIMERS_TEST_RATE_URL``: the rate's next start comes an interval later, so
    it is still this run's). The time a task reads on entry would add the listener's
    dispatch (±15 ms on a loaded 2-core machine) to every gap."""
    url = os.environ[RATE_URL_ENV]
    rates = _rate_clients.get(url)
    if rates is None:
        rates = _rate_clients[url] = redis.Redis.from_url(url, decode_responses=True)
    last = rates.hget(Keyspace().rate(TASK_KEY + timers.current().task), "last")
    client().rpush(RUNS, json.dumps([tag, float(last or "nan")]))



@timers.task(rate="600/m")
def paced_started(tag: str) -> None:
    """Ten starts a second fleet-wide: notes ``[tag, 0, pid, entry ms, start ms]``: the ms
    the task entered (the machine's clock, read on the suite's server: the first run of a
    process pays its connection first) and the ms its listener started it (its due time
    plus its lateness, on the listener's reading of the Redis clock)."""
    r = client()
    entered = redis_ms(r)
    context = timers.current()
    started = context.due.timestamp() * 1000 + context.lateness * 1000
    r.rpush(RUNS, json.dumps([tag, 0, os.getpid(), entered, started]))
