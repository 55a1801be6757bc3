"""The capacity model, measured: ``python -m bench.capacity [--n 10000] [--rounds 3]
[--fires 20000] [--no-checks] [--pending 10000000] [--parts FILE]``.

1. **The parts** (what one timer costs on this machine), with :mod:`bench.compare`'s own
   machinery, working tree only, on one server (the repository's redis.conf): Redis CPU
   per ``schedule()`` call and per fire (``INFO`` ``used_cpu``, median of ``--rounds``),
   split by script with one more round in which every command is logged (``SLOWLOG``:
   schedule; claim (``claim``, ``park``, ``near``); run bookkeeping (``renew``,
   ``heartbeat``, ``trim``, ``gate`` and plain commands); ending (``finish``)); the
   listener's own CPU per fire, plain function and ``async def`` (its CPU per fire less
   the bench task's alone, :data:`bench.compare.REDIS_PY_ALONE`); bytes per pending timer
   near (30 min out: with its expiring key) and far (a day out), 100-byte args
   (``used_memory`` delta); bytes per run-history record (:mod:`bench.history_cost`).
2. **The table** (:mod:`bench.capacity_model`): fires/s and pending timers for 1, 3, 6
   and 12 primaries and N listener cores, and the side that saturates first.
3. **The checks** (``--no-checks`` skips them): ``--fires`` timers due at once fired by
   listener children (:mod:`bench.listener`, a no-op task) on one server with 1 and 2
   listeners, then on a loopback cluster (tests/clusters.py, no replicas) of 1 and 3
   primaries with 2 listeners each; per run fires/s, Redis CPU per fire in all and per
   shard (timers per shard counted as each primary's new keys: every timer due that soon
   has an expiring key), and the busiest shard's CPU and keys over the mean; each against
   the model's prediction for this machine, where Redis and the listeners share its cores.
4. ``--pending N``: N timers a day out (100-byte args, ``schedule_many`` in batches of
   10,000) on a 3-primary loopback cluster: bytes per timer, timers and ``used_memory``
   per primary (busiest over the mean), and lateness of 2,000 timers due over 10 s among
   them, fired by 2 listener processes.

``--parts FILE`` reads the parts from a JSON file written by an earlier run (``--save``)
instead of measuring them. The report is printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench import capacity_model as model
from bench.common import NOOP, PREFIX, REPO, args_100, due_at, wait_until
from bench.procs import ListenerProc, merge
from timers.model.percentiles import percentile

CLAIM = ("claim", "park", "near")
ENDING = ("finish",)
SETUP = ("schedule",)
"""Scripts a fires run's log holds for its setup (the N timers scheduled before the clock
starts): left out of the fire's split."""
NEAR_IN_S = 1800.0
FAR_IN_S = 86_400.0
MEMORY_N = 100_000
HISTORY_N = 100_000
HISTORY_BATCH = 8
IDLE_S = 2.0
"""Seconds of the idle window before each fires run."""
POLL_S = 0.1
SHARED_CORES = float(os.cpu_count() or 2)
"""This machine's cores: Redis, the listeners and the bench share them."""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the parts -------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """The parts, and what they were taken from."""

    parts: model.Parts
    split: dict[str, dict[str, float]]
    """Per operation (schedule, fire_sync, fire_async): {phase: µs of Redis CPU}, the
    ``used_cpu`` figure split in the shares SLOWLOG gives each script."""
    scripts: dict[str, dict[str, float]]
    """Per operation: {script or command: µs of execution time a timer (SLOWLOG)}."""
    raw: dict[str, float]
    """The medians behind the parts (rates, worker CPU with the task, the task alone)."""
    note: str
    cluster_scripts: dict[str, tuple[float, float]] = field(default_factory=dict)
    """The logged cluster fires: calls and µs a fire by script (every primary)."""


def phase_of(name: str) -> str:
    """The part of a timer's life a script belongs to."""
    if name in SETUP:
        return "schedule"
    if name in CLAIM:
        return "claim"
    if name in ENDING:
        return "ending"
    return "run bookkeeping"


def split_by_phase(server_cpu_us: float, scripts: dict[str, tuple[float, float]],
                   fire: bool) -> tuple[dict[str, float], dict[str, float]]:
    """({phase: µs of ``server_cpu_us``}, {script: µs logged}) from one logged run: the CPU
    split in the shares of the logged execution time (commands run inside scripts are in
    their script's time and left out; a fires run's setup is left out)."""
    from bench.compare import INSIDE

    logged = {name: usec for name, (_, usec) in scripts.items()
              if not name.startswith(INSIDE) and not (fire and name in SETUP)
              and not name.startswith("(")}
    total = sum(logged.values())
    phases: dict[str, float] = {}
    for name, usec in logged.items():
        phase = phase_of(name)
        phases[phase] = phases.get(phase, 0.0) + (server_cpu_us * usec / total if total
                                                  else 0.0)
    return phases, logged


