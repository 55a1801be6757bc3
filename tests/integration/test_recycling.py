"""Recycling listeners for tasks that leak: ``timers listen --processes 2`` with
``--max-runs-per-child`` or ``--max-memory-per-child``, the real command against the real
server. Every timer runs once, children are replaced as they reach their limit, the
heartbeats never show fewer than 2 claiming children, and no replacement is a restart.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes, run_counts, runs, settled
from tests.processes import children_of
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


class ClaimingSampler:
    """Counts the claiming listeners in the heartbeats every 100 ms, in a thread."""

    def __init__(self, url: str) -> None:
        self.client = Timers(url)
        self.counts: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            live = self.client.listeners()
            self.counts.append(sum(1 for info in live if info.get("state") == "claiming"))

    def __enter__(self) -> ClaimingSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def claiming(t: Timers, supervisor: subprocess.Popen[bytes]) -> int:
    kids = children_of(supervisor.pid)
    return sum(1 for info in t.listeners()
               if info.get("state") == "claiming" and int(info["pid"]) in kids)


def run_fleet(timers_client: Timers, r: redis.Redis, processes: Processes, redis_url: str,
              task: str,
              count: int, spread: float, *limits: str) -> tuple[list[int], str]:
    """Start ``--processes 2`` with ``limits``, schedule ``count`` timers over ``spread``
    seconds, wait until each ran; the claiming counts sampled and the supervisor's log."""
    supervisor = processes.timers("listen", "--processes", "2", "--url", redis_url,
                                  "--tasks", "tests.task_pkg", "--shutdown-timeout", "5",
                                  *limits)
    wait_until(lambda: claiming(timers_client, supervisor) == 2 or supervisor.poll() is not None,
               20, message="2 claiming listeners")
    assert supervisor.poll() is None, processes.output(supervisor)
    with ClaimingSampler(redis_url) as sampler:
        timers_client.schedule_many(TimerSpec(task, [f"t{i}"], in_=1 + spread * i / count)
                                    for i in range(count))

        def all_ran() -> bool:
            return sum(run_counts(r).values()) >= count and settled(timers_client)

        wait_until(lambda: all_ran() or supervisor.poll() is not None, spread + 40,
                   interval=0.2, message=f"{count} timers to run")
    output = processes.output(supervisor)
    assert supervisor.poll() is None, output
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, processes.output(supervisor)
    return sampler.counts, processes.output(supervisor)


def check_recycled(t: Timers, r: redis.Redis, count: int, counts: list[int],
                   output: str) -> list[str]:
    """Every timer once, none cut short, never fewer than 2 claiming, no restart; the
    recycle lines."""
    ran = run_counts(r)
    assert len(ran) == count and set(ran.values()) == {1}, \
        f"{len(ran)} of {count} timers ran; ran twice: {[t for t, n in ran.items() if n > 1][:5]}"
    counters = t.stats().counters
    assert counters.get("fired") == count, counters
    # a recycled child finishes what it started (nothing cut: no reruns); a run it had
    # claimed but not started when it began to drain goes back unstarted, to run once
    # elsewhere (every timer ran once, above)
    assert counters.get("reruns", 0) == 0, f"a recycled child finishes its runs: {counters}"
    assert len(counts) > 50, f"only {len(counts)} heartbeat samples"
    assert min(counts) >= 2, f"claiming children per 100 ms sample: {counts}"
    lines = output.splitlines()
    crashes = [line for line in lines if "restarting" in line or "giving up" in line
               or "(recycling) pid" in line]
    assert crashes == [], "\n".join(crashes)
    recycles = [line for line in lines if "recycling after" in line and "replacement pid" in line]
    print(f"\n{count} timers: {len(recycles)} recycles; claiming children per sample: "
          f"min {min(counts)}, max {max(counts)}, {len(counts)} samples")
    return recycles


def test_children_are_recycled_after_500_runs(timers_client: Timers, r: redis.Redis,
                                              redis_url: str, processes: Processes) -> None:
    """Every child that reached 500 runs was replaced, and none was replaced sooner. How
    far past 500 a child runs while its replacement starts depends on the machine's load,
    so the count of recycles is only bounded from below by what 5,000 runs must cause."""
    counts, output = run_fleet(timers_client, r, processes, redis_url, "record.hit_pid", 5000,
                               20.0, "--max-runs-per-child", "500")
    recycles = check_recycled(timers_client, r, 5000, counts, output)
    per_child = Counter(item[1] for item in runs(r))
    recycled = {int(m) for m in re.findall(r"\(pid (\d+)\) recycling after 500 runs", output)}
    assert recycled == {pid for pid, n in per_child.items() if n >= 500}, \
        f"runs per child {dict(per_child)}; recycled {sorted(recycled)}"
    # a replacement was itself replaced: with 2 claiming, 5,000 runs reach 500 at least 3 times
    assert len(recycles) >= 3, "\n".join(recycles)
    assert all(" runs; replacement pid " in line for line in recycles), recycles
    assert any(line.endswith("(the standby) takes over") for line in recycles), recycles
    assert output.count("recycled: its runs finished") >= len(recycles) - 2, output[-3000:]


def resident_mb(pid: int) -> float:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def test_children_that_leak_are_recycled_at_their_memory_limit(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """The limit is 40 MB above what a fresh listener of these tasks holds; the task keeps
    1 MB per run."""
    probe = processes.timers("listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    wait_until(lambda: claiming_pid(timers_client, probe.pid) or probe.poll() is not None, 20,
               message="a listener to measure")
    base = resident_mb(probe.pid)
    probe.send_signal(signal.SIGTERM)
    assert probe.wait(20) == 0, processes.output(probe)
    limit = f"{base + 40:.0f}"
    counts, output = run_fleet(timers_client, r, processes, redis_url, "leak.hit", 500, 15.0,
                               "--max-memory-per-child", limit)
    recycles = check_recycled(timers_client, r, 500, counts, output)
    assert len(recycles) >= 3, f"base {base:.0f} MB, limit {limit} MB:\n{output[-3000:]}"
    assert all(f"MB of memory (limit {limit} MB); replacement pid" in line
               for line in recycles), recycles


def claiming_pid(t: Timers, pid: int) -> bool:
    return any(int(info["pid"]) == pid and info.get("state") == "claiming"
               for info in t.listeners())
