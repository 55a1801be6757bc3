"""A real Sentinel deployment on loopback for the tests: a primary and a replica started with
the project's redis.conf, and three sentinels watching them (quorum 2), torn down after.

Sentinels decide a primary is down after :data:`DOWN_AFTER_MS` without an answer; a
failover then takes a few seconds more (an election among the sentinels, the replica's
promotion).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.conftest import poll
from timers.dev.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
SERVICE = "timers-primary"
DOWN_AFTER_MS = 1000
SENTINELS = 3


@dataclass
class Deployment:
    primary: EmbeddedServer
    replica: EmbeddedServer
    sentinels: list[EmbeddedServer]
    others: tuple[EmbeddedServer, ...] = ()
    """Replicas past the first (``sentinel_deployment(replicas=n)``)."""

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL of the deployment (all three sentinels)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def primary_port(self) -> int:
        with redis.Redis(port=self.sentinels[0].port, decode_responses=True) as s:
            return int(s.sentinel_get_master_addr_by_name(SERVICE)[1])

    def server_on(self, port: int) -> EmbeddedServer:
        return next(s for s in (self.primary, self.replica, *self.others) if s.port == port)

    def wait_in_sync(self, timeout: float = 20.0) -> None:
        """Until every replica has every write of the primary (``WAIT``)."""
        n = 1 + len(self.others)
        with redis.Redis(port=self.primary_port()) as primary:
            if primary.execute_command("WAIT", n, int(timeout * 1000)) < n:
                raise RuntimeError("the replicas did not catch up")


def _sentinel_config(directory: Path, primary_port: int, n: int) -> Path:
    path = directory / f"sentinel-{n}.conf"
    path.write_text(
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )
    return path


def _wait_watching(deployment: Deployment, timeout: float = 30.0) -> None:
    """Until every sentinel knows the replicas and the other sentinels (a failover needs
    both: the replica to promote, a quorum to agree)."""
    def watching(sentinel: EmbeddedServer) -> bool:
        with redis.Redis(port=sentinel.port, decode_responses=True) as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", SERVICE)
            others = client.execute_command("SENTINEL", "SENTINELS", SERVICE)
        return len(replicas) >= 1 + len(deployment.others) and len(others) >= SENTINELS - 1

    if not poll(lambda: all(watching(s) for s in deployment.sentinels), timeout, 0.1):
        raise RuntimeError("the sentinels did not find the replica and each other in time")


@contextmanager
def sentinel_deployment(replicas: int = 1) -> Iterator[Deployment]:
    """Start the primary, its replicas and three sentinels; stop them all at the end."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="timers-sentinel-") as tmp:
        # each server gets a copy of redis.conf: sentinels make servers rewrite their
        # config file (CONFIG REWRITE) when they change roles
        copies = [Path(tmp) / f"redis-{n}.conf" for n in range(1 + replicas)]
        for copy in copies:
            shutil.copyfile(ROOT / "redis.conf", copy)
        primary = stack.enter_context(EmbeddedServer(config=copies[0]))
        replica, *others = [stack.enter_context(EmbeddedServer(
            config=copy, extra_args=("--replicaof", "127.0.0.1", str(primary.port))))
            for copy in copies[1:]]
        sentinels = [stack.enter_context(EmbeddedServer(
            config=_sentinel_config(Path(tmp), primary.port, n), extra_args=("--sentinel",)))
            for n in range(SENTINELS)]
        deployment = Deployment(primary, replica, sentinels, tuple(others))
        _wait_watching(deployment)
        yield deployment