def measure_parts(n: int, rounds: int, seconds: float, fires: int) -> Measured:
    """Run the schedule and fire scenarios of :mod:`bench.compare` (working tree and the
    task alone), then one logged round, then the memory figures, on servers of its own;
    then no-op fires on one server (1 listener) and on a 3-primary cluster (2 listeners),
    and ``schedule()`` calls on the cluster."""
    from bench.compare import (
        REDIS_PY_ALONE,
        WORKING_TREE,
        Bench,
        floor_sides,
        sitting,
        timers_side,
    )
    from timers.dev.server import EmbeddedServer

    scenarios = ["single", "fire_sync", "fire_async"]
    began, load = datetime.now(UTC), _load()
    with EmbeddedServer(config=REPO / "redis.conf") as broker, EmbeddedServer() as sink:
        bench = Bench(broker, sink)
        ours = timers_side(WORKING_TREE, sys.executable, REPO, broker.url, sink.url, n,
                           seconds)
        sides = [ours, *floor_sides(sys.executable, sink.url, n, None)]
        runs = sitting(bench, sides, scenarios, rounds, n, seconds,
                       time.monotonic() + 20 * 60)
        bench.by_script = all_script_names()
        logged = sitting(bench, [ours], scenarios, 1, n, seconds, time.monotonic() + 10 * 60)
        bench.quiet_log()
        memory = _memory(broker.url)
        bench.r.close()
        bench.sink.close()
        bench.raw.close()
    with tempfile.TemporaryDirectory(prefix="timers-capacity-") as tmp:
        with EmbeddedServer(config=REPO / "redis.conf") as server:
            one = fire_run("parts: one server, 1 listener", server.url, [server.port], 1,
                           fires, Path(tmp))
        print(f"  {_run_text(one)}", flush=True)
        with _cluster(3) as cluster:
            ports = [s.port for s in cluster.primaries]
            three = fire_run("parts: cluster, 3 primaries, 2 listeners", cluster.url, ports,
                             2, fires, Path(tmp))
            print(f"  {_run_text(three)}", flush=True)
            three_logged = fire_run("parts: cluster, 3 primaries, 2 listeners, logged",
                                    cluster.url, ports, 2, fires, Path(tmp), logged=True)
            cluster_schedule = schedule_calls(cluster.url, ports, seconds)

    def median(scenario: str, side: str, key: str) -> float:
        values = [r.figures[key] for r in runs
                  if r.scenario == scenario and r.side == side and key in r.figures
                  and not r.error]
        return statistics.median(values) if values else math.nan

    raw = {f"{s} {k}": median(s, WORKING_TREE, k) for s in scenarios
           for k in ("rate", "server_cpu_us", "worker_cpu_us", "client_cpu_us")}
    raw |= {f"{s} alone worker_cpu_us": median(s, REDIS_PY_ALONE, "worker_cpu_us")
            for s in ("fire_sync", "fire_async")}
    raw |= memory
    raw |= {"no-op fire, one server: Redis us": one.redis_us,
            "no-op fire, one server: listener us": one.listener_cpu_us,
            "no-op fire, one server: fires/s": one.rate,
            "no-op fire, 3 primaries: Redis us per fire of its shard":
                statistics.mean(three.per_shard_us),
            "no-op fire, 3 primaries: listener us": three.listener_cpu_us,
            "no-op fire, 3 primaries: fires/s": three.rate,
            "schedule(), 3 primaries: Redis us": cluster_schedule}
    split, scripts = {}, {}
    for r in logged:
        if r.side == WORKING_TREE and r.scripts:
            cpu = raw[f"{r.scenario} server_cpu_us"]
            split[r.scenario], scripts[r.scenario] = split_by_phase(
                cpu, r.scripts, r.scenario != "single")
    split["cluster fire"], scripts["cluster fire"] = split_by_phase(
        statistics.mean(three.per_shard_us), three_logged.scripts, True)
    # the sync fire from the no-op run (its idle CPU taken off); the async one as
    # bench.compare measured it (its lead's idle CPU in it: a few µs at this N)
    parts = model.Parts(
        schedule_us=raw["single server_cpu_us"],
        fire_sync_us=one.redis_us,
        fire_async_us=raw["fire_async server_cpu_us"],
        listener_sync_us=one.listener_cpu_us,
        listener_async_us=(raw["fire_async worker_cpu_us"]
                           - raw["fire_async alone worker_cpu_us"]),
        bytes_near=memory["bytes_near"], bytes_far=memory["bytes_far"],
        bytes_history=memory["bytes_history"],
        cluster_schedule_us=cluster_schedule,
        cluster_fire_us=statistics.mean(three.per_shard_us),
        cluster_listener_us=three.listener_cpu_us,
        process_rate=one.rate, cluster_process_rate=three.rate / 2)
    note = (f"{began:%Y-%m-%d %H:%M} UTC; bench.compare: {rounds} rounds of N = {n:,} fires "
            f"and {seconds:g} s of single schedule() calls, every side in turn, then one "
            f"logged round; no-op fires: {fires:,} due at once; load average (1, 5, 15 min) "
            f"at start {load}, at end {_load()}")
    return Measured(parts, split, scripts, raw, note, three_logged.scripts)


