"""``timers.testing``: an app's tests point the defaults at an in-memory server, run what is
due through the real listener, let time pass, and read what ran, what waits, what failed."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import fakeredis
import pytest

import timers
import timers.aio
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.fresh_imports import fresh_modules
from tests.unit.sample_tasks import mod
from timers.model.keys import Keyspace
from timers.testing import TimersTest, timer_context


@pytest.fixture
def t() -> Iterator[TimersTest]:
    mod.CALLS.clear()
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as helper:
        yield helper
    mod.CALLS.clear()


def test_the_defaults_point_at_the_helper_and_come_back_after() -> None:
    before = timers.configure("redis://localhost:1/0")  # never connected: nothing is sent
    before_aio = timers.aio._default
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as t:
        tid = timers.schedule("mod.add", [1, 2], in_=60)
        assert [(p.id, p.task, p.args) for p in t.pending()] == [(tid, "mod.add", [1, 2])]
    assert timers._instance() is before, "the previous default is back, not replaced"
    assert timers.aio._default is before_aio


def test_run_due_runs_only_what_is_due_until_time_is_advanced(t: TimersTest) -> None:
    timers.schedule("mod.add", [1, 2], in_=timedelta(hours=24), id="reminder")
    assert t.run_due() == []
    t.advance(hours=23)
    assert t.run_due() == [] and mod.CALLS == []
    (pending,) = t.pending()
    assert abs((pending.due - t.now()).total_seconds() - 3600) < 5, "1 h left on the test clock"
    t.advance(minutes=60)
    (run,) = t.run_due()
    assert (run.timer_id, run.task, run.attempt, run.outcome.ok) == ("reminder", "mod.add", 1,
                                                                      True)
    assert mod.CALLS == [("add", (1, 2))]
    assert t.pending() == [] and t.run_due() == [] and len(mod.CALLS) == 1


def test_a_retry_without_backoff_runs_in_the_same_call(t: TimersTest, tmp_path: Path) -> None:
    out = tmp_path / "ctx.jsonl"
    timers.schedule("ctx.fails_once", [str(out)], in_=0, id="pay")
    ran = t.run_due()
    assert [(f.attempt, f.outcome.kind) for f in ran] == [(1, "error"), (2, "ok")]
    assert [json.loads(line)["attempt"] for line in out.read_text().splitlines()] == [1, 2]
    assert t.failed() == []


def test_a_task_that_fails_for_good_is_listed_as_failed(t: TimersTest) -> None:
    timers.schedule("mod.boom", ["no card on file"], in_=0, id="charge-9")
    (run,) = t.run_due()
    assert (run.outcome.kind, run.outcome.message) == ("error", "no card on file")
    (failure,) = t.failed()
    assert (failure.timer_id, failure.data["error_type"]) == ("charge-9", "ValueError")
    assert t.ran("mod.boom") == [run]


def test_run_all_advances_through_everything_pending_but_recurrences(t: TimersTest) -> None:
    timers.schedule("mod.add", [1], in_=timedelta(days=2))
    timers.schedule("mod.add", [2], in_=timedelta(hours=1))
    timers.every("hourly", "mod.greet", ["ops"], interval=timedelta(hours=1))
    ran = t.run_all()
    assert [f.task for f in ran if f.task == "mod.add"] == ["mod.add", "mod.add"]
    assert [c for c in mod.CALLS if c[0] == "add"] == [("add", (2, 0)), ("add", (1, 0))]
    assert mod.CALLS.count(("greet", "hello ops")) >= 2, "the hourly ran as time passed"
    (left,) = t.pending()
    assert left.task == "mod.greet", "a recurrence's next occurrence stays pending"
    assert timedelta(days=1, hours=23) < t.offset <= timedelta(days=2)


def test_run_all_advances_through_a_rate_limits_waits_and_finishes(t: TimersTest) -> None:
    """A rate-limited task's timers wait for their slots on the server's clock: run_all
    moves the test's time to each slot, as it does to each due time."""
    for n in range(4):
        timers.schedule("limited.rated", [n], in_=0)
    timers.every("hourly", "mod.greet", ["ops"], interval=timedelta(hours=1))
    ran = t.run_all()
    assert [c for c in mod.CALLS if c[0] == "rated"] == [("rated", n) for n in range(4)]
    assert [f.outcome.kind for f in ran if f.task == "limited.rated"] == ["ok"] * 4
    (left,) = t.pending()
    assert left.task == "mod.greet", "only the recurrence's next occurrence is left"
    assert timedelta(seconds=89) < t.offset < timedelta(minutes=5), "3 waits of 30 s"


def test_time_advanced_frees_a_rate_limits_next_slot(t: TimersTest) -> None:
    timers.schedule("limited.rated", [1], in_=0)
    timers.schedule("limited.rated", [2], in_=0)
    assert [f.outcome.kind for f in t.run_due()] == ["ok"]
    (waiting,) = t.pending()
    assert waiting.wait is not None and waiting.wait.kind == "rate"
    t.advance(seconds=20)
    assert t.run_due() == [], "the next slot is 30 s after the first start"
    t.advance(seconds=10)
    assert [c for c in mod.CALLS if c[0] == "rated"] == [("rated", 1)]
    assert [f.outcome.kind for f in t.run_due()] == ["ok"]
    assert [c for c in mod.CALLS if c[0] == "rated"] == [("rated", 1), ("rated", 2)]


