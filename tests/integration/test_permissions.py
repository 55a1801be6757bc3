"""Redis 7 ACL users that lack what timers needs.

Before: a user without channel access (7.0's default for new users) made the listener log
"lost"/"back" ~18 lines a second; a user without EVALSHA left it running forever, firing
nothing after one misleading "connection lost" line; ``check`` exited 0 in both. Now the
listener works sweeper-only with one warning per missing rule, or exits 1 naming the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes, run_cli
from tests.retry_tasks import done
from timers import Timers, TimerSpec

pytestmark = pytest.mark.integration

TASKS = "tests.retry_tasks"


@pytest.fixture
def acl_user(r: redis.Redis, redis_url: str) -> Iterator[Callable[..., str]]:
    """``acl_user(name, *rules)``: a user with those rules; returns its URL."""
    made: list[str] = []

    def make(name: str, *rules: str) -> str:
        r.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", *rules)
        made.append(name)
        where = urlsplit(redis_url)
        return f"redis://{name}:pw@{where.hostname}:{where.port}/0"

    yield make
    for name in made:
        r.execute_command("ACL", "DELUSER", name)


def test_a_user_without_channels_fires_timers_sweeper_only(
        acl_user: Callable[..., str], r: redis.Redis, timers_client: Timers,
        processes: Processes) -> None:
    url = acl_user("nochannels", "~*", "+@all")  # reset: no channel at all
    timers_client.schedule_many(TimerSpec("ok.hit", [f"now-{i}"], in_=0) for i in range(5))
    listener = processes.timers("listen", "--url", url, "--tasks", TASKS)
    wait_until(lambda: len(done(r)) == 5 or listener.poll() is not None, 15,
               message="the due timers to fire")
    # a timer scheduled earlier than anything pending cannot wake this listener: the
    # sweeper finds it all the same
    timers_client.schedule_many(TimerSpec("ok.hit", [f"later-{i}"], in_=0.3) for i in range(5))
    wait_until(lambda: len(done(r)) == 10 or listener.poll() is not None, 15,
               message="the later timers to fire")
    assert listener.poll() is None, processes.output(listener)
    assert sorted(tag for tag, _ in done(r)) == sorted(
        [f"now-{i}" for i in range(5)] + [f"later-{i}" for i in range(5)])

    output = processes.output(listener)
    lines = output.splitlines()
    expired = "may not SUBSCRIBE to '__keyevent@0__:expired': add the ACL rule " \
              "&__keyevent@0__:expired"
    assert sum(expired in line for line in lines) == 1, output
    assert sum("sweeper alone" in line for line in lines) == 2, output  # expired, wake
    assert not [ln for ln in lines if " lost" in ln or ln.endswith(" back")], output


def test_a_user_without_scripts_stops_the_listener_and_fails_check(
        acl_user: Callable[..., str], timers_client: Timers, processes: Processes) -> None:
    url = acl_user("noscripts", "~*", "&*", "+@all", "-eval", "-evalsha")
    timers_client.schedule("ok.hit", ["never"], in_=0)
    listener = processes.timers("listen", "--url", url, "--tasks", TASKS)
    assert listener.wait(20) == 1
    output = processes.output(listener)
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert errors == ["error: the Redis user may not run EVAL or EVALSHA: add the ACL rule "
                      "+eval +evalsha"], output
    assert "Traceback" not in output and "connection" not in output.lower()

    check = run_cli("check", "--url", url)
    assert check.returncode == 1
    assert "FAIL permissions: the Redis user may not run EVAL or EVALSHA: add the ACL rule " \
           "+eval +evalsha" in check.stdout


def test_permissions_revoked_under_a_running_listener_stop_it(
        acl_user: Callable[..., str], r: redis.Redis, timers_client: Timers,
        processes: Processes) -> None:
    url = acl_user("revoked", "~*", "&*", "+@all")
    listener = processes.timers("listen", "--url", url, "--tasks", TASKS)
    timers_client.schedule("ok.hit", ["before"], in_=0)
    wait_until(lambda: len(done(r)) == 1 or listener.poll() is not None, 15,
               message="the listener to fire a timer")
    r.execute_command("ACL", "SETUSER", "revoked", "-@scripting")  # EVAL*, FCALL, FUNCTION
    timers_client.schedule("ok.hit", ["after"], in_=0)
    assert listener.wait(20) == 1
    output = processes.output(listener)
    (line,) = [ln for ln in output.splitlines() if "cannot claim timers" in ln]
    assert "may not run EVALSHA: add the ACL rule +evalsha" in line, output
    assert timers_client.stats().pending == 1, "not claimed: nothing lost"
