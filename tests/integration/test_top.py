"""``timers top`` in a real terminal (tmux): it draws, follows the keyspace, and quits on q;
piped, it prints the view once."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import wait_until
from tests.integration.helpers import TIMERS_COMMAND, run_cli, subprocess_env
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server,
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (.ci/run installs it)")]


@pytest.fixture
def session() -> Iterator[str]:
    name = f"timers-top-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True, check=False)


def screen(name: str) -> str:
    done = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                          text=True, check=False)
    return done.stdout


def alive(name: str) -> bool:
    return subprocess.run(["tmux", "has-session", "-t", name], capture_output=True,
                          check=False).returncode == 0


def figure(text: str, label: str) -> str | None:
    found = re.search(rf"^{re.escape(label)}\s+(\S+)", text, re.MULTILINE)
    return found.group(1) if found else None


def test_top_draws_follows_the_keyspace_and_quits_on_q(redis_url: str, session: str) -> None:
    env = {**subprocess_env(), "TERM": "xterm-256color"}
    command = f"{TIMERS_COMMAND} top --url {redis_url} --interval 0.3"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40",
                    command], env=env, check=True, cwd=os.getcwd())
    wait_until(lambda: figure(screen(session), "pending") == "0", 20,
               message="top to draw an empty keyspace")
    with Timers(redis_url) as t:
        t.schedule_many(TimerSpec("reminders.sms", [i], in_=30) for i in range(3))
        t.schedule("reminders.sms", [9], in_=-5, group="nobody")
    wait_until(lambda: figure(screen(session), "pending") == "4", 20,
               message="top to show the 4 timers scheduled")
    text = screen(session)
    assert figure(text, "due in 1 min") == "3" and figure(text, "overdue") == "1", text
    subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
    wait_until(lambda: not alive(session), 10, message="top to quit on q")


def test_top_piped_prints_the_view_once_as_text(redis_url: str) -> None:
    with Timers(redis_url) as t:
        t.schedule("reminders.sms", [1], in_=600)
    done = run_cli("top", "--url", redis_url, timeout=20)
    assert done.returncode == 0, done.stderr
    assert figure(done.stdout, "pending") == "1" and "\x1b[" not in done.stdout
