"""The pieces that run task code: start-up imports, plain-task timeouts, the lease thread,
and naming what blocks the event loop."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from tests.conftest import wait_until
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from timers.exceptions import TaskRefused, TasksUnavailable
from timers.listener.calling.loader import TaskLoader
from timers.listener.calling.runner import Runner
from timers.listener.health.loop_watch import blocker
from timers.listener.leases import HeldRuns, LeaseKeeper
from timers.model.keys import Keyspace

# -- imports ---------------------------------------------------------------------------


RUNNING = Keyspace().running

def test_load_imports_every_module_and_keeps_each_import_error() -> None:
    loader = TaskLoader(SAMPLE_TASKS, search_path=str(ROOT))
    loader.load()
    assert f"{SAMPLE_TASKS}.mod" in sys.modules and f"{SAMPLE_TASKS}.slow" in sys.modules
    assert "RuntimeError: broken on purpose" in loader.failed_modules[f"{SAMPLE_TASKS}.broken"]
    with pytest.raises(TaskRefused, match="failed at start-up: RuntimeError: broken"):
        loader.resolve("broken.fn")


def test_a_module_added_after_load_is_refused_and_not_imported(tmp_path: Path) -> None:
    package = f"late_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    loader = TaskLoader(package, search_path=str(tmp_path))
    loader.load()
    (tmp_path / package / "added.py").write_text("def fn() -> None:\n    pass\n")
    with pytest.raises(TaskRefused, match="imported at start-up only"):
        loader.resolve("added.fn")
    assert f"{package}.added" not in sys.modules


def test_load_raises_when_the_package_cannot_be_imported() -> None:
    with pytest.raises(TasksUnavailable, match="'no_such_pkg_b1' cannot be imported: "
                                               "ModuleNotFoundError"):
        TaskLoader("no_such_pkg_b1").load()


# -- plain-task timeouts ---------------------------------------------------------------


def test_a_job_queued_behind_a_stuck_thread_is_not_timed_until_it_starts() -> None:
    limit = 0.05  # the jobs' timeout, seconds
    release = threading.Event()
    freed: list[int] = []

    def hog() -> None:
        release.wait(10)

    async def main() -> None:
        runner = Runner(1, on_free=lambda: freed.append(runner.stuck))
        first = await runner.call(hog, [], limit=limit)
        assert (first.error_type, runner.stuck) == ("TimeoutError", 1)
        queued = asyncio.create_task(runner.call(lambda: "done", [], limit=limit))
        # a window of several of its timeouts, all spent waiting for the thread: a job timed
        # from its queueing would have timed out in it
        await asyncio.sleep(4 * limit)
        assert not queued.done()
        release.set()
        outcome = await queued
        assert outcome.ok, outcome
        assert runner.stuck == 0 and freed == [0]
        runner.shutdown()

    asyncio.run(main())


# -- the lease thread --------------------------------------------------------------------


def test_the_lease_thread_renews_held_runs_and_reports_a_lost_one_once(
        caplog: pytest.LogCaptureFixture) -> None:
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    client.zadd(RUNNING, {"1": 1})
    held = HeldRuns()
    held.hold("1", "kept")
    held.hold("2", "gone")  # recovered elsewhere: not in the running set any more
    keeper = LeaseKeeper(fakeredis.FakeRedis(server=server), Keyspace(), 30.0, held)
    caplog.set_level(logging.WARNING, logger="timers")
    keeper.renew_once()
    keeper.renew_once()
    assert float(client.zscore(RUNNING, "1") or 0) > 1
    assert held.tokens() == ["1"]
    assert [m for m in caplog.messages if "lapsed" in m] == [
        "lease of run 2 (timer gone) lapsed and the run was recovered elsewhere: this "
        "listener starts nothing it was handed with it"]
    assert held.fresh("1") and not held.fresh("2")  # the fence: only what is still held
    keeper.close()


def test_a_started_lease_keeper_renews_from_its_own_thread_until_closed() -> None:
    """Started, the keeper renews every held run a third of a lease apart on its own,
    while the event loop is busy elsewhere; closed, it stops."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    client.zadd(RUNNING, {"1": 1})
    held = HeldRuns()
    held.hold("1", "kept")
    keeper = LeaseKeeper(fakeredis.FakeRedis(server=server), Keyspace(), 0.3, held).start()
    try:
        wait_until(lambda: float(client.zscore(RUNNING, "1") or 0) > 1, 5, interval=0.02,
                   message="the keeper's thread to renew the held run")
        first = float(client.zscore(RUNNING, "1") or 0)
        wait_until(lambda: float(client.zscore(RUNNING, "1") or 0) > first, 5, interval=0.02,
                   message="the keeper's thread to renew it again")
    finally:
        keeper.close()
    assert not keeper._thread.is_alive()