def all_script_names() -> dict[str, str]:
    """{sha or function: script name} of both forms of every script: as one server runs
    them, and with their keys declared (as a cluster runs them, by EVALSHA)."""
    import hashlib

    from bench.server_stats import script_names
    from timers.store.lua_source import source
    from timers.store.script_manifest import SCRIPT_NAMES

    return script_names() | {
        hashlib.sha1(source(name, declare=True).encode(), usedforsecurity=False).hexdigest():
            name for name in SCRIPT_NAMES}


def schedule_calls(url: str, ports: Sequence[int], seconds: float) -> float:
    """Redis CPU (every primary, the idle CPU of an equal window before taken off) per
    ``schedule()`` call, one at a time for ``seconds`` seconds, a day out."""
    from timers import Timers

    nodes = [redis.Redis(port=p) for p in ports]
    try:
        with Timers(url, prefix=PREFIX) as t:
            t.stats()
            cpu0, start = sum(map(_cpu, nodes)), time.monotonic()
            wait_until(lambda: t.stats().fired < 0, IDLE_S, POLL_S)  # (never true: polls)
            idle = (sum(map(_cpu, nodes)) - cpu0) / (time.monotonic() - start)
            calls, cpu0, start = 0, sum(map(_cpu, nodes)), time.monotonic()
            while time.monotonic() - start < seconds:
                t.schedule(NOOP, args_100(calls), in_=FAR_IN_S)
                calls += 1
            cpu = sum(map(_cpu, nodes)) - cpu0 - idle * (time.monotonic() - start)
    finally:
        for node in nodes:
            node.close()
    return cpu / calls * 1e6


def _memory(url: str) -> dict[str, float]:
    """Bytes per pending timer far and near (``used_memory`` delta over N, AOF off), and
    per run-history record (records as finish.lua writes them)."""
    from bench import history_cost
    from timers import Timers, TimerSpec

    r = redis.Redis.from_url(url)
    out: dict[str, float] = {}
    try:
        r.config_set("appendonly", "no")
        for name, in_ in (("bytes_far", FAR_IN_S), ("bytes_near", NEAR_IN_S)):
            r.flushall()
            with Timers(url, prefix=PREFIX) as t:
                t.stats()  # the prefix's own keys before the count starts
                before = int(r.info("memory")["used_memory"])
                for start in range(0, MEMORY_N, 10_000):
                    t.schedule_many(TimerSpec(NOOP, args_100(i), in_=in_)
                                    for i in range(start, start + 10_000))
            out[name] = (int(r.info("memory")["used_memory"]) - before) / MEMORY_N
        r.flushall()
        history_cost.fill(r, HISTORY_N, int(time.time() * 1000), HISTORY_BATCH)
        out["bytes_history"] = history_cost.bytes_per_record(r, HISTORY_N)
        r.flushall()
    finally:
        r.close()
    return out


# -- fires on this machine ---------------------------------------------------------------


@dataclass(frozen=True)
class FireRun:
    """N timers due at once, fired by listener children: what it took."""

    label: str
    listeners: int
    fired: int
    rate: float
    listener_cpu_us: float
    """Listener CPU (all children) per fire, their idle CPU over the run taken off."""
    node_cpu_us: tuple[float, ...]
    """Each primary's Redis CPU over the fires, µs per fire of the whole run, its idle CPU
    over the run taken off."""
    node_timers: tuple[int, ...]
    """Each primary's new keys once the timers were scheduled (one expiring key each)."""
    load: str
    scripts: dict[str, tuple[float, float]] = field(default_factory=dict)
    """A logged run's Redis calls and time (µs) per fire by script (SLOWLOG, every
    primary)."""

    @property
    def redis_us(self) -> float:
        """Redis CPU per fire, all primaries."""
        return sum(self.node_cpu_us)

    @property
    def per_shard_us(self) -> tuple[float, ...]:
        """Each primary's Redis CPU per fire it served."""
        total = sum(self.node_timers)
        return tuple(cpu * self.fired / (t * self.fired / total) if t and total else math.nan
                     for cpu, t in zip(self.node_cpu_us, self.node_timers, strict=True))


