"""The embedded server (`timers demo`, `timers server`, the tests) leaves nothing on disk
unless asked to: its temporary directory goes at :meth:`EmbeddedServer.stop`, a directory
given to it stays with its data."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT
from timers.dev.server import EmbeddedServer

pytestmark = pytest.mark.integration


def server_dir(server: EmbeddedServer) -> Path:
    """The directory the running server writes to, as the server itself says."""
    with redis.Redis.from_url(server.url, decode_responses=True) as r:
        return Path(r.config_get("dir")["dir"])


def test_a_temporary_directory_is_removed_at_stop_and_a_given_one_kept(tmp_path: Path) -> None:
    server = EmbeddedServer(config=ROOT / "redis.conf").start()
    try:
        temporary = server_dir(server)
        assert temporary.is_dir()
    finally:
        server.stop()
    assert not temporary.exists(), f"{temporary} is left behind"

    given = tmp_path / "data"
    server = EmbeddedServer(config=ROOT / "redis.conf", data_dir=given).start()
    try:
        assert server_dir(server) == given.resolve()
        with redis.Redis.from_url(server.url) as r:
            r.set("kept", "1")
    finally:
        server.stop()
    assert given.is_dir() and any(given.iterdir()), "the given directory and its data stay"
