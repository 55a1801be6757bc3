"""The rule of ``tests/unit`` is enforced (``tests/unit/no_processes.py``): every way of
starting a process or a server is refused and recorded, and every unit test runs under it."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import multiprocessing
import os
import pty
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.unit import no_processes


def _listen() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()


def _asyncio_subprocess() -> None:
    async def start() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    asyncio.run(start())


def _asyncio_server() -> None:
    async def start() -> None:
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)

    asyncio.run(start())


def _multiprocessing(method: str) -> Callable[[], None]:
    def start() -> None:
        multiprocessing.get_context(method).Process(target=print).start()
    return start


STARTS: dict[str, Callable[[], object]] = {
    "subprocess.run": lambda: subprocess.run(["true"], check=False),
    "os.popen": lambda: os.popen("true"),
    "os.system": lambda: os.system("true"),
    "os.fork": lambda: os.fork(),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
    "pty.fork": lambda: pty.fork(),
    "asyncio subprocess": _asyncio_subprocess,
    "multiprocessing fork": _multiprocessing("fork"),
    "multiprocessing spawn": _multiprocessing("spawn"),
    "multiprocessing forkserver": _multiprocessing("forkserver"),
    "socket listen": _listen,
    "asyncio server": _asyncio_server,
    "http.server": lambda: http.server.HTTPServer(("127.0.0.1", 0),
                                                 http.server.BaseHTTPRequestHandler),
}


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_every_way_to_start_a_process_or_a_server_is_refused_and_recorded(
        start: Callable[[], object]) -> None:
    with no_processes.forbid() as attempts, pytest.raises(no_processes.Forbidden):
        start()
    assert len(attempts) == 1, attempts
    assert no_processes.violations(attempts, no_processes.children()) is not None


def test_a_refusal_the_code_swallowed_still_counts() -> None:
    with no_processes.forbid() as attempts, contextlib.suppress(Exception):
        subprocess.run(["true"], check=False)
    problem = no_processes.violations(attempts, no_processes.children())
    assert problem is not None and "started a subprocess" in problem


def test_every_unit_test_runs_under_the_rule() -> None:
    """The hooks in tests/unit/conftest.py: no test here needs to ask for it."""
    assert subprocess._fork_exec.__name__ == "refuse"  # type: ignore[attr-defined]
    assert socket.socket.listen.__name__ == "refuse"


def test_the_rule_leaves_everything_as_it_was() -> None:
    saved = [(owner, name, vars(owner).get(name)) for owner, name, _ in no_processes.GUARDED]
    with no_processes.forbid():
        pass
    assert [(owner, name, vars(owner).get(name))
            for owner, name, _ in no_processes.GUARDED] == saved