def _cpu(node: redis.Redis) -> float:
    info: dict[str, Any] = node.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def fire_run(label: str, url: str, ports: Sequence[int], listeners: int, n: int,
             workdir: Path, logged: bool = False) -> FireRun:
    """``n`` timers due at once on the server or cluster at ``url`` (primaries on
    ``ports``), fired by ``listeners`` listener children. ``logged``: every command of the
    fires is logged (SLOWLOG) and the run's ``scripts`` says Redis's time per fire by
    script, summed over the primaries (its CPU figures then carry the logging's cost)."""
    from bench.compare import SLOWLOG_MAX, slowlog_by_script
    from bench.side import proc_cpu_s
    from timers import Timers, TimerSpec
    from timers.listener import DEFAULT_CONCURRENCY

    nodes = [redis.Redis(port=p) for p in ports]
    procs: list[ListenerProc] = []
    try:
        for node in nodes:
            node.flushall()
            node.config_set("appendonly", "no")
        procs = [ListenerProc(url, workdir, f"cap-{label}-{i}-{time.monotonic_ns()}",
                              concurrency=DEFAULT_CONCURRENCY, max_seconds=n / 200 + 120)
                 for i in range(listeners)]
        for proc in procs:
            proc.wait_ready(60)
        keys0 = [int(node.dbsize()) for node in nodes]
        with Timers(url, prefix=PREFIX) as t:
            # the idle cost (listeners' sweeps and heartbeats, the cluster's bus, this
            # process's polling) over a window with nothing due, taken off the fires' own
            t.stats()
            cpu0, own0 = [_cpu(node) for node in nodes], sum(proc_cpu_s(p.pid) for p in procs)
            start = time.monotonic()
            wait_until(lambda: t.stats().fired < 0, IDLE_S, POLL_S)  # (never true: polls)
            idle_s = time.monotonic() - start
            idle = [(_cpu(node) - c) / idle_s for node, c in zip(nodes, cpu0, strict=True)]
            idle_own = (sum(proc_cpu_s(p.pid) for p in procs) - own0) / idle_s
            due_ms = round(time.time() * 1000 + 1500 + n / 10)
            t.schedule_many(TimerSpec(NOOP, [i, due_ms], at=due_at(due_ms)) for i in range(n))
            keys = [int(node.dbsize()) - k for node, k in zip(nodes, keys0, strict=True)]
            load = _load()
            for node in nodes if logged else []:
                node.config_set("slowlog-max-len", SLOWLOG_MAX)
                node.config_set("slowlog-log-slower-than", 0)
                node.slowlog_reset()
            cpu0 = [_cpu(node) for node in nodes]
            own0 = sum(proc_cpu_s(p.pid) for p in procs)
            start = time.monotonic()
            if not wait_until(lambda: t.stats().fired >= n, n / 300 + 60, POLL_S):
                raise RuntimeError(f"{label}: only {t.stats().fired} of {n} fired in time")
            window = time.monotonic() - start
            own = sum(proc_cpu_s(p.pid) for p in procs) - own0 - idle_own * window
            cpu = [_cpu(node) - c - i * window
                   for node, c, i in zip(nodes, cpu0, idle, strict=True)]
            scripts: dict[str, tuple[float, float]] = {}
            names = all_script_names()
            for node in nodes if logged else []:
                with redis.Redis(port=node.connection_pool.connection_kwargs["port"],
                                 decode_responses=True) as text:
                    for name, (calls, usec) in slowlog_by_script(text, node, names, n).items():
                        was = scripts.get(name, (0.0, 0.0))
                        scripts[name] = (was[0] + calls, was[1] + usec)
                    text.config_set("slowlog-log-slower-than", 10_000)
                    text.config_set("slowlog-max-len", 128)
    finally:
        results = [p.result() for p in procs]
        for node in nodes:
            node.close()
    res = merge([r for r in results if r is not None])
    fired = len(res.fired)
    span = (max(started for _, started, _, _ in res.fired) - due_ms) / 1000 if fired else 0.0
    return FireRun(label, listeners, fired, fired / span if span > 0 else math.nan,
                   own / max(fired, 1) * 1e6,
                   tuple(c / max(fired, 1) * 1e6 for c in cpu), tuple(keys), load, scripts)