def test_a_run_whose_ending_is_on_its_way_stays_renewed_and_is_dropped_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """The event loop may block between sending an ending and reading its reply: the
    lease must not lapse meanwhile, and a renewal that crosses the written ending is not
    a lost lease."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    client.zadd(RUNNING, {"1": 1})
    held = HeldRuns()
    held.hold("1", "sent")
    held.hold("2", "written")
    held.ending(["1", "2"])  # "2" already ended in Redis: not in the running set
    keeper = LeaseKeeper(fakeredis.FakeRedis(server=server), Keyspace(), 30.0, held)
    caplog.set_level(logging.WARNING, logger="timers")
    keeper.renew_once()
    assert float(client.zscore(RUNNING, "1") or 0) > 1  # still renewed
    assert held.tokens() == ["1"]
    assert not [m for m in caplog.messages if "lapsed" in m]
    held.ending(["1"], sent=False)  # the write failed: held as before
    client.zrem(RUNNING, "1")
    keeper.renew_once()
    assert [m for m in caplog.messages if "lapsed" in m] == [
        "lease of run 1 (timer sent) lapsed and the run was recovered elsewhere: this "
        "listener starts nothing it was handed with it"]
    keeper.close()


def test_an_idle_lease_thread_sends_nothing() -> None:
    """With no run held, a renewal sends no call: an idle listener's lease thread costs
    Redis nothing (the idle bench's 4 commands in 30 s are its heartbeats and a ping)."""
    server = fakeredis.FakeServer()
    held = HeldRuns()
    keeper = LeaseKeeper(fakeredis.FakeRedis(server=server), Keyspace(), 30.0, held)
    sent: list[list[str]] = []
    renew = keeper._scripts.renew

    def counted(lease_ms: int, tokens: Iterable[str]) -> Any:
        sent.append(list(tokens))
        return renew(lease_ms, sent[-1])

    keeper._scripts.renew = counted  # type: ignore[method-assign]
    keeper.renew_once()
    assert sent == []
    held.hold("1", "t")
    keeper.renew_once()
    assert sent == [["1"]]
    keeper.close()


def test_the_lease_thread_logs_failures_once_per_change(
        caplog: pytest.LogCaptureFixture) -> None:
    server = fakeredis.FakeServer()
    fakeredis.FakeRedis(server=server).zadd(RUNNING, {"1": 1})
    held = HeldRuns()
    held.hold("1", "t")
    keeper = LeaseKeeper(fakeredis.FakeRedis(server=server), Keyspace(), 30.0, held)
    caplog.set_level(logging.WARNING, logger="timers")
    server.connected = False
    keeper.renew_once()
    keeper.renew_once()
    server.connected = True
    keeper.renew_once()
    assert [m.split(":")[0] for m in caplog.messages] == [
        "lease renewal failed", "lease renewal works again"]
    keeper.close()


# -- what blocks the loop ------------------------------------------------------------------


def test_blocker_names_the_task_whose_code_is_on_the_stack() -> None:
    def task_body() -> str:
        def helper() -> str:
            frame = sys._getframe()
            return blocker(frame, [(task_body.__code__, "pkg.mod.task_body")])
        return helper()

    named = task_body()
    assert named.startswith("task pkg.mod.task_body (in helper at ")
    assert blocker(sys._getframe(), []).startswith("code that is not a task")
