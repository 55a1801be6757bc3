"""What a new user meets on the command line, run as subprocesses against the test server:
no password printed, the demo from any directory leaving nothing behind, ``timers server``,
and output that stays readable (issue 10: bug 3 and "what a new user tripped over")."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import (
    TASKS,
    TIMERS_COMMAND,
    Processes,
    redis_now,
    run_cli,
    subprocess_env,
)
from timers import Timers
from timers.dev.server import free_port, port_free
from timers.store.check import inspect_server

pytestmark = [pytest.mark.integration, pytest.mark.one_server]
SECRET = "sekret-pw-31337"


@pytest.fixture
def password_url(redis_url: str, r: redis.Redis) -> Iterator[str]:
    """The test server's URL as a user with a password (an ACL user allowed everything)."""
    r.acl_setuser("app", enabled=True, passwords=[f"+{SECRET}"], keys=["*"],
                  channels=["*"], commands=["+@all"])
    try:
        yield redis_url.replace("redis://", f"redis://app:{SECRET}@")
    finally:
        r.acl_deluser("app")


SCHEDULE = ["schedule", "reminders.sms", "[1]", "--in", "1h", "--id", "pw"]
COMMANDS = [["reschedule", "pw", "--in", "2h"], ["get", "pw"], ["list"], ["stats"],
            ["listeners"], ["failed"], ["cron", "list"], ["check"],
            ["listen", "--burst", "--tasks", TASKS], ["demo", "--count", "1"]]
FAILING = [["schedule", "reminders.sms", "--in", "1h"], ["check"],
           ["listen", "--burst", "--tasks", TASKS, "--wait-for-redis", "0"]]


def test_no_command_prints_the_password(password_url: str) -> None:
    """Bug 3: `check`, `list`, `schedule` … printed the URL with its password, in their
    output and in their errors."""
    dead = f"redis://app:{SECRET}@127.0.0.1:{free_port()}/0"
    wrong = password_url.replace(SECRET, SECRET + "-wrong")
    working = [run_cli(*SCHEDULE, "--url", password_url)]
    with ThreadPoolExecutor(4) as pool:
        failing = list(pool.map(lambda args: run_cli(*args), [
            [*command, "--url", url] for url in (dead, wrong) for command in FAILING]))
        working += pool.map(lambda args: run_cli(*args, "--url", password_url), COMMANDS)
    working.append(run_cli("cancel", "pw", "--url", password_url))
    for result in working + failing:
        output = result.stdout + result.stderr
        assert SECRET not in output, (result.args, output)
        assert "Traceback" not in output, (result.args, output)
    assert [r.returncode for r in working] == [0] * len(working), working
    assert [r.returncode for r in failing] == [1] * len(failing), failing


def test_inspect_server_reads_info_config_and_permissions(redis_url: str) -> None:
    names = {f.name for f in inspect_server(redis_url, "timers")}
    assert {"server", "notify-keyspace-events", "maxmemory-policy", "permissions"} <= names


def _run_elsewhere(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``timers ARGS`` from a directory with no tasks/, where only timers is importable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "timers").symlink_to(ROOT / "timers")
    env = subprocess_env()
    env["PYTHONPATH"] = str(site)
    return subprocess.run([TIMERS_COMMAND, *args], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=60, check=False)


def test_demo_runs_from_any_directory_and_leaves_no_keys(tmp_path: Path, redis_url: str,
                                                          r: redis.Redis) -> None:
    r.set("someone-else", "1")
    demo = _run_elsewhere(tmp_path, "demo", "--count", "3", "--url", redis_url)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "all 3 fired" in demo.stdout
    assert r.keys("*") == ["someone-else"], "the demo deleted its keys, and only its own"