@dataclass(frozen=True)
class Check:
    """One figure measured on this machine against the model's prediction."""

    what: str
    measured: float
    predicted: float
    unit: str

    @property
    def ratio(self) -> float:
        """measured / predicted."""
        return model.ratio(self.measured, self.predicted)


def predicted_rate(parts: model.Parts, primaries: int, listeners: int,
                   cluster: bool = True) -> model.Ceiling:
    """Fires/s of timers already scheduled, on this machine: each primary at most one core,
    each listener process at most one core and the rate a process reached in the parts,
    all of them within the machine's cores."""
    return model.ceiling(parts, primaries, listeners, scheduled=False,
                         shared_cores=SHARED_CORES, cluster=cluster, processes=listeners)


def run_checks(parts: model.Parts, n: int) -> tuple[list[FireRun], list[Check],
                                                   list[FireRun]]:
    """The fire runs (one server with 1 and 2 listeners; a cluster of 1 and 3 primaries
    with 2 listeners) and each figure's check against the model; and one logged run of
    one server, 2 listeners (Redis's time per fire by script, beside the cluster's in the
    parts)."""
    from tests.clusters import real_cluster
    from timers.dev.server import EmbeddedServer

    runs: list[FireRun] = []
    with tempfile.TemporaryDirectory(prefix="timers-capacity-") as tmp:
        workdir = Path(tmp)
        with EmbeddedServer(config=REPO / "redis.conf") as server:
            for k in (1, 2):
                runs.append(fire_run(f"one server, {k} listener{'s' * (k > 1)}",
                                     server.url, [server.port], k, n, workdir))
                print(f"  {_run_text(runs[-1])}", flush=True)
            logged = [fire_run("one server, 2 listeners, logged", server.url, [server.port],
                               2, n, workdir, logged=True)]
        for primaries in (1, 3):
            with real_cluster(primaries, replicas=False) as cluster:
                ports = [s.port for s in cluster.primaries]
                label = (f"cluster, {primaries} primar{'ies' if primaries > 1 else 'y'}, "
                         "2 listeners")
                runs.append(fire_run(label, cluster.url, ports, 2, n, workdir))
                print(f"  {_run_text(runs[-1])}", flush=True)
    return runs, checks_of(parts, runs), logged


def checks_of(parts: model.Parts, runs: Sequence[FireRun]) -> list[Check]:
    """Each run's figures against the model (pure: from the runs' figures)."""
    one1, one2, c1, c3 = runs
    checks = [
        Check("fires/s, one server, 1 listener", one1.rate,
              predicted_rate(parts, 1, 1, cluster=False).rate, "/s"),
        Check("fires/s, one server, 2 listeners", one2.rate,
              predicted_rate(parts, 1, 2, cluster=False).rate, "/s"),
        Check("2 listeners over 1 (fires/s)", one2.rate / one1.rate,
              predicted_rate(parts, 1, 2, cluster=False).rate
              / predicted_rate(parts, 1, 1, cluster=False).rate, "x"),
        Check("fires/s, cluster of 1 primary, 2 listeners", c1.rate,
              predicted_rate(parts, 1, 2).rate, "/s"),
        Check("fires/s, cluster of 3 primaries, 2 listeners", c3.rate,
              predicted_rate(parts, 3, 2).rate, "/s"),
        Check("3 primaries over 1, listeners fixed (fires/s)", c3.rate / c1.rate,
              predicted_rate(parts, 3, 2).rate / predicted_rate(parts, 1, 2).rate, "x"),
        Check("listener CPU per fire (one server, 1 listener)", one1.listener_cpu_us,
              parts.listener_sync_us, "us"),
        Check("listener CPU per fire (one server, 2 listeners)", one2.listener_cpu_us,
              parts.listener_sync_us, "us"),
        Check("listener CPU per fire (cluster of 1 primary)", c1.listener_cpu_us,
              parts.cluster_listener_us, "us"),
        Check("listener CPU per fire (cluster of 3 primaries)", c3.listener_cpu_us,
              parts.cluster_listener_us, "us"),
        Check("Redis CPU per fire, one server, 1 listener", one1.redis_us, parts.fire_sync_us,
              "us"),
        Check("Redis CPU per fire, one server, 2 listeners", one2.redis_us,
              parts.fire_sync_us, "us"),
        Check("Redis CPU per fire, cluster of 1 primary", c1.redis_us, parts.cluster_fire_us,
              "us"),
        Check("Redis CPU per fire, cluster of 3 primaries (all)", c3.redis_us,
              parts.cluster_fire_us, "us"),
    ]
    for i, us in enumerate(c3.per_shard_us):
        checks.append(Check(f"Redis CPU per fire of shard {i} (3 primaries)", us,
                            parts.cluster_fire_us, "us"))
    checks += [
        Check("busiest shard's Redis CPU over the mean (3 primaries)",
              model.imbalance_of(c3.node_cpu_us), 1.0, "x"),
        Check("busiest shard's timers over the mean (3 primaries)",
              model.imbalance_of([float(k) for k in c3.node_timers]), 1.0, "x"),
    ]
    return checks


