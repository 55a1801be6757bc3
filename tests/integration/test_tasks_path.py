"""Where ``timers listen`` finds the tasks package: on ``PYTHONPATH`` first, then in the
working directory, so a stale copy left in the working directory does not shadow the one
deployed on ``PYTHONPATH`` (with the ``timers`` command and with ``python -m timers``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.integration.helpers import TIMERS_COMMAND, subprocess_env
from tests.task_pkg import URL_ENV
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

PACKAGE = "pathcheck_tasks"
TASK = """import os

import redis


def which():
    redis.Redis.from_url(os.environ["TIMERS_TEST_URL"]).rpush("which", {label!r})
"""


def tasks_package(parent: Path, label: str) -> Path:
    (parent / PACKAGE).mkdir(parents=True)
    (parent / PACKAGE / "__init__.py").write_text(TASK.format(label=label))
    return parent


def run_once(command: list[str], cwd: Path, pythonpath: Path | None, redis_url: str,
             r: redis.Redis) -> list[bytes]:
    """Schedule ``which`` due now, run a burst listener, return what ran."""
    r.delete("which")
    with Timers(redis_url) as t:
        t.schedule("which", in_=0)
    env = subprocess_env()
    env[URL_ENV] = redis_url
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env["PYTHONPATH"]])
    done = subprocess.run([*command, "listen", "--url", redis_url, "--tasks", PACKAGE,
                           "--burst"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return r.lrange("which", 0, -1)


COMMANDS = {"timers": [TIMERS_COMMAND], "python -m timers": [sys.executable, "-m", "timers"]}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_pythonpath_wins_over_a_stale_copy_in_the_working_directory(
        command: list[str], tmp_path: Path, redis_url: str) -> None:
    stale = tasks_package(tmp_path / "app", "stale copy in the working directory")
    deployed = tasks_package(tmp_path / "deployed", "deployed on PYTHONPATH")
    r = redis.Redis.from_url(redis_url)

    assert run_once(command, stale, deployed, redis_url, r) == [b"deployed on PYTHONPATH"]
    # with nothing on PYTHONPATH, the working directory's package still runs
    assert run_once(command, stale, None, redis_url, r) == [
        b"stale copy in the working directory"]