def test_demo_refuses_a_prefix_in_use(redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule("reminders.sms", [1], in_=3600, id="mine")
    demo = run_cli("demo", "--count", "1", "--prefix", "timers", "--url", redis_url)
    assert demo.returncode == 1
    assert demo.stderr.startswith("error: prefix 'timers' already holds keys")
    assert timers_client.get("mine") is not None, "the user's timer is untouched"


def test_timers_server_prints_the_url_serves_and_stops_on_sigterm(
        processes: Processes) -> None:
    port = free_port()
    server = processes.timers("server", "--port", str(port))
    url = f"redis://127.0.0.1:{port}/0"
    wait_until(lambda: f"export TIMERS_REDIS_URL={url}" in processes.output(server)
               or server.poll() is not None, 15, message="`timers server` to print its URL")
    assert server.poll() is None, processes.output(server)
    assert f"In another shell:\nexport TIMERS_REDIS_URL={url}\n" in processes.output(server)
    with redis.Redis.from_url(url, decode_responses=True) as client:
        assert client.ping()
        assert "E" in client.config_get("notify-keyspace-events")["notify-keyspace-events"]
    scheduled = run_cli("schedule", "reminders.sms", "[1]", "--in", "1h", "--url", url)
    assert scheduled.returncode == 0, scheduled.stderr
    server.send_signal(signal.SIGTERM)
    assert server.wait(15) == 0, processes.output(server)
    wait_until(lambda: port_free(port), 10, message="the server's port to be released")


def test_timers_server_refuses_a_port_in_use(redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    result = run_cli("server", "--port", str(port))
    assert result.returncode == 1
    assert result.stderr == f"error: port {port} is in use: choose another with --port\n"


def test_list_escapes_control_characters_in_ids(redis_url: str,
                                                timers_client: Timers) -> None:
    timers_client.schedule("reminders.sms", [1], in_=60, id="two\nlines")
    listed = run_cli("list", "--url", redis_url)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert len(rows) == 2 and "two\\nlines" in rows[1], listed.stdout


def test_get_shows_attempts_and_reschedule_moves_a_timer(redis_url: str,
                                                        timers_client: Timers) -> None:
    timers_client.schedule("reminders.sms", [1], in_=3600, id="move")
    got = run_cli("get", "move", "--url", redis_url)
    assert "attempts: 0" in got.stdout, got.stdout
    moved = run_cli("reschedule", "move", "--in", "2d", "--url", redis_url)
    assert moved.returncode == 0, moved.stderr
    pending = timers_client.get("move")
    assert pending is not None
    assert pending.due - redis_now(timers_client.redis) > timedelta(days=1, hours=23)
    missing = run_cli("reschedule", "nope", "--at", "2030-01-01T00:00:00Z", "--url", redis_url)
    assert missing.returncode == 1 and missing.stderr.startswith("error: nope is not pending")


def test_a_negative_delay_is_due_now_and_year_9999_is_refused(
        redis_url: str, timers_client: Timers) -> None:
    now = run_cli("schedule", "reminders.sms", "[1]", "--in", "-5s", "--id", "past",
                  "--url", redis_url)
    assert now.returncode == 0, now.stderr
    pending = timers_client.get("past")
    assert pending is not None and pending.due <= redis_now(timers_client.redis)
    far = run_cli("schedule", "reminders.sms", "--at", "9999-01-01T00:00:00Z",
                  "--url", redis_url)
    assert far.returncode == 1
    assert "hundred years" in far.stderr and len(far.stderr.splitlines()) == 1


def test_failed_output_is_spaced_and_cuts_are_marked(redis_url: str,
                                                     timers_client: Timers) -> None:
    timers_client.schedule("fail.boom", ["x" * 300], in_=0, id="long")
    burst = run_cli("listen", "--burst", "--url", redis_url, "--tasks", TASKS)
    assert burst.returncode == 0, burst.stderr
    listed = run_cli("failed", "--url", redis_url)
    row = listed.stdout.splitlines()[1]
    assert row.endswith("…") and "long" in row, listed.stdout
    shown = run_cli("failed", "show", "long", "--url", redis_url)
    for label in ("id", "task", "kind", "error_type", "message", "attempts",
                  "first_failure", "failed_at", "due"):
        assert re.search(rf"^{label}: +\S", shown.stdout, re.MULTILINE), (label, shown.stdout)
    assert "due_ms" not in shown.stdout and re.search(r"^due: +\d{4}-", shown.stdout, re.M)
