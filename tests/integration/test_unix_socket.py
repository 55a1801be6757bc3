"""``timers listen --url unix:///path.sock?db=3``: the listener over a Unix socket.

The listener built its client with TCP-only options, so a Unix socket URL died with a
``TypeError`` (``socket_keepalive``) on the first command, while producers and ``check``
worked over the same socket.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT
from tests.integration.helpers import Processes
from tests.retry_tasks import done
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer

pytestmark = pytest.mark.integration


@pytest.fixture
def unix_url() -> Iterator[str]:
    """A second server that also listens on a Unix socket (short path: sun_path is 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="timers-sock-", dir="/tmp") as where:
        sock = Path(where) / "redis.sock"
        with EmbeddedServer(config=ROOT / "redis.conf",
                            extra_args=("--unixsocket", str(sock), "--unixsocketperm", "700")):
            yield f"unix://{sock}?db=3"


def test_listen_over_a_unix_socket_fires_timers(unix_url: str, r: redis.Redis,
                                                processes: Processes) -> None:
    with Timers(unix_url) as t:
        t.schedule_many(TimerSpec("ok.hit", [f"unix-{i}"], in_=0) for i in range(5))
        listener = processes.timers("listen", "--burst", "--url", unix_url,
                                    "--tasks", "tests.retry_tasks")
        code = listener.wait(30)
        output = processes.output(listener)
        assert "Traceback" not in output, output
        assert code == 0, output
        assert sorted(tag for tag, _ in done(r)) == [f"unix-{i}" for i in range(5)]
        stats = t.stats()
        assert (stats.pending, stats.running, stats.fired) == (0, 0, 5)
