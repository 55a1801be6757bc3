"""``timers cron add | list | pause | resume | remove`` end to end (the installed command)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.integration.helpers import run_cli
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

LOCAL_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def cron(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    """``timers cron ARGS --url URL``"""
    return run_cli("cron", *args, "--url", url)


def test_cron_commands_end_to_end(redis_url: str, timers_client: Timers) -> None:
    added = cron("add", "daily-report", "reports.daily", '{"team": "a"}',
                    "--cron", "0 9 * * mon-fri", "--tz", "Europe/Berlin", url=redis_url)
    assert added.returncode == 0, added.stderr
    assert re.fullmatch(rf"daily-report \(version 1\): cron 0 9 \* \* mon-fri Europe/Berlin; "
                        rf"next {LOCAL_TIME} CES?T\n", added.stdout)
    again = cron("add", "daily-report", "reports.daily", '{"team": "a"}',
                    "--cron", "0 9 * * mon-fri", "--tz", "Europe/Berlin", url=redis_url)
    assert "(version 1)" in again.stdout  # the same declaration changes nothing
    tick = cron("add", "tick", "jobs.hit", '["x"]', "--every", "5m", "--no-overlap",
                   "--catch-up", "all", "--max-lateness", "30s", url=redis_url)
    assert tick.returncode == 0, tick.stderr

    listed = cron("list", url=redis_url)
    assert listed.returncode == 0, listed.stderr
    header, daily, tick_line = listed.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "SCHEDULE", "TZ", "TASK"]
    assert daily.startswith("daily-report") and "Europe/Berlin" in daily
    runs = re.findall(rf"({LOCAL_TIME}) (CES?T)", daily)
    assert len(runs) == 3 and all(time.endswith("09:00:00") for time, _ in runs)
    assert "every 5m catch-up=all max-lateness=30.0s no-overlap" in tick_line
    assert "UTC" in tick_line
    assert len(re.findall(LOCAL_TIME, tick_line)) == 3

    assert cron("pause", "tick", url=redis_url).stdout == "paused tick\n"
    assert cron("list", url=redis_url).stdout.splitlines()[2].endswith("paused")
    assert [t.id.split("@")[0] for t in timers_client.list()] == ["daily-report"]
    resumed = cron("resume", "tick", url=redis_url)
    assert resumed.returncode == 0 and resumed.stdout.startswith("resumed tick; next ")
    assert cron("remove", "tick", url=redis_url).stdout == "removed tick\n"
    assert [r.name for r in timers_client.recurrences()] == ["daily-report"]


@pytest.mark.parametrize(("args", "message"), [
    (["add", "x", "mod.f", "--cron", "0 25 * * *"], "not a valid expression"),
    (["add", "x", "mod.f", "--cron", "0 9 * * *", "--tz", "Berlin/Mitte"], "unknown time zone"),
    (["add", "x", "mod.f"], "exactly one of --cron or --every"),
    (["add", "x", "mod.f", "--every", "soon"], "cannot read duration"),
    (["add", "x", "mod.f", "--every", "5m", "--catch-up", "some"], "--catch-up must be"),
    (["remove", "nope"], "no recurrence named 'nope'"),
    (["pause", "nope"], "no recurrence named 'nope'"),
    (["resume", "nope"], "no recurrence named 'nope'"),
])
def test_user_errors_print_one_line_and_exit_1(
    redis_url: str, args: list[str], message: str
) -> None:
    result = cron(*args, url=redis_url)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_list_with_nothing_declared(redis_url: str) -> None:
    result = cron("list", url=redis_url)
    assert (result.returncode, result.stdout) == (0, "no recurrences\n")


def test_an_unreachable_server_is_one_line() -> None:
    result = cron("list", url="redis://127.0.0.1:1/0")
    assert result.returncode == 1
    assert "cannot connect to Redis" in result.stderr and "Traceback" not in result.stderr
