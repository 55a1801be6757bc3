"""``$TIMERS_PREFIX`` as the default prefix of the command line, the listener and the
library, so one variable moves an app's timers to its own prefix."""

from __future__ import annotations

import subprocess

import pytest
import redis

from tests.conftest import ROOT
from tests.integration.helpers import TIMERS_COMMAND, subprocess_env
from tests.task_pkg import URL_ENV
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def timers_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env()
    env.update({URL_ENV: redis_url, "TIMERS_PREFIX": "shop"})
    return subprocess.run([TIMERS_COMMAND, *args, "--url", redis_url], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_prefix_comes_from_the_environment(redis_url: str, r: redis.Redis,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    scheduled = timers_cli(redis_url, "schedule", "record.hit", '["cli"]', "--in", "0")
    assert scheduled.returncode == 0, scheduled.stderr
    monkeypatch.setenv("TIMERS_PREFIX", "shop")
    with Timers(redis_url) as t:
        t.schedule("record.hit", ["library"], in_=0)
    assert r.zcard("shop|due") == 2 and r.zcard("timers|due") == 0

    listed = timers_cli(redis_url, "list")
    assert listed.returncode == 0 and listed.stdout.count("record.hit") == 2, listed.stdout
    ran = timers_cli(redis_url, "listen", "--tasks", "tests.task_pkg", "--burst")
    assert ran.returncode == 0, ran.stderr
    assert "prefix 'shop'" in ran.stderr
    assert sorted(r.lrange("test:runs", 0, -1)) == ['["cli"]', '["library"]']
    assert r.zcard("shop|due") == 0
