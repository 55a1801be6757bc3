"""The docs' shell walkthroughs that need a server, run as written by bash against the
test server (the unit tests only parse their ``timers`` commands): the tour of
docs/getting-started.md, a task package of your own (docs/guides/your-own-app.md) and the
JSON logs (docs/guides/listeners.md). Only where a block names a place of the reader's do
the tests put their own: the server's URL, and a temporary directory for ``/tmp/…``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.docs_blocks import Block, blocks_of
from tests.integration.helpers import TIMERS_COMMAND
from tests.unit.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def block(page: str, starting: str) -> Block:
    (found,) = [b for b in blocks_of(ROOT / page)
                if b.lang == "sh" and b.code.startswith(starting)]
    return found


def run(script: str, url: str) -> subprocess.CompletedProcess[str]:
    """``script`` under ``bash -e``, in the repository, ``timers`` of this venv on PATH
    (and no ``PYTHONPATH``: it would put this repository's ``tasks`` package ahead of the
    one a block makes in its own directory)."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("TIMERS_", "PYTEST_"))}
    env["PATH"] = os.pathsep.join([str(Path(TIMERS_COMMAND).parent), env.get("PATH", "")])
    env["TIMERS_REDIS_URL"] = url
    return subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=90, check=False)


def test_the_getting_started_tour(redis_url: str) -> None:
    code = block("docs/getting-started.md", ". .venv/bin/activate").code
    lines = code.splitlines()
    # the venv is this test's own (on PATH); the server is the suite's, not `timers server`'s
    assert lines[0] == ". .venv/bin/activate" and lines[1].startswith("export TIMERS_REDIS_URL=")
    done = run("\n".join(lines[2:]), redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reminders.sms" in done.stdout  # timers list
    assert "SMS to user 42" in done.stderr  # the listener ran tasks/reminders.py's sms
    assert re.search(r"^fired: +1$", done.stdout, re.M)  # timers stats


def test_a_tasks_package_of_your_own(redis_url: str, tmp_path: Path) -> None:
    code = block("docs/guides/your-own-app.md", "mkdir -p /tmp/myapp-demo").code
    done = run(code.replace("/tmp/myapp-demo", str(tmp_path / "myapp-demo")), redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "invoicing customer 7" in done.stdout


def test_the_json_logs(redis_url: str, tmp_path: Path) -> None:
    code = block("docs/guides/listeners.md", "mkdir -p /tmp/logs-demo").code
    done = run(code.replace("/tmp/logs-demo", str(tmp_path / "logs-demo")), redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello ada" in done.stdout
    schedule_output, _, _ = done.stdout.partition("hello ada")
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    (fire,) = [line for line in lines if line["logger"] == "timers.fires"]
    assert (fire["id"], fire["task"], fire["outcome"]) == ("greet-ada", "hello", "ok")
    assert "greet-ada" in schedule_output  # timers schedule printed the id


def test_the_first_own_timer_from_an_empty_directory(redis_url: str, tmp_path: Path) -> None:
    code = block("docs/getting-started.md", "export TIMERS_REDIS_URL=").code
    lines = code.splitlines()
    assert lines[0].startswith("export TIMERS_REDIS_URL=")  # the suite's server instead
    done = run("\n".join(lines[1:]).replace("/tmp/first-timer", str(tmp_path / "first")),
               redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello ada" in done.stdout  # the listener ran the block's own task
    assert re.search(r"^fired: +1$", done.stdout, re.M)
