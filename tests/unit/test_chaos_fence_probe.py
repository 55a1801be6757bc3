"""The chaos ledger's fence probe (``bench/fault_tasks/fence_probe.py``): a task's first line
learns when its run's fence let it start, in a thread and on the event loop, and that no
fence was asked when none was. It wraps a name of the listener's: renamed, this fails."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.fault_tasks import fence_probe
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
