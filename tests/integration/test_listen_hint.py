"""A new user's first ``timers listen`` in a directory of their own, with no tasks package
named: one line saying how to name it (``--tasks`` / ``$TIMERS_TASKS``), exit 1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import TIMERS_COMMAND

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_listen_without_a_tasks_package_suggests_naming_one(redis_url: str,
                                                            tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TIMERS_TASKS") and not k.startswith("PYTEST_")}
    done = subprocess.run([TIMERS_COMMAND, "listen", "--url", redis_url, "--burst"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "error: tasks package 'tasks' cannot be imported: ModuleNotFoundError: No module "
        "named 'tasks'; name your tasks package with --tasks myapp.tasks or "
        f"TIMERS_TASKS=myapp.tasks (looked for on PYTHONPATH, then in {tmp_path})\n")
