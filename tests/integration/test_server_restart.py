"""``timers server`` stopped and started again at once: the same port (its last
connections in TIME_WAIT do not make it "in use"), and with ``--data-dir`` the same
timers; without it, a temporary directory that says at stop that its timers went with it."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.integration.helpers import Processes
from timers import Timers
from timers.dev.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def _serve(processes: Processes, port: int, *args: str) -> subprocess.Popen[bytes]:
    server = processes.timers("server", "--port", str(port), *args)
    export = f"export TIMERS_REDIS_URL=redis://127.0.0.1:{port}/0"
    wait_until(lambda: export in processes.output(server) or server.poll() is not None, 15,
               message="`timers server` to print its URL")
    assert server.poll() is None, processes.output(server)
    return server


def _stop(processes: Processes, server: subprocess.Popen[bytes]) -> str:
    server.send_signal(signal.SIGTERM)
    assert server.wait(15) == 0, processes.output(server)
    return processes.output(server)


def test_a_restart_keeps_the_port_and_with_data_dir_the_timers(processes: Processes,
                                                                tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "redis-data"
    url = f"redis://127.0.0.1:{port}/0"
    first = _serve(processes, port, "--data-dir", str(data))
    with Timers(url) as t:
        t.schedule("reminders.sms", [1], in_=3600, id="kept")
        assert t.get("kept") is not None  # a connection open while the server stops
        said = _stop(processes, first)
    assert f"data is kept in {data.resolve()}" in said, said
    assert (data / "server.log").exists()

    second = _serve(processes, port, "--data-dir", str(data))  # at once, the same port
    with Timers(url) as t:
        kept = t.get("kept")
        assert kept is not None and kept.task == "reminders.sms", "the timer is still there"
    _stop(processes, second)

    third = _serve(processes, port)  # a temporary directory, on the same port again
    with Timers(url) as t:
        assert t.get("kept") is None
        t.schedule("reminders.sms", [2], in_=3600, id="lost")
    said = _stop(processes, third)
    assert "removed when it stops, with every timer in it" in said, said
    assert "was removed, and the timers it held went with it" in said, said
