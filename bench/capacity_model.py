"""The capacity model's arithmetic (pure: no server, no process): from what one timer costs
(measured by :mod:`bench.capacity`), how many fires a second and how many pending timers a
deployment of P primaries and N listener cores holds, and which side runs out first.

The model, in three lines:

- **Redis**: each primary runs its scripts on one core, and a prefix's timers are spread
  over one shard per primary; a primary is full when its share of the fires costs one core
  of Redis CPU. The busiest shard runs out first, so the cluster's ceiling is
  ``P x 1e6 / (Redis us per timer x imbalance)``, ``imbalance`` being the busiest shard's
  load over the mean (1.0 when even).
- **Listeners**: a listener process runs its Python on one core (the GIL); ``N`` listener
  cores give ``N x 1e6 / (listener us per fire + the task's own us)``.
- **Memory**: a primary holds ``usable bytes / bytes per pending timer`` timers, less its
  shard's run history (``history count x bytes per record``).

The fires/s is the lower of the two CPU ceilings; which one it is, is the side that
saturates first. On a machine where Redis and the listeners share ``cores`` (this bench
machine), a third bound applies: ``cores x 1e6 / (Redis us + listener us)`` per fire.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GIB = 2**30
REDIS, LISTENERS, MACHINE = "Redis", "listeners", "machine"


@dataclass(frozen=True)
class Parts:
    """What one timer costs, measured (µs of CPU, bytes of Redis memory). The Redis and
    listener figures of a fire are its marginal cost (the idle CPU of sweeps and
    heartbeats taken off) with a no-op task: a task adds its own CPU in the listener."""

    schedule_us: float
    """Redis CPU of one ``schedule()`` call (one timer), one server."""
    fire_sync_us: float
    """Redis CPU per fire of a plain-function task (claim, run bookkeeping, ending), one
    server."""
    fire_async_us: float
    """The same for an ``async def`` task."""
    listener_sync_us: float
    """The listener's own CPU per fire of a plain function, one server."""
    listener_async_us: float
    """The same for an ``async def`` task."""
    bytes_near: float
    """Redis bytes per pending timer due within the near horizon (with its expiring key)."""
    bytes_far: float
    """Redis bytes per pending timer due beyond it (a day out: no expiring key yet)."""
    bytes_history: float
    """Redis bytes per kept run-history record."""
    cluster_schedule_us: float
    """Redis CPU of one ``schedule()`` call on a cluster (the primary of its shard)."""
    cluster_fire_us: float
    """Redis CPU per plain-function fire on a cluster, on the primary of its shard."""
    cluster_listener_us: float
    """The listener's own CPU per plain-function fire on a cluster."""
    process_rate: float = math.inf
    """Fires/s one listener process reached at full speed on one server (no-op task): a
    process waits on its round trips too, so it may stop short of a core."""
    cluster_process_rate: float = math.inf
    """The same on a cluster (3 primaries, per process of 2)."""

    def redis_us(self, kind: str = "sync", scheduled: bool = True,
                 cluster: bool = False) -> float:
        """Redis CPU of one timer's fire (``kind`` sync or async; on a cluster sync only),
        and of its schedule when ``scheduled`` (a steady state: each fire's timer was
        scheduled too)."""
        if cluster:
            return self.cluster_fire_us + (self.cluster_schedule_us if scheduled else 0.0)
        fire = self.fire_sync_us if kind == "sync" else self.fire_async_us
        return fire + (self.schedule_us if scheduled else 0.0)

    def busy(self, cluster: bool = False) -> float:
        """The share of a core a listener process used at full speed (1.0 when its rate
        was not measured)."""
        rate = self.cluster_process_rate if cluster else self.process_rate
        us = self.cluster_listener_us if cluster else self.listener_sync_us
        return min(1.0, rate * us / 1e6)

    def listener_us(self, kind: str = "sync", task_us: float = 0.0,
                    cluster: bool = False) -> float:
        """Listener CPU per fire, with a task of ``task_us`` µs of its own."""
        if cluster:
            return self.cluster_listener_us + task_us
        own = self.listener_sync_us if kind == "sync" else self.listener_async_us
        return own + task_us


@dataclass(frozen=True)
class Ceiling:
    """Fires/s a deployment holds, and the side that stops it."""

    redis: float
    """Fires/s at which the busiest primary's Redis CPU reaches one core."""
    listeners: float
    """Fires/s at which the listener cores are all busy."""
    machine: float = math.inf
    """Fires/s at which Redis and listeners together fill the cores they share
    (inf when they run on machines of their own)."""

    @property
    def rate(self) -> float:
        """The fires/s: the lowest ceiling."""
        return min(self.redis, self.listeners, self.machine)

    @property
    def bound(self) -> str:
        """Which side saturates first: Redis, listeners or (shared cores) machine."""
        return min(((self.redis, REDIS), (self.listeners, LISTENERS),
                    (self.machine, MACHINE)))[1]