def scripts_text(scripts: dict[str, tuple[float, float]]) -> str:
    """``name calls/fire, us/fire`` for each script or command, the largest first."""
    return ", ".join(f"{k} {c:.3f} calls {u:.1f} us" for k, (c, u) in sorted(
        scripts.items(), key=lambda kv: -kv[1][1]) if u >= 0.05)


def _run_text(r: FireRun) -> str:
    return (f"{r.label}: {r.fired:,} fired at {r.rate:,.0f}/s; listener CPU "
            f"{r.listener_cpu_us:.1f} us a fire; Redis CPU {r.redis_us:.1f} us a fire ("
            + ", ".join(f"{c:.1f}" for c in r.node_cpu_us) + " per primary); timers per "
            "primary " + ", ".join(f"{k:,}" for k in r.node_timers) + f"; load {r.load}")


# -- many pending on a cluster -----------------------------------------------------------


@dataclass(frozen=True)
class PendingRun:
    """N pending on a cluster, and lateness among them."""

    n: int
    primaries: int
    bytes_per_timer: float
    node_bytes: tuple[int, ...]
    node_timers: tuple[int, ...]
    node_rss: tuple[int, ...]
    load_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    task_p99_ms: float
    fired: int
    load: str


@contextmanager
def _cluster(primaries: int) -> Iterator[Any]:
    from tests.clusters import real_cluster

    with real_cluster(primaries, replicas=False) as cluster:
        yield cluster


def pending_run(n: int, primaries: int = 3, spread_n: int = 2_000,
                spread_s: float = 10.0) -> PendingRun:
    """``n`` timers a day out on a fresh cluster, then ``spread_n`` due over ``spread_s``
    seconds fired by 2 listener children: memory, balance, lateness."""
    from timers import Timers, TimerSpec
    from timers.listener import DEFAULT_CONCURRENCY
    from timers.model.keys import Keyspace
    from timers.ops.shards import ShardLayout

    with _cluster(primaries) as cluster, \
            tempfile.TemporaryDirectory(prefix="timers-capacity-") as tmp:
        nodes = [redis.Redis(port=s.port) for s in cluster.primaries]
        try:
            with Timers(cluster.url, prefix=PREFIX) as t:
                t.stats()  # the layout, and the connections, before the count starts
                before = [int(node.info("memory")["used_memory"]) for node in nodes]
                started = time.perf_counter()
                for start in range(0, n, 10_000):
                    t.schedule_many(TimerSpec(NOOP, args_100(i), in_=FAR_IN_S)
                                    for i in range(start, min(start + 10_000, n)))
                    if start % 1_000_000 == 0:
                        print(f"  {start:,} loaded after {time.perf_counter() - started:.0f} s",
                              flush=True)
                load_s = time.perf_counter() - started
                used = [int(node.info("memory")["used_memory"]) - b
                        for node, b in zip(nodes, before, strict=True)]
                rss = [int(node.info("memory")["used_memory_rss"]) for node in nodes]
                layout = ShardLayout(Keyspace("{" + PREFIX + "}"), primaries, PREFIX)
                client = t.redis
                per_shard = [int(client.zcard(k.due)) for k in layout.keyspaces]
            load = _load()
            procs = [ListenerProc(cluster.url, Path(tmp), f"cap-pending-{i}",
                                  concurrency=DEFAULT_CONCURRENCY, max_seconds=spread_s + 120)
                     for i in range(2)]
            try:
                for proc in procs:
                    proc.wait_ready(120)
                first = time.time() * 1000 + 2000
                with Timers(cluster.url, prefix=PREFIX) as t:
                    dues = [round(first + spread_s * 1000 * i / spread_n)
                            for i in range(spread_n)]
                    t.schedule_many(TimerSpec(NOOP, [i, due], at=due_at(due))
                                    for i, due in enumerate(dues))
                    wait_until(lambda: t.stats().fired >= spread_n, spread_s + 60, 0.2)
            finally:
                results = [p.result() for p in procs]
        finally:
            for node in nodes:
                node.close()
    res = merge([r for r in results if r is not None])
    late = sorted(res.lateness_ms)
    own = sorted(res.task_lateness)
    nan = math.nan
    return PendingRun(
        n, primaries, sum(used) / n, tuple(used), tuple(per_shard), tuple(rss), load_s,
        percentile(late, 50) if late else nan, percentile(late, 99) if late else nan,
        late[-1] if late else nan, percentile(own, 99) if own else nan, len(late), load)


