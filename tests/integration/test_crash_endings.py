"""A crash never turns a finished run into a second run (design invariant 8).

``timers listen --processes 2 --max-runs-per-child 150``, a few hundred 20 ms tasks and
three poison tasks that end their listener process with ``os._exit`` while it runs the
others. Endings go to Redis in batches; before the endings journal
(:mod:`timers.listener.endings.journal`) a process that died took the endings of runs that had
finished with it, and those ran again a lease later: completed twice. Now every ending is
on disk as its run ends, and the journal of a dead process is adopted by a live one. Runs
cut short by the crash (started, not ended) do run again: every second start must be one.
The lease is long enough (4 s) that a listener starved of CPU on a loaded machine does not
lose a lease while it lives (a lapse of a live process's lease is no crash, and the run it
was in may then end twice: that is the fence's business, not this test's).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_until
from tests.fault_tasks.mapped_ledger import MAPPED_LEDGER_ENV, read
from tests.integration.helpers import TIMERS_COMMAND, Processes, settled
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

WORK = 600
POISONS = 3


def test_a_crash_reruns_only_the_runs_it_cut(timers_client: Timers, r: redis.Redis,
                                             redis_url: str, processes: Processes,
                                             tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    env = processes.env()
    env[MAPPED_LEDGER_ENV] = str(ledger)
    supervisor = processes.spawn(
        TIMERS_COMMAND, "listen", "--processes", "2", "--lease", "4",
        "--max-runs-per-child", "150", "--url", redis_url, "--tasks", "tests.fault_tasks",
        "--log-level", "info", env=env)
    wait_until(lambda: len(timers_client.listeners()) >= 2 or supervisor.poll() is not None,
               30, message="two listeners")
    # 600 runs over 1 s, the poisons among them
    timers_client.schedule_many(
        TimerSpec("mapped_ledger.work", [f"w{i}"], in_=0.5 + 1.0 * i / WORK, id=f"w{i}")
        for i in range(WORK))
    timers_client.schedule_many(
        TimerSpec("mapped_ledger.die", [f"p{i}"], in_=0.8 + 0.2 * i, id=f"p{i}")
        for i in range(POISONS))

    def over() -> bool:
        if supervisor.poll() is not None:
            return True
        return len(timers_client.failed()) == POISONS and settled(timers_client)

    wait_until(over, 50, interval=0.2, message="the work run and the poisons dead")
    output = processes.output(supervisor)
    assert supervisor.poll() is None, output[-3000:]
    starts, ends, times = read(ledger)
    work = [f"w{i}" for i in range(WORK)]
    assert [tid for tid in work if ends[tid] == 0] == [], "lost"
    twice = {tid: ends[tid] for tid in work if ends[tid] > 1}
    cuts = {tid: starts[tid] - ends[tid] for tid in work if starts[tid] > ends[tid]}
    again = sorted(times[tid][1] - times[tid][0] for tid in work if starts[tid] > 1)
    print(f"\n{sum(starts[t] for t in work)} starts, {len(cuts)} runs cut by a crash, "
          f"{len(twice)} completed twice; poisons started "
          f"{[starts[f'p{i}'] for i in range(POISONS)]}; second starts "
          f"{again[0] if again else 0:.1f}-{again[-1] if again else 0:.1f} s after the first")
    assert twice == {}, f"completed twice: {twice}"
    # every start beyond the first is explained by a cut: a start that did not end
    assert all(starts[tid] - 1 <= cuts.get(tid, 0) for tid in work), (starts, ends)
    assert {f.timer_id for f in timers_client.failed()} == {f"p{i}" for i in range(POISONS)}
    assert timers_client.stats().fired == WORK
    assert "giving up" not in output
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, processes.output(supervisor)[-3000:]
