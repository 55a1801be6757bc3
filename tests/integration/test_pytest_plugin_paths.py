"""The ``timers_test`` fixture finds the app's tasks package from the project's root
(pytest's rootdir, where ``timers_tasks`` is set), wherever pytest was started: an IDE
often runs one test file with its own directory as the working directory.

A fresh pytest process: an integration test (no Redis involved, one server only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TEST = '''
import timers

def test_the_task_runs(timers_test):
    timers.schedule("jobs.hello", ["ann"], in_=0)
    (run,) = timers_test.run_due()
    assert run.outcome.ok, run.outcome.message
'''


def test_the_tasks_package_is_found_when_pytest_runs_from_a_subdirectory(
        tmp_path: Path) -> None:
    project = tmp_path / "shop"
    (project / "myapp" / "tasks").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "tasks" / "__init__.py").write_text("")
    (project / "myapp" / "tasks" / "jobs.py").write_text("def hello(name):\n    pass\n")
    (project / "pytest.ini").write_text("[pytest]\ntimers_tasks = myapp.tasks\n")
    (project / "tests" / "test_jobs.py").write_text(TEST)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("TIMERS_", "PYTEST_"))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_jobs.py"], cwd=project / "tests", env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