# -- the report ------------------------------------------------------------------------


def _n(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def parts_text(m: Measured) -> str:
    """The parts as a Markdown table, with the split by script and the raw medians."""
    p = m.parts
    lines = [f"Parts measured {m.note}.", "",
             "| part | value |", "|---|---|",
             f"| Redis CPU, one `schedule()` call | {p.schedule_us:.1f} µs |",
             f"| Redis CPU per fire, plain function | {p.fire_sync_us:.1f} µs |",
             f"| Redis CPU per fire, `async def` | {p.fire_async_us:.1f} µs |",
             f"| listener's own CPU per fire, plain function | {p.listener_sync_us:.1f} µs |",
             f"| listener's own CPU per fire, `async def` | {p.listener_async_us:.1f} µs |",
             f"| bytes per pending timer, near (30 min out) | {p.bytes_near:.0f} |",
             f"| bytes per pending timer, far (a day out) | {p.bytes_far:.0f} |",
             f"| bytes per run-history record | {p.bytes_history:.0f} |",
             f"| Redis CPU, one `schedule()` call, cluster | {p.cluster_schedule_us:.1f} µs |",
             f"| Redis CPU per fire, cluster (its shard's primary) | {p.cluster_fire_us:.1f} µs |",
             f"| listener's own CPU per fire, cluster | {p.cluster_listener_us:.1f} µs |",
             f"| fires/s of one listener process at full speed, one server | "
             f"{p.process_rate:,.0f} ({p.busy():.0%} of a core) |",
             f"| the same, cluster of 3 primaries (2 processes) | "
             f"{p.cluster_process_rate:,.0f} ({p.busy(True):.0%} of a core) |", ""]
    for op, phases in m.split.items():
        lines.append(f"- Redis CPU of `{op}` by part: " + "; ".join(
            f"{k} {v:.1f} µs" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])))
        lines.append("  (SLOWLOG, µs a timer: " + ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(m.scripts[op].items(), key=lambda kv: -kv[1])
            if v >= 0.05) + ")")
    if m.cluster_scripts:
        lines.append("- cluster of 3 primaries, Redis time per fire by script (SLOWLOG, every "
                     "primary): " + scripts_text(m.cluster_scripts))
    lines.append("- raw medians: " + ", ".join(f"{k} {_n(v)}" for k, v in m.raw.items()))
    return "\n".join(lines)


def table_text(parts: model.Parts, usable_gib: float = 16.0,
               cores: Sequence[float] = (1, 2, 4, 8, 16)) -> str:
    """The capacity table (:func:`bench.capacity_model.table`) as Markdown."""
    rows = model.table(parts, cores=cores, usable_bytes=usable_gib * model.GIB)
    head = ("| deployment | Redis ceiling, fires/s (scheduled by `schedule()` / earlier) | "
            "listener cores (processes) to match | "
            + " | ".join(f"{c:g} listener core{'s' * (c != 1)}" for c in cores)
            + f" | pending a day out, {usable_gib:g} GiB a primary |")
    lines = [head, "|" + "---|" * (4 + len(cores))]
    for row in rows:
        cells = [f"{c.rate:,.0f} ({'R' if c.bound == model.REDIS else 'L'})"
                 for _, c in row.by_cores]
        lines.append(f"| {row.label} | {row.redis:,.0f} / {row.redis_fires_only:,.0f} | "
                     f"{row.cores:.1f} ({row.processes:.1f}) | " + " | ".join(cells)
                     + f" | {row.pending_far / 1e6:,.0f} M |")
    one_async = model.ceiling(parts, 1, 1, kind="async", cluster=False)
    lines.append("")
    lines.append(f"One server, `async def` tasks: Redis's ceiling {one_async.redis:,.0f} "
                 f"fires/s, a listener core {one_async.listeners:,.0f} fires/s.")
    return "\n".join(lines)


