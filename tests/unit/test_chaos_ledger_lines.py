"""What the chaos tasks add to the ledger besides runs. The fence probe
(``bench/fault_tasks/fence_probe.py``): a task's first line learns when its run's fence let
it start, in a thread and on the event loop, and that no fence was asked when none was (it
wraps a name of the listener's: renamed, this fails). The stall watch
(``bench/fault_tasks/stall_watch.py``): a gap between its ticks is a ``G`` line."""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
from pathlib import Path

import pytest

from bench.chaos.history import read_ledger, read_stalls
from bench.chaos.nemesis import stall_cuts
from bench.fault_tasks import fence_probe, stall_watch
from bench.fault_tasks import ledger as ledger_module
from bench.fault_tasks.ledger import LEDGER_ENV
from timers.listener.calling import runner as runner_module
from timers.listener.calling.runner import Runner


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module.Runner, "call", runner_module.Runner.call)
    fence_probe.install()
    fence_probe.passed()  # nothing left over from another test on this thread


def test_a_coroutine_reads_when_its_fence_passed(probed: None) -> None:
    seen: list[float | None] = []

    async def task() -> None:
        seen.append(fence_probe.passed())

    async def main() -> None:
        runner = Runner(1)
        try:
            before = time.monotonic()
            assert (await runner.call(task, [], fence=lambda: True)).ok
            assert seen[0] is not None and before <= seen[0] <= time.monotonic()
            assert (await runner.call(task, [])).ok  # no fence: none noted
            assert seen[1] is None
            assert (await runner.call(task, [], fence=lambda: False)).kind == "stale"
            assert len(seen) == 2
        finally:
            runner.shutdown()

    asyncio.run(main())


def test_a_thread_reads_when_its_fence_passed(probed: None) -> None:
    seen: list[float | None] = []

    def task() -> None:
        seen.append(fence_probe.passed())

    async def main() -> None:
        runner = Runner(1)
        try:
            assert (await runner.call(task, [], fence=lambda: True)).ok
            assert (await runner.call(task, [])).ok
        finally:
            runner.shutdown()

    asyncio.run(main())
    assert seen[0] is not None and seen[1] is None


def test_install_wraps_once(probed: None) -> None:
    wrapped = runner_module.Runner.call
    fence_probe.install()
    assert runner_module.Runner.call is wrapped


def test_the_stall_watch_writes_each_gap_between_its_ticks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that went without running past GAP leaves a ``G`` line; the harness reads
    it back, and makes a cut of it only when it may have let a lease lapse."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    monkeypatch.setattr(ledger_module, "_fd", None)
    now = time.monotonic()
    assert stall_watch.tick("L0", now - 0.01) >= now  # a tick on time: nothing
    stall_watch.tick("L0", now - 0.3)
    stall_watch.tick("L0", now - 1.5)
    stalls = read_stalls(ledger)
    assert [(pid, round(end - start, 1)) for pid, start, end in stalls] == [
        (os.getpid(), 0.3), (os.getpid(), 1.5)]
    assert read_ledger(ledger) == []  # not runs
    cuts = stall_cuts(stalls, lease=2.0)
    assert [(c.kind, c.pids, c.fresh_for) for c in cuts] == [
        ("stall", frozenset({os.getpid()}), 2.25)]


def test_importing_the_chaos_tasks_outside_a_chaos_listener_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A test imports names from the chaos tasks (``bench.chaos.world`` does): no probe
    wraps the runner and no watch thread starts in that process (one did, in CI: its first
    gap found no ledger to write to)."""
    monkeypatch.delenv("TIMERS_CHAOS_LISTENER", raising=False)
    monkeypatch.setattr(runner_module.Runner, "call", runner_module.Runner.call)
    unprobed = runner_module.Runner.call
    import bench.fault_tasks.chaos as chaos

    importlib.reload(chaos)
    assert runner_module.Runner.call is unprobed
    assert "chaos-stall-watch" not in {t.name for t in threading.enumerate()}
