"""A real Redis Cluster on loopback for the tests: primaries (and a replica each) started with
the project's redis.conf plus ``cluster-enabled yes``, joined from Python (``CLUSTER MEET``,
``ADDSLOTSRANGE``, ``REPLICATE``: no ``redis-cli`` needed), torn down after.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.conftest import poll
from timers.dev.server import EmbeddedServer, port_free

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 16384
NODE_TIMEOUT_MS = 2000


@dataclass
class Cluster:
    primaries: list[EmbeddedServer]
    replicas: list[EmbeddedServer]

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL of the cluster (every primary as a start node)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.primaries)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.primaries[0].port)


BUS_OFFSET = 10_000
"""A cluster node's bus port is its port + 10,000: the port must be at most 55,535."""


def cluster_port() -> int:
    """A free port whose bus port (+10,000) is free too. The kernel's free ports run up to
    60,999, and a node given one above 55,535, or whose bus port another process held,
    did not start (seen in CI as "redis-server did not start")."""
    for _ in range(1000):
        port = random.randint(20_000, 65_535 - BUS_OFFSET)
        if port_free(port) and port_free(port + BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _node(stack: ExitStack, tmp: Path, n: int) -> EmbeddedServer:
    config = tmp / f"redis-{n}.conf"  # a copy: a cluster node rewrites its files
    shutil.copyfile(ROOT / "redis.conf", config)
    return stack.enter_context(EmbeddedServer(config=config, pick_port=cluster_port, extra_args=(
        "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{n}.conf",
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "no")))


def _wait(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    if not poll(condition, timeout, 0.05):
        raise RuntimeError(f"the test cluster did not {what} in time")


def _state_ok(servers: list[EmbeddedServer]) -> bool:
    for server in servers:
        with redis.Redis(port=server.port, decode_responses=True) as r:
            info = r.execute_command("CLUSTER", "INFO")
            text = info if isinstance(info, str) else str(info)
            if "cluster_state:ok" not in text:
                return False
    return True


def _join(primaries: list[EmbeddedServer], replicas: list[EmbeddedServer]) -> None:
    nodes = primaries + replicas
    first = redis.Redis(port=primaries[0].port, decode_responses=True)
    for server in nodes[1:]:
        first.execute_command("CLUSTER", "MEET", "127.0.0.1", server.port)
    share = SLOTS // len(primaries)
    for i, server in enumerate(primaries):
        last = SLOTS - 1 if i == len(primaries) - 1 else (i + 1) * share - 1
        with redis.Redis(port=server.port) as r:
            r.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
    ids = [redis.Redis(port=p.port, decode_responses=True).execute_command("CLUSTER", "MYID")
           for p in primaries]

    def known() -> bool:
        return all(len(redis.Redis(port=s.port, decode_responses=True).execute_command(
            "CLUSTER", "NODES").splitlines()) == len(nodes) for s in nodes)

    _wait(known, "meet")
    for replica, primary_id in zip(replicas, ids, strict=False):
        with redis.Redis(port=replica.port) as r:
            r.execute_command("CLUSTER", "REPLICATE", primary_id)
    _wait(lambda: _state_ok(nodes), "reach cluster_state:ok")
    _wait(lambda: _replicas_known(nodes, len(replicas)), "agree on its replicas")
    first.close()


def _replicas_known(nodes: list[EmbeddedServer], replicas: int) -> bool:
    """Every node sees every replica as one (gossip spreads ``REPLICATE`` after the slots are
    served, so a node may still call a replica an empty primary for a moment)."""
    for server in nodes:
        with redis.Redis(port=server.port, decode_responses=True) as r:
            lines = str(r.execute_command("CLUSTER", "NODES")).splitlines()
        if sum(" slave " in f" {line.split(' ')[2].replace(',', ' ')} " for line in lines) \
                != replicas:
            return False
    return True


@contextmanager
def real_cluster(primaries: int = 3, replicas: bool = True) -> Iterator[Cluster]:
    """Start a cluster of ``primaries`` primaries (and a replica each); stop it at the end."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="timers-cluster-") as tmp:
        servers = [_node(stack, Path(tmp), n) for n in range(primaries * (2 if replicas else 1))]
        cluster = Cluster(servers[:primaries], servers[primaries:])
        _join(cluster.primaries, cluster.replicas)
        yield cluster


def migrate_slot(cluster: Cluster, slot: int, to_port: int, batch: int = 100,
                 pause: float = 0.0) -> int:
    """Move ``slot`` to the primary on ``to_port`` as ``redis-cli --cluster reshard`` does
    (``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` in batches, ``SETSLOT NODE`` everywhere);
    returns how many keys moved. ``pause``: seconds between batches (a slower move)."""
    primaries = live_primaries(cluster)
    source = next(s for s in primaries if _owns(s.port, slot))
    with redis.Redis(port=source.port) as src, redis.Redis(port=to_port) as dst:
        src_id, dst_id = (c.execute_command("CLUSTER", "MYID") for c in (src, dst))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
            src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 10_000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause)  # a slower move, as asked: the pace of the scenario, not a wait
        for server in primaries:
            with redis.Redis(port=server.port) as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return moved


def live_primaries(cluster: Cluster) -> list[EmbeddedServer]:
    """The nodes running as primaries now (a replica promoted after its primary was
    killed is one)."""
    out = []
    for server in cluster.primaries + cluster.replicas:
        if not server.running:
            continue
        with redis.Redis(port=server.port) as r:
            if r.execute_command("ROLE")[0] in (b"master", "master"):
                out.append(server)
    return out


def slot_owner(cluster: Cluster, slot: int) -> EmbeddedServer:
    """The live primary that serves ``slot``."""
    return next(s for s in live_primaries(cluster) if _owns(s.port, slot))


def _owns(port: int, slot: int) -> bool:
    with redis.Redis(port=port) as r:
        for entry in r.execute_command("CLUSTER", "SLOTS"):
            first, last, primary = int(entry[0]), int(entry[1]), entry[2]
            if first <= slot <= last and int(primary[1]) == port:
                return True
    return False