def test_async_code_uses_the_async_default_and_awaits_the_runs(t: TimersTest) -> None:
    async def scenario() -> None:
        await timers.aio.schedule("mod.async_add", [3, 4], in_=0)
        with pytest.raises(RuntimeError, match=r"await arun_due\(\)"):
            t.run_due()
        (run,) = await t.arun_due()
        assert run.outcome.ok

    asyncio.run(scenario())
    assert mod.CALLS == [("async_add", (3, 4))]


def test_time_only_moves_forward(t: TimersTest) -> None:
    with pytest.raises(ValueError, match="time only moves forward"):
        t.advance(-1)


def test_a_task_called_directly_can_be_given_its_context() -> None:
    with timer_context("order-1", "orders.expire", attempt=2) as given:
        assert timers.current() is given
        assert (timers.current().id, timers.current().attempt) == ("order-1", 2)
    with pytest.raises(timers.NotInTimer):
        timers.current()


def test_the_pytest_fixture_points_the_defaults_at_memory(timers_test: TimersTest) -> None:
    assert timers._instance() is timers_test.timers
    timers.schedule("reminders.sms", [42], in_=60)
    assert [p.task for p in timers_test.pending()] == ["reminders.sms"]


def test_without_fakeredis_lua_the_import_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lupa", None)  # as if not installed
    with fresh_modules("timers.testing"), pytest.raises(ImportError) as raised:
        importlib.import_module("timers.testing")
    assert str(raised.value) == (
        "timers.testing needs fakeredis with Lua support: "
        "pip install 'redis-timers[testing]' (or fakeredis[lua])")
    assert raised.value.__cause__ is None and raised.value.__context__ is None


def test_the_in_memory_listener_logs_no_warning_about_server_settings(
        t: TimersTest, caplog: pytest.LogCaptureFixture) -> None:
    timers.schedule("mod.add", [1], in_=0)
    t.run_due()
    assert not [r for r in caplog.records if "notify-keyspace-events" in r.getMessage()]
    assert mod.CALLS == [("add", (1, 0))]


def test_after_a_run_the_listeners_warnings_about_server_settings_are_heard_again(
        t: TimersTest, caplog: pytest.LogCaptureFixture) -> None:
    """The in-memory listener's quiet is its own: a real listener in the same process (an
    app's integration test after its unit tests) still warns about its server."""
    timers.schedule("mod.add", [1], in_=0)
    t.run_due()
    warning = logging.getLogger("timers.listener").makeRecord(
        "timers.listener", logging.WARNING, "timers/listener/health/preflight.py", 1,
        "notify-keyspace-events lacks Ex", (), None)
    assert logging.getLogger("timers.listener").filter(warning)


def test_configure_takes_a_client_the_app_manages() -> None:
    """No more resetting ``timers._default`` by hand: a test or an app hands its client."""
    saved = timers._default
    client = fakeredis.FakeRedis()
    try:
        configured = timers.configure(client, prefix="shop")
        tid = timers.schedule("reminders.sms", [1], in_=60)
        assert configured.redis is client and timers.get(tid) is not None
        timers.configure(fakeredis.FakeRedis())  # replacing it leaves the app's client open
        assert client.zcard(Keyspace("shop").due) == 1
    finally:
        timers._default = saved


def test_an_app_that_configures_timers_inside_a_test_stays_in_memory() -> None:
    """An app factory (``create_app()`` in each test, a Django ``ready()``) that calls
    ``timers.configure(url)`` must not send a test's timers to a real server."""
    before = timers.configure("redis://localhost:1/0")
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as t:
        timers.configure("redis://localhost:1/0", prefix="other")  # what create_app() does
        timers.aio.configure("redis://localhost:1/0", prefix="other")
        sync_id = timers.schedule("mod.add", [1, 2], in_=0)

        async def schedule() -> str:
            return await timers.aio.schedule("mod.add", [3, 4], in_=0)

        async_id = asyncio.run(schedule())
        assert [r.timer_id for r in t.run_due()] == [sync_id, async_id]
    assert timers._instance() is before


def test_the_module_level_every_passes_group_key_and_priority_on(t: TimersTest) -> None:
    timers.every("encode", "mod.greet", ["gpu"], interval=timedelta(hours=1), group="video",
                 key="gpu:0", priority=4)
    (first,) = t.pending()
    assert (first.group, first.key, first.priority) == ("video", "gpu:0", 4)

    async def scenario() -> None:
        await timers.aio.every("encode-aio", "mod.greet", ["gpu"], interval=60, group="video",
                               priority=-2)

    asyncio.run(scenario())
    assert {(p.id.partition("@")[0], p.priority) for p in t.pending()} == {
        ("encode", 4), ("encode-aio", -2)}