def checks_text(runs: Sequence[FireRun], checks: Sequence[Check],
                logged: Sequence[FireRun] = ()) -> str:
    """The fire runs, the logged runs' time by script, and the checks as a Markdown table."""
    lines = [f"- {_run_text(r)}" for r in runs]
    for r in logged:
        lines.append(f"- {r.label}: Redis time per fire by script (SLOWLOG, all primaries): "
                     + scripts_text(r.scripts))
    lines += ["", "| check | measured | predicted | measured/predicted |", "|---|---|---|---|"]
    lines += [f"| {c.what} | {_n(c.measured)} {c.unit} | {_n(c.predicted)} {c.unit} | "
              f"{c.ratio:.2f} |" for c in checks]
    return "\n".join(lines)


def pending_text(parts: model.Parts, r: PendingRun) -> str:
    """The many-pending run: bytes a timer against the model, balance, lateness."""
    mean_b = sum(r.node_bytes) / len(r.node_bytes)
    mean_t = sum(r.node_timers) / len(r.node_timers)
    return "\n".join([
        f"- {r.n:,} pending a day out on {r.primaries} primaries: {r.bytes_per_timer:.0f} "
        f"bytes a timer (used_memory over all primaries; the model's far part "
        f"{parts.bytes_far:.0f}, ratio {r.bytes_per_timer / parts.bytes_far:.2f}); loaded "
        f"in {r.load_s:.0f} s ({r.n / r.load_s:,.0f}/s)",
        "- per primary: timers " + ", ".join(f"{k:,}" for k in r.node_timers)
        + f" (busiest/mean {max(r.node_timers) / mean_t:.3f}); used_memory "
        + ", ".join(f"{b / model.GIB:.2f} GiB" for b in r.node_bytes)
        + f" (busiest/mean {max(r.node_bytes) / mean_b:.3f}); RSS "
        + ", ".join(f"{b / model.GIB:.2f} GiB" for b in r.node_rss),
        f"- lateness of 2,000 due over 10 s among them, 2 listeners: p50 {r.p50_ms:.1f} / "
        f"p99 {r.p99_ms:.1f} / max {r.max_ms:.1f} ms (by the task's clock p99 "
        f"{r.task_p99_ms:.1f} ms); {r.fired:,} fired; load average {r.load}",
    ])


def hundred_million_text(parts: model.Parts) -> str:
    """The primaries 100,000,000 pending a day out need, for a few usable sizes."""
    lines = []
    for gib in (8, 16, 32, 64):
        p = model.primaries_for(parts, 100_000_000, gib * model.GIB)
        lines.append(f"- {gib} GiB usable a primary (maxmemory): {p} primar"
                     f"{'ies' if p > 1 else 'y'} "
                     f"({100_000_000 * parts.bytes_far / model.GIB:.1f} GiB of timers a "
                     "day out in all)")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="fires per compare run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="of single schedule() calls")
    p.add_argument("--fires", type=int, default=20_000, help="timers due at once per check")
    p.add_argument("--no-checks", action="store_true")
    p.add_argument("--pending", type=int, default=0, metavar="N",
                   help="also load N a day out on a 3-primary cluster")
    p.add_argument("--parts", type=Path, help="read the parts from this JSON file")
    p.add_argument("--save", type=Path, help="write the parts measured to this JSON file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Measure (or read) the parts, print the table, run the checks and the pending run."""
    opts = parse(argv)
    print(f"load average at start {_load()}; {os.cpu_count()} cores", flush=True)
    if opts.parts:
        data = json.loads(opts.parts.read_text())
        parts = model.Parts(**data["parts"])
        print(f"parts from {opts.parts}: {data.get('note', '')}\n", flush=True)
    else:
        measured = measure_parts(opts.n, opts.rounds, opts.seconds, opts.fires)
        parts = measured.parts
        print("\n" + parts_text(measured) + "\n", flush=True)
        if opts.save:
            opts.save.write_text(json.dumps({"parts": asdict(parts), "note": measured.note,
                                             "split": measured.split, "raw": measured.raw},
                                            indent=1))
    print(table_text(parts) + "\n", flush=True)
    print(hundred_million_text(parts) + "\n", flush=True)
    if not opts.no_checks:
        runs, checks, logged = run_checks(parts, opts.fires)
        print("\n" + checks_text(runs, checks, logged) + "\n", flush=True)
    if opts.pending:
        print(f"loading {opts.pending:,} on a 3-primary cluster", flush=True)
        print("\n" + pending_text(parts, pending_run(opts.pending)) + "\n", flush=True)
    print(f"load average at end {_load()}", flush=True)


if __name__ == "__main__":
    main()
