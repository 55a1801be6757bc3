"""What the command line says about groups, priorities and timers held back by a
concurrency key or a rate limit (a real server; the held-back state made by the scripts
as a listener would)."""

from __future__ import annotations

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TASKS, run_cli
from timers import Timers
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.store.script_rows import GateRun, NewTimer
from timers.store.scripts import Scripts

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def hold_back(r: redis.Redis) -> None:
    """c0 runs with device:7's only slot, c1 and c2 wait for it; r0 starts, r1 holds the
    next slot of a 1/s rate limit, r2 waits behind it. A rate's first slot comes an
    interval after the server's start (state machine T21): the server must be up longer
    than that, whichever test ran first."""
    wait_until(lambda: int(r.info("server")["uptime_in_seconds"]) >= 3, 10, 0.1)
    scripts = Scripts(r, Keyspace())
    for i in range(3):
        scripts.schedule([NewTimer(f"c{i}", "iot.send;k=device%3A7:[7]", "in", -30 + i, "r")])
        scripts.schedule([NewTimer(f"r{i}", "mail.send:[1]", "in", -20 + i, "r")])
    reply = scripts.claim(limit=10, lease_ms=60_000, horizon_ms=0, listener_id="me")
    items = reply[3:]
    runs = [Run.parse(*items[i:i + 3]) for i in range(0, len(items), 3)]
    scripts.gate(60_000, [GateRun(run.token, "device:7", 1) if run.timer_id[0] == "c"
                          else GateRun(run.token, "", 1, "mail", 1_000, 1) for run in runs])


def test_get_list_and_stats_say_what_holds_a_timer_back(r: redis.Redis, redis_url: str) -> None:
    hold_back(r)
    waiting = run_cli("get", "c2", "--url", redis_url)
    assert waiting.returncode == 0, waiting.stderr
    assert "state:    waiting for key device:7 (1/1 running), 1 ahead" in waiting.stdout
    assert "key:      device:7" in waiting.stdout and "held back" in waiting.stdout
    paced = run_cli("get", "r1", "--url", redis_url).stdout
    assert "state:    rate-limited until 20" in paced
    listed = run_cli("list", "--key", "device:7", "--url", redis_url).stdout.splitlines()
    assert [line.split()[3] for line in listed[1:]] == ["c1", "c2"]
    stats = run_cli("stats", "--url", redis_url).stdout
    assert "waited:   2" in stats and "rate_limited: 2" in stats
    assert any(line.split() == ["device:7", "2"] for line in stats.splitlines())
    assert any(line.split() == ["mail", "1"] for line in stats.splitlines())


def test_list_and_stats_by_group_and_listeners_say_their_groups(
        redis_url: str, start_listener) -> None:
    with Timers(redis_url) as t:
        t.schedule("record.hit", ["v"], in_=3600, id="v1", group="video", priority=5)
        t.schedule("record.hit", ["w"], in_=3600, id="w1")
    only_video = run_cli("list", "--group", "video", "--url", redis_url).stdout.splitlines()
    assert len(only_video) == 2 and " v1 " in only_video[1]
    assert "video" in only_video[1]
    details = run_cli("get", "v1", "--url", redis_url).stdout
    assert "group:    video" in details and "priority: 5" in details
    stats = run_cli("stats", "--url", redis_url).stdout.splitlines()
    assert ["video", "1", "0", "0"] in [line.split() for line in stats]
    start_listener(tasks=TASKS, groups=["video", "default"])
    wait_until(lambda: "video,default" in run_cli("listeners", "--url", redis_url).stdout, 15,
               message="the listener's heartbeat to name its groups")


def test_a_bad_group_is_one_line(redis_url: str) -> None:
    done = run_cli("listen", "--group", "two words", "--url", redis_url)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: group 'two words' must be 1 to 64 letters, digits, '_', '.' or '-'"]
