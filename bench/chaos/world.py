"""The world a chaos run plays in: the servers (one, a Sentinel deployment or a Cluster),
the partition proxy, and the real ``timers listen`` processes.

Listeners (``$TIMERS_CHAOS_LISTENER`` names each in the ledger):

======  ==================================================================================
``L0``  ``--processes 2 --max-runs-per-child 300``: a supervisor and its listener
        children, the source prefix
``L1``  one listener process of the source prefix; on one server, through the partition
        proxy (:mod:`bench.chaos.proxy`)
``L2``  one listener process of the target prefix (where ``timers move`` takes timers)
======  ==================================================================================

Through Sentinel every listener runs with ``--replicas 1``: a failover leaves the promoted
primary without a replica until the old one is back and synced, and the listeners hold
their claims meanwhile (:mod:`timers.listener.finding.guards`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from bench.chaos.proxy import PartitionProxy
from bench.fault_tasks.chaos import LISTENER_ENV
from bench.faults.processes import REPO, ListenerProcess, child_pids, pid_running
from timers import Timers
from timers.dev.server import EmbeddedServer

if TYPE_CHECKING:
    from tests.clusters import Cluster
    from tests.sentinels import Deployment

SOURCE, TARGET = "chaos", "chaos2"
"""The prefixes (on a Cluster each is split into a shard per primary)."""
SUPERVISED = "L0"
PROXIED = "L1"
ON_TARGET = "L2"
CONCURRENCY = 20
RUNS_PER_CHILD = 300
"""``--max-runs-per-child`` of the supervisor: its children are replaced as the run goes."""


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (children, their children…)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in child_pids(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class World:
    """Servers, proxy and listeners of one run; :meth:`close` ends every one of them."""

    def __init__(self, workdir: Path, ledger: Path, lease: float, topology: str = "server",
                 binary: str | None = None) -> None:
        self.workdir, self.ledger, self.lease = workdir, ledger, lease
        self.topology = topology
        self.binary = binary
        self.stack = ExitStack()
        self.server: EmbeddedServer | None = None
        self.proxy: PartitionProxy | None = None
        self.cluster: Cluster | None = None
        self.deployment: Deployment | None = None
        self.listeners: dict[str, ListenerProcess] = {}
        self.writes = threading.RLock()
        """Held by the generator around each write, and by a fault that stops writes (a
        restart, a full server), so the workload's writes wait for it to end."""
        self.url = ""
        self.source, self.target = SOURCE, TARGET

    # servers

    def start(self) -> None:
        """Start the servers, the proxy and the three listeners."""
        if self.topology == "cluster":
            from tests.clusters import real_cluster

            self.cluster = self.stack.enter_context(real_cluster(3, replicas=True))
            self.url = self.cluster.url
        elif self.topology == "sentinel":
            from tests.sentinels import sentinel_deployment

            self.deployment = self.stack.enter_context(sentinel_deployment())
            self.url = self.deployment.url
        else:
            self.server = EmbeddedServer(self.binary, config=REPO / "redis.conf",
                                         extra_args=("--appendonly", "yes"))
            self.server.start()
            self.stack.callback(self.server.stop)
            self.proxy = PartitionProxy(self.server.port).start()
            self.stack.callback(self.proxy.stop)
            self.url = self.server.url
        self.start_listener(SUPERVISED, self.source, processes=2)
        self.start_listener(PROXIED, self.source)
        self.start_listener(ON_TARGET, self.target)

    def client(self) -> redis.Redis | redis.RedisCluster:
        """A client of the servers (a Cluster's, or the current Sentinel primary's)."""
        if self.cluster is not None:
            return redis.RedisCluster(host="127.0.0.1", port=self.cluster.primaries[0].port,
                                      socket_timeout=15)
        return redis.Redis.from_url(self.url, socket_timeout=15) if self.server else \
            redis.Redis(port=self._sentinel_primary(), socket_timeout=15)

    def _sentinel_primary(self) -> int:
        assert self.deployment is not None
        return self.deployment.primary_port()

    def timers(self, prefix: str) -> Timers:
        """A producer of ``prefix``."""
        return Timers(self.url, prefix=prefix)

    # listeners

    def start_listener(self, lid: str, prefix: str, processes: int = 1) -> ListenerProcess:
        """Start listener ``lid`` of ``prefix`` (a supervisor with ``processes`` > 1)."""
        url = self.proxy.url if self.proxy is not None and lid == PROXIED else self.url
        extra: tuple[str, ...] = (
            ("--max-runs-per-child", str(RUNS_PER_CHILD)) if processes > 1 else ())
        if self.topology == "sentinel":  # a run starts once its claim is on the replica
            extra += ("--replicas", "1")
        listener = ListenerProcess(
            url, self.ledger, self.workdir / f"{lid}-{int(time.time() * 1000)}.log",
            lease=self.lease, concurrency=CONCURRENCY, shutdown_timeout=2.0,
            extra_env={LISTENER_ENV: lid, "TIMERS_PREFIX": prefix}, processes=processes,
            extra_args=extra)
        self.listeners[lid] = listener
        return listener

    def restart_listener(self, lid: str) -> None:
        """A new process in place of a plain listener that was killed."""
        old = self.listeners[lid]
        with contextlib.suppress(Exception):
            old.kill()
        self.start_listener(lid, self.target if lid == ON_TARGET else self.source)

    def revive(self) -> list[tuple[str, int | None]]:
        """Start again each plain listener that exited; (listener, its exit code) each."""
        out = []
        for lid in (PROXIED, ON_TARGET):
            listener = self.listeners.get(lid)
            if listener is not None and not listener.alive():
                out.append((lid, listener.process.returncode))
                self.restart_listener(lid)
        return out

    def targets(self) -> list[tuple[str, int]]:
        """The processes a fault may hit, as (listener, pid): the supervisor's listener
        children and the source prefix's plain listener, in a stable order (the target
        prefix's listener only runs what was moved: it is left alone)."""
        out: list[tuple[str, int]] = []
        for lid in (SUPERVISED, PROXIED):
            listener = self.listeners[lid]
            if not listener.alive():
                continue
            if listener.processes > 1:
                out += [(lid, pid) for pid in child_pids(listener.pid)]
            else:
                out.append((lid, listener.pid))
        return out

    def check_alive(self) -> list[str]:
        """What went wrong with a listener: exited by itself."""
        return [f"{lid} (pid {listener.pid}) exited {listener.process.returncode}: "
                f"{listener.last_words()}"
                for lid, listener in self.listeners.items() if not listener.alive()]

    def stop_listeners(self) -> None:
        """SIGTERM every listener and wait for it (SIGKILL after 15 s)."""
        for listener in self.listeners.values():
            with contextlib.suppress(Exception):
                listener.stop(15)

    def close(self) -> None:
        """Kill what is left, stop the proxy and the servers."""
        for listener in self.listeners.values():
            with contextlib.suppress(Exception):
                listener.kill()
        self.stack.close()

    def gone(self, pids: set[int], timeout: float) -> float | None:
        """Monotonic s when none of ``pids`` runs any more; None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(pid_running(pid) for pid in pids):
                return time.monotonic()
            time.sleep(0.02)
        return None