def ceiling(parts: Parts, primaries: int, listener_cores: float, *, kind: str = "sync",
            task_us: float = 0.0, imbalance: float = 1.0, scheduled: bool = True,
            shared_cores: float | None = None, cluster: bool = True,
            processes: int | None = None) -> Ceiling:
    """The fires/s of ``primaries`` primaries (one shard each) and ``listener_cores`` cores
    of listeners. ``shared_cores``: Redis and the listeners run on these cores together
    (None: each has its own machine). ``cluster``: a Redis Cluster's costs (else one
    server's, ``primaries`` 1). ``processes``: the listeners are so many processes, each
    at most its measured rate (:attr:`Parts.process_rate`)."""
    if primaries < 1 or listener_cores <= 0 or imbalance < 1.0:
        raise ValueError("primaries >= 1, listener_cores > 0 and imbalance >= 1 are needed")
    if not cluster and primaries != 1:
        raise ValueError("one server is one primary")
    redis_us = parts.redis_us(kind, scheduled, cluster)
    listener_us = parts.listener_us(kind, task_us, cluster)
    redis = primaries * 1e6 / (redis_us * imbalance)
    listeners = listener_cores * 1e6 / listener_us
    if processes is not None:
        rate = parts.cluster_process_rate if cluster else parts.process_rate
        listeners = min(listeners, processes * rate)
    machine = math.inf if shared_cores is None else shared_cores * 1e6 / (redis_us
                                                                           + listener_us)
    return Ceiling(redis, listeners, machine)


def listener_cores_to_match(parts: Parts, primaries: int, *, kind: str = "sync",
                            task_us: float = 0.0, imbalance: float = 1.0,
                            scheduled: bool = True, cluster: bool = True) -> float:
    """Listener cores that keep up with ``primaries`` primaries at their Redis ceiling."""
    redis = primaries * 1e6 / (parts.redis_us(kind, scheduled, cluster) * imbalance)
    return redis * parts.listener_us(kind, task_us, cluster) / 1e6


def pending_capacity(parts: Parts, primaries: int, usable_bytes: float, *, far: bool = True,
                     history_per_shard: int = 100_000, imbalance: float = 1.0) -> int:
    """Pending timers that fit in ``primaries`` primaries of ``usable_bytes`` each (their
    ``maxmemory``), each primary keeping its shard's run history; the busiest shard fills
    first (``imbalance``, its timers over the mean)."""
    if primaries < 1 or imbalance < 1.0:
        raise ValueError("primaries >= 1 and imbalance >= 1 are needed")
    per_timer = parts.bytes_far if far else parts.bytes_near
    free = usable_bytes - history_per_shard * parts.bytes_history
    if free <= 0:
        return 0
    return int(primaries * free / (per_timer * imbalance))


def primaries_for(parts: Parts, pending: int, usable_bytes: float, *, far: bool = True,
                  history_per_shard: int = 100_000, imbalance: float = 1.0) -> int:
    """The fewest primaries of ``usable_bytes`` each that hold ``pending`` timers."""
    per_timer = parts.bytes_far if far else parts.bytes_near
    free = usable_bytes - history_per_shard * parts.bytes_history
    if free <= 0:
        raise ValueError("the run history alone fills a primary of that size")
    return max(1, math.ceil(pending * per_timer * imbalance / free))


@dataclass(frozen=True)
class TableRow:
    """One line of the capacity table."""

    label: str
    primaries: int
    redis: float
    """Redis's ceiling, plain-function fires/s, each timer scheduled by a ``schedule()``
    call too."""
    redis_fires_only: float
    """Redis's ceiling for fires of timers scheduled earlier (or by ``schedule_many``,
    whose cost per timer is a fraction of a call's)."""
    cores: float
    """Listener cores that keep up with the Redis ceiling (a no-op task)."""
    processes: float
    """Listener processes that keep up with it, each at the rate one reached (a process
    waits on round trips too: more processes than cores)."""
    by_cores: tuple[tuple[float, Ceiling], ...]
    """(listener cores, the ceiling with that many) for each column."""
    pending_far: int
    """Pending timers a day out that fit in the primaries' usable memory."""


def table(parts: Parts, primaries: Sequence[int] = (1, 3, 6, 12),
          cores: Sequence[float] = (1, 2, 4, 8, 16), *, usable_bytes: float = 16 * GIB,
          imbalance: float = 1.0, task_us: float = 0.0) -> list[TableRow]:
    """The capacity table, plain-function fires: a row for one server, then one per primary
    count of a cluster (one shard per primary): Redis's ceilings, the listener cores that
    match, the fires/s with each count of listener cores, and pending timers a day out."""
    rows = []
    for p, cluster in [(1, False), *((p, True) for p in primaries)]:
        label = f"{p} primar{'ies' if p > 1 else 'y'}" if cluster else "one server"
        rows.append(TableRow(
            label, p,
            ceiling(parts, p, 1, imbalance=imbalance, cluster=cluster).redis,
            ceiling(parts, p, 1, imbalance=imbalance, cluster=cluster, scheduled=False).redis,
            listener_cores_to_match(parts, p, imbalance=imbalance, task_us=task_us,
                                    cluster=cluster),
            ceiling(parts, p, 1, imbalance=imbalance, cluster=cluster).redis
            / (parts.cluster_process_rate if cluster else parts.process_rate),
            tuple((c, ceiling(parts, p, c, imbalance=imbalance, task_us=task_us,
                              cluster=cluster)) for c in cores),
            pending_capacity(parts, p, usable_bytes, imbalance=imbalance)))
    return rows


def ratio(measured: float, predicted: float) -> float:
    """measured / predicted (nan when nothing was predicted)."""
    return measured / predicted if predicted else math.nan


def imbalance_of(values: Sequence[float]) -> float:
    """The busiest over the mean (1.0 for an even spread; nan for nothing)."""
    if not values or sum(values) <= 0:
        return math.nan
    return max(values) / (sum(values) / len(values))
