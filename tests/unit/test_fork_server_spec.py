"""What the quarantine fork server is to import reaches it without a change to the
listener's environment, which its task threads read while they run (one timer ended dead
of ``KeyError: 'TIMERS_FORK_SERVER_PRELOAD'`` when the variable was set and popped around
the fork server's start). No process is started: multiprocessing's part is stood in for."""

from __future__ import annotations

import os
from multiprocessing import forkserver
from typing import Any

import pytest

from timers.listener.quarantine import fork_server
from timers.listener.quarantine.parent import ChildLogs


def test_starting_the_fork_server_leaves_the_environment_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def ensure_running() -> None:  # multiprocessing's, which starts the server
        seen["environ"] = dict(os.environ)
        seen["preload"] = list(forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]

    monkeypatch.setattr(forkserver, "ensure_running", ensure_running)
    monkeypatch.setattr(forkserver._forkserver, "_preload_modules",
                        forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]
    before = dict(os.environ)
    fork_server.ensure_running("tasks", "/srv/app", ChildLogs("INFO", "json", "web-1:7"))
    assert seen["environ"] == before == dict(os.environ)
    preload = seen["preload"]
    assert preload[0] == fork_server.PRELOAD

    def main(listener_fd: int, alive_r: int, preload: list[str]) -> str | None:
        return fork_server._spec_given()  # as the fork server's preload import reads it

    monkeypatch.setattr(forkserver, "main", main)
    assert main(0, 0, preload) == (
        '{"package": "tasks", "search_path": "/srv/app", "logs": ["INFO", "json", "web-1:7"]}')
    assert fork_server._spec_given() is None, "outside the fork server: nothing"
