"""The deployment files docs/guides/deploying.md shows are the ones tested (the page's
copies are compared with them by tests/unit/test_docs_code_blocks.py):
``docs/deploy/Dockerfile``'s command runs as PID 1 of a pid namespace (``unshare --pid
--fork``, as root; else as a child subreaper, which Linux re-parents orphans to the same way), and
``docs/deploy/timers.service`` passes ``systemd-analyze verify``.

As PID 1 the supervisor reaps what a crashed child leaves behind (0 zombies), waits for a
Redis that starts after it, and stops on SIGTERM; every line it and its children write
under ``--log-format json`` is JSON."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes
from tests.processes import alive, children_of
from timers import Timers
from timers.dev.server import EmbeddedServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]
DEPLOY = ROOT / "docs" / "deploy"
SUBREAPER = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
             "os.execvp(sys.argv[1], sys.argv[1:])")
"""Become a child subreaper (PR_SET_CHILD_SUBREAPER, kept across exec), then run argv."""


def dockerfile() -> tuple[dict[str, str], list[str]]:
    """The ``ENV`` settings and the exec-form ``CMD`` of docs/deploy/Dockerfile."""
    env: dict[str, str] = {}
    command: list[str] = []
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in line[4:].split())
        elif line.startswith("CMD "):
            command = json.loads(line[4:])
    return env, command


def as_pid_1(command: list[str]) -> tuple[list[str], str]:
    """``command`` run as PID 1 of a new pid namespace where this user may make one, else
    as a child subreaper; and which of the two."""
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0:
        probe = subprocess.run([unshare, "--pid", "--fork", "--kill-child", "true"],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return [unshare, "--pid", "--fork", "--kill-child", *command], "pid namespace"
    return [sys.executable, "-c", SUBREAPER, *command], "subreaper"


class Container:
    """The Dockerfile's command started as PID 1, with the app's tasks package."""

    def __init__(self, processes: Processes, url: str, workdir: Path, *extra: str,
                 one_process: bool = False) -> None:
        env, command = dockerfile()
        assert command[:2] == ["timers", "listen"], command
        if one_process:  # the same CMD without --processes N
            at = command.index("--processes")
            command = command[:at] + command[at + 2:]
        launcher, self.kind = as_pid_1([TIMERS_COMMAND, *command[1:], *extra])
        self.processes = processes
        self.workdir = workdir
        self.prefix = env["TIMERS_PREFIX"]
        self.proc = processes.spawn(*launcher, own_session=True, env={
            **processes.env(), **env, "TIMERS_TASKS": "tests.pid1_tasks",
            "TIMERS_REDIS_URL": url})
        self.url = url

    @functools.cached_property
    def init(self) -> int:
        """The host pid of the process that is PID 1 (or the subreaper): the supervisor."""
        if self.kind == "subreaper":
            return self.proc.pid
        return wait_until(lambda: min(children_of(self.proc.pid), default=None), 10,
                          message="unshare's child")

    def output(self) -> str:
        return self.processes.output(self.proc)

    def zombies(self) -> set[int]:
        """Zombies in the container: children of PID 1 or of its children, dead and not
        reaped."""
        found = children_of(self.init, zombies=True) - children_of(self.init)
        for child in children_of(self.init):
            found |= children_of(child, zombies=True) - children_of(child)
        return found

    def stop(self) -> int:
        os.kill(self.init, signal.SIGTERM)
        return self.proc.wait(60)


def json_lines(output: str) -> list[dict[str, object]]:
    """Every line of ``output`` parsed as JSON (fails on the first that is not)."""
    parsed = []
    for line in output.splitlines():
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not JSON: {line!r}\n--- all output:\n{output}")
    return parsed


def expected_tries(seconds: float) -> int:
    """Tries made within ``seconds`` at 0.5 s doubling to 5 s apart (the first at 0)."""
    at, pause, tries = 0.0, 0.5, 0
    while at < seconds:
        tries, at, pause = tries + 1, at + pause, min(pause * 2, 5.0)
    return tries


@pytest.fixture
def late_server() -> Iterator[EmbeddedServer]:
    """A server on a port chosen now, started by the test when it wants."""
    server = EmbeddedServer(config=ROOT / "redis.conf", port=free_port())
    yield server
    server.stop()


def test_as_pid_1_a_crashed_child_leaves_no_zombie(
        redis_url: str, processes: Processes, tmp_path: Path) -> None:
    box = Container(processes, redis_url, tmp_path)
    wait_until(lambda: box.output().count("starting on") == 2, 20,
               message="two listeners up")
    with Timers(redis_url, prefix=box.prefix) as t:
        t.schedule("orphan_then_crash", [str(tmp_path), 1.0], in_=0)
    wait_until(lambda: "restarting" in box.output(), 20, message="the crashed child restarted")
    orphan = int(wait_until(lambda: (tmp_path / "orphan").read_text() if (
        tmp_path / "orphan").exists() else None, 10, message="the orphan's pid"))
    assert Path(f"/proc/{orphan}/stat").read_text().split()[3] == str(box.init)  # adopted
    # it exits 0.5 s later; PID 1 must reap it (a zombie keeps its /proc entry)
    wait_until(lambda: not Path(f"/proc/{orphan}").exists(), 10, message="the orphan reaped")
    with Timers(redis_url, prefix=box.prefix) as t:
        t.schedule("note", [str(tmp_path), "after"], in_=0)
    wait_until(lambda: (tmp_path / "after").exists(), 20, message="a timer after the crash")
    assert box.zombies() == set()
    listeners = children_of(box.init)
    assert box.stop() == 0, box.output()
    lines = json_lines(box.output())
    assert any("killed by SIGKILL; restarting" in str(line["message"]) for line in lines)
    assert not any(alive(pid) for pid in listeners)


def test_one_listener_as_pid_1_runs_under_the_supervisor(
        redis_url: str, processes: Processes, tmp_path: Path) -> None:
    box = Container(processes, redis_url, tmp_path, one_process=True)
    if box.kind != "pid namespace":
        pytest.skip("needs a pid namespace (root and unshare): a subreaper is not PID 1")
    wait_until(lambda: "starting on" in box.output(), 20, message="the listener up")
    with Timers(redis_url, prefix=box.prefix) as t:
        t.schedule("orphan_then_crash", [str(tmp_path), 1.0], in_=0)
    wait_until(lambda: "restarting" in box.output(), 20, message="the crashed child restarted")
    orphan = int(wait_until(lambda: (tmp_path / "orphan").read_text() if (
        tmp_path / "orphan").exists() else None, 10, message="the orphan's pid"))
    wait_until(lambda: not Path(f"/proc/{orphan}").exists(), 10, message="the orphan reaped")
    assert box.stop() == 0, box.output()
    lines = json_lines(box.output())
    supervisor = [str(line["message"]) for line in lines if line["role"] == "supervisor"]
    assert re.fullmatch(r"listener 0 started \(pid \d+\)", supervisor[0]), supervisor


@pytest.mark.parametrize("down", [pytest.param(3.0, id="3s"),
                                  pytest.param(30.0, id="30s", marks=pytest.mark.slow)])
def test_as_pid_1_with_redis_down_at_boot_it_waits_then_runs(
        late_server: EmbeddedServer, processes: Processes, tmp_path: Path,
        down: float) -> None:
    box = Container(processes, late_server.url, tmp_path)
    wait_until(lambda: "cannot connect to Redis" in box.output(), 20,
               message="a first try to reach Redis, logged")
    first_try = time.monotonic()
    wait_until(lambda: time.monotonic() - first_try >= down, down + 1, interval=0.1,
               message="the outage to last")
    assert box.proc.poll() is None, box.output()
    late_server.start()
    with Timers(late_server.url, prefix=box.prefix) as t:
        t.schedule("note", [str(tmp_path), "ran"], in_=0)
    wait_until(lambda: (tmp_path / "ran").exists(), 30, message="the timer to run")
    assert box.stop() == 0, box.output()
    lines = json_lines(box.output())
    tries = [line for line in lines if "cannot connect to Redis" in str(line["message"])]
    assert all(line["level"] == "WARNING" and line["role"] == "supervisor" for line in tries)
    assert len(tries) >= expected_tries(down - 0.5), len(tries)
    assert re.fullmatch(rf"cannot connect to Redis at 127\.0\.0\.1:{late_server.port}: "
                        r"connection refused; try 1, next in 0\.5 s \(giving up in "
                        r"(59\.\d|60\.0) s\)", str(tries[0]["message"])), tries[0]
    assert any(str(line["message"]).startswith("stopped: supervisor") for line in lines)


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit = (DEPLOY / "timers.service").read_text()
    assert re.search(r"^KillMode=control-group$", unit, re.M), unit
    # the same unit, its command pointed at this checkout's `timers` (verify checks that
    # the ExecStart binary exists and is executable)
    copy = tmp_path / "myapp-timers.service"
    copy.write_text(unit.replace("/srv/myapp/.venv/bin/timers", TIMERS_COMMAND))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr  # (a bad KillMode= is only a warning)
    command = re.search(r"^ExecStart=/srv/myapp/.venv/bin/timers (.*)$", unit, re.M)
    assert command is not None and "--processes" in command[1]
