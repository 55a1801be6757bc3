"""Flow control on a real server with real listener processes: groups keep two apps apart,
a concurrency key runs one command per device at a time (also through a ``kill -9``), a
rate limit spaces starts fleet-wide, and priority decides who takes a freed slot.

The limits are checked with what the tasks themselves saw (tests/task_pkg/flow.py), not
with timers' own bookkeeping. Times are printed, never asserted: bench/flow.py measures them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import (
    KEYS,
    TASKS,
    TIMERS_COMMAND,
    Processes,
    redis_now_ms,
    runs,
    settled,
)
from tests.task_pkg import STARTED
from tests.task_pkg.flow import SPANS_ENV
from tests.task_pkg.slow import RELEASE
from timers import PendingTimer, Timers, TimerSpec
from timers.model.encoding import Record
from timers.model.wire import Option

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def listeners(processes: Processes, url: str, n: int, *extra: str,
              env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
    """``n`` listener processes (``timers listen --url URL EXTRA``)."""
    return [processes.spawn(TIMERS_COMMAND, "listen", "--url", url, *extra, env=env)
            for _ in range(n)]


def wait_listening(r: redis.Redis, n: int, procs: list[subprocess.Popen[bytes]],
                   processes: Processes) -> None:
    wait_until(lambda: r.zcard(KEYS.listeners) >= n or any(p.poll() is not None for p in procs),
               20, message=f"{n} listeners to start")
    for p in procs:
        assert p.poll() is None, processes.output(p)


def overlaps(done: list[list[Any]]) -> int:
    """The most runs of one key that overlapped in time, by the tasks' own start/end."""
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, key, _, start, end, _ in done:
        by_key[key].append((start, end))
    worst = 0
    for spans in by_key.values():
        points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        level = 0
        for _, step in points:
            level += step
            worst = max(worst, level)
    return worst


# -- groups ---------------------------------------------------------------------------


def test_two_apps_with_their_own_groups_share_a_redis_and_never_touch_each_others_timers(
        r: redis.Redis, redis_url: str, processes: Processes, tmp_path: Path) -> None:
    other = tmp_path / "billing_tasks"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "invoices.py").write_text(textwrap.dedent("""\
        import json, os
        from tests.task_pkg import RUNS, client

        def send(tag):
            client().rpush(RUNS, json.dumps(["billing", tag, os.getpid()]))
        """))
    env = processes.env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    web = listeners(processes, redis_url, 2, "--tasks", TASKS, "--group", "web")
    billing = listeners(processes, redis_url, 2, "--tasks", "billing_tasks",
                        "--group", "billing", env=env)
    wait_listening(r, 4, web + billing, processes)
    with Timers(redis_url, group="web") as t:
        t.schedule_many(TimerSpec("record.hit", [f"w{i}", "web"], in_=0.5) for i in range(1000))
    with Timers(redis_url, group="billing") as t:
        t.schedule_many(TimerSpec("invoices.send", [f"b{i}"], in_=0.5) for i in range(1000))

    wait_until(lambda: len(runs(r)) >= 2000, 60, message="2,000 timers to run")
    done = runs(r)
    billing_pids = {p.pid for p in billing}
    billing_runs = [run for run in done if run[0] == "billing"]
    web_runs = [run for run in done if run[0] != "billing"]
    assert Counter(run[1] for run in billing_runs) == {f"b{i}": 1 for i in range(1000)}
    assert Counter(run[0] for run in web_runs) == {f"w{i}": 1 for i in range(1000)}
    assert {run[2] for run in billing_runs} <= billing_pids
    with Timers(redis_url) as t:
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
        assert t.stats().failed == 0, "a listener dead-lettered the other app's timers"


def test_a_group_nobody_serves_stays_pending_and_a_tasks_declared_group_is_honoured(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    default = listeners(processes, redis_url, 1, "--tasks", TASKS)
    wait_listening(r, 1, default, processes)
    with Timers(redis_url) as t:
        t.schedule("record.hit", ["orphan"], in_=0, id="orphan", group="nobody")
        t.schedule("flow.encode", ["moved"], in_=0, id="moved")  # declares group video
        wait_until(lambda: t.stats().counters.get("routed") == 1, 10,
                   message="the default listener to move the video timer")
        assert runs(r) == []
        assert t.get("orphan") is not None and t.get("moved") is not None
        video = listeners(processes, redis_url, 1, "--tasks", TASKS, "--group", "video")
        wait_until(lambda: runs(r) != [], 10, message="the video listener to run it")
        assert runs(r) == [["moved", video[0].pid]]
        assert t.get("orphan") is not None  # still pending: nobody serves its group
        assert t.stats().failed == 0


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and of every live process below it."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        child = int(stat.parent.name)
        parents[child] = int(fields[1])
        times[child] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    tree, grew = {pid}, True
    while grew:
        below = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return sum(times.get(p, 0.0) for p in tree)


SETTLED_WINDOW = 2.0
"""Seconds watched once every timer waits on a group disagreement: no timer may move and no
listener may spin meanwhile (a spinning pair moved 2,300 timers a second)."""


def test_releases_that_disagree_on_a_tasks_group_stop_moving_its_timers_and_say_why(
        r: redis.Redis, redis_url: str, processes: Processes, tmp_path: Path) -> None:
    """Listener A serves group a, and its release says the task is in group b; B serves b
    and its release says a. Each timer moves a bounded number of times, then waits where
    it is, visible with the reason; one warning names the task and both groups; and the
    listeners do not spin."""
    for package, says in (("release_a", "b"), ("release_b", "a")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "jobs.py").write_text(textwrap.dedent(f"""\
            import json
            import timers
            from tests.task_pkg import RUNS, client

            @timers.task(group={says!r})
            def work(tag):
                client().rpush(RUNS, json.dumps([tag]))
            """))
    env = processes.env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    a = listeners(processes, redis_url, 1, "--tasks", "release_a", "--group", "a", env=env)
    b = listeners(processes, redis_url, 1, "--tasks", "release_b", "--group", "b", env=env)
    wait_listening(r, 2, a + b, processes)
    ids = [f"t{i}" for i in range(20)]
    with Timers(redis_url, group="a") as t:
        t.schedule_many(TimerSpec("jobs.work", [i], in_=0, id=i) for i in ids)

        def waiting() -> list[PendingTimer]:
            found = [t.get(i) for i in ids]
            return [p for p in found if p is not None and p.wait is not None
                    and p.wait.kind == "group"]

        wait_until(lambda: len(waiting()) == len(ids), 30,
                   message="every timer to wait on the group disagreement")
        routed = t.stats().counters.get("routed", 0)
        cpu = {p.pid: _cpu_seconds(p.pid) for p in a + b}
        started = time.monotonic()
        time.sleep(SETTLED_WINDOW)  # the window measured, not a wait for an outcome
        elapsed = time.monotonic() - started
        busy = {pid: (_cpu_seconds(pid) - before) / elapsed for pid, before in cpu.items()}
        assert t.stats().counters.get("routed", 0) == routed, "timers still move"
        assert all(share < 0.2 for share in busy.values()), f"listeners busy: {busy}"
        shown = waiting()
        assert len(shown) == len(ids), "a waiting timer vanished from get()"
        for timer in shown:
            assert timer.wait is not None
            assert timer.wait.describe().startswith(
                "waiting: group disagreement: task jobs.work says group a, listener serves b")
            assert timer.group == "b"
        assert len(t.list(100)) == len(ids)
    for i in ids:
        record = Record.decode(r.hget(KEYS.records, i))
        assert 1 <= int(record.options[Option.GROUP_MOVES]) <= 10
    assert routed <= 10 * len(ids)
    assert runs(r) == []
    shown_cli = subprocess.run([TIMERS_COMMAND, "get", "t0", "--url", redis_url],
                               capture_output=True, text=True, timeout=30, check=True).stdout
    assert "group disagreement: task jobs.work says group a, listener serves b" in shown_cli
    listed = subprocess.run([TIMERS_COMMAND, "list", "--url", redis_url],
                            capture_output=True, text=True, timeout=30, check=True).stdout
    assert listed.count("group disagreement") == len(ids)
    logs = "\n".join(processes.output(p) for p in a + b)
    warnings = [line for line in logs.splitlines() if "group disagreement" in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0] and "jobs.work" in warnings[0]
    assert "group a" in warnings[0] and "serves b" in warnings[0]


# -- concurrency keys -----------------------------------------------------------------


def schedule_device_commands(url: str, due_in: float) -> None:
    with Timers(url) as t:
        t.schedule_many(TimerSpec("flow.device_command", [f"c{i}", i % 50], in_=due_in)
                        for i in range(1000))


def spans(folder: Path) -> list[list[Any]]:
    """Every ``[tag, key, pid, start, end]`` the runs wrote under ``folder``."""
    return [json.loads(line) for path in folder.glob("spans.*")
            for line in path.read_text().splitlines() if line]


def test_one_command_at_a_time_per_device_across_four_listeners(
        r: redis.Redis, redis_url: str, processes: Processes, tmp_path: Path) -> None:
    # each run writes its own start and end to a file (flow.SPANS_ENV): the overlaps and
    # the total are what the tasks saw, and no Redis call of theirs slows the runs
    env = {**processes.env(), SPANS_ENV: str(tmp_path)}
    procs = listeners(processes, redis_url, 4, "--tasks", TASKS, env=env)
    wait_listening(r, 4, procs, processes)
    schedule_device_commands(redis_url, 1.0)

    # counted, not parsed, and not too often: the test process shares the two cores
    wait_until(lambda: sum(path.read_bytes().count(b"\n") for path in tmp_path.glob("spans.*"))
               >= 1000, 60, interval=0.05, message="1,000 commands to run")
    done = spans(tmp_path)
    assert Counter(run[0] for run in done) == {f"c{i}": 1 for i in range(1000)}
    assert overlaps([[tag, key, pid, start, end, 1] for tag, key, pid, start, end in done]) == 1
    with Timers(redis_url) as t:
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
        assert t.stats().failed == 0
    assert r.hlen(KEYS.next_in_line) == 0 and r.hlen(KEYS.held) == 0  # nothing left behind
    first, last = min(run[3] for run in done), max(run[4] for run in done)
    print(f"\n1,000 commands over 50 devices, 20 ms each, 4 listeners: {last - first:.0f} ms "
          f"from the first start to the last end (ideal 400 ms)")


def test_a_killed_listeners_device_slots_free_when_its_lease_lapses(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    procs = listeners(processes, redis_url, 4, "--tasks", TASKS, "--lease", "1")
    wait_listening(r, 4, procs, processes)
    schedule_device_commands(redis_url, 0.5)
    # the victim: a listener that is running commands (whichever claimed first: a key's
    # next command is handed to the listener that ran the one before, so one of the four
    # may get none)
    started = wait_until(lambda: r.lrange(STARTED, 0, -1), 30, message="a command to start")
    victim = next(p for p in procs if p.pid == json.loads(started[0])[2])
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL

    wait_until(lambda: len({run[0] for run in runs(r)}) >= 1000, 60,
               message="every command to run, the killed ones again after the lease")
    done = runs(r)
    assert Counter(run[0] for run in done) == {f"c{i}": 1 for i in range(1000)}
    assert overlaps(done) == 1, "a device ran two commands at once"
    with Timers(redis_url) as t:
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
        stats = t.stats()
    assert stats.failed == 0
    assert stats.counters.get("reruns", 0) >= 1
    assert r.hlen(KEYS.next_in_line) == 0 and r.hlen(KEYS.held) == 0  # nothing left behind


def test_a_run_handed_back_at_shutdown_keeps_its_key_until_its_process_is_gone(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    # SIGTERM: the listener waits --shutdown-timeout for its tasks, hands back the runs
    # still going, and exits. A thread cannot be stopped: until the process is gone its
    # task may still run, so nothing of its key may start before then
    first = listeners(processes, redis_url, 1, "--tasks", TASKS, "--shutdown-timeout", "0.2")
    wait_listening(r, 1, first, processes)
    with Timers(redis_url) as t:
        t.schedule("flow.keyed", ["holder", "k", -1], in_=0, key="k", id="holder")
        wait_until(lambda: r.llen(STARTED) >= 1, 10, message="the holder to start")
        t.schedule("flow.keyed", ["next", "k", 0], in_=0, key="k", id="next")
        second = listeners(processes, redis_url, 1, "--tasks", TASKS)
        wait_listening(r, 2, first + second, processes)
        first[0].send_signal(signal.SIGTERM)
        assert first[0].wait(10) == 0
        gone_ms = redis_now_ms(r)  # the tasks note their starts on the Redis clock
        r.set(RELEASE, 1)  # the holder, run again, may end
        wait_until(lambda: len(runs(r)) >= 2, 20, message="the holder again, then the next")
        wait_until(lambda: settled(t), 10, message="nothing pending or running")
    holder_starts = [start for start in map(json.loads, r.lrange(STARTED, 0, -1))
                     if start[0] == "holder"]
    assert len(holder_starts) == 2 and holder_starts[0][2] == first[0].pid
    # cut by the stop, it runs again as a rerun: in a quarantine process of the second
    assert holder_starts[1][2] not in (first[0].pid, second[0].pid)
    assert holder_starts[1][3] > gone_ms, "the key ran again while the old task could"
    done = runs(r)
    assert [run[0] for run in done] == ["holder", "next"]  # the handed-back timer first
    assert done[1][3] >= done[0][4]


# -- rate limits ----------------------------------------------------------------------


def test_a_rate_of_600_a_minute_across_three_listeners_spaces_300_timers_due_at_once(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    procs = listeners(processes, redis_url, 3, "--tasks", TASKS)
    wait_listening(r, 3, procs, processes)
    with Timers(redis_url) as t:
        t.schedule_many(TimerSpec("flow.paced", [f"p{i:03}", 5 if i % 3 == 0 else 0],
                                  id=f"p{i:03}", in_=1.0, priority=5 if i % 3 == 0 else 0)
                        for i in range(300))  # one script call: one due time for all

    # The priority order holds among the timers waiting for the rate: a timer still in its
    # due index, or claimed and not gated yet, is not waiting yet (the state machine's FIFO
    # rule). Note how many had started once every other one waited (or was the pacer).
    rate_queue = KEYS.rate_queue("task:flow.paced")
    queued = wait_until(lambda: (started := len(runs(r))) + r.zcard(rate_queue) + 1 >= 300
                        and started, 30, 0.005, message="the paced timers to queue")
    wait_until(lambda: len(runs(r)) >= 300, 60, message="300 paced timers to run")
    done = sorted(runs(r), key=lambda run: run[3])
    assert Counter(run[0] for run in done) == {f"p{i:03}": 1 for i in range(300)}
    starts = [run[3] for run in done]
    # noted as each task enters: up to ~100 ms after its gate let it go on a loaded machine,
    # so any 900 ms by the tasks' clocks (the gate's own times are checked in
    # test_rate_kill.py and test_rate_restart.py)
    busiest = max(sum(1 for s in starts[i:] if s < start + 900)
                  for i, start in enumerate(starts))
    assert busiest <= 11, f"{busiest} starts in 900 ms (10 a second + a burst of 1)"
    # after those, and the pacer chosen then: priority order, then due (= id) order, by the
    # times their listeners started them, right before the gate let each go (100 ms apart;
    # the time a task notes as it enters adds its listener's dispatch to a thread, by up to
    # ~100 ms on a loaded machine). One exception, by design:
    # a run that reaches its call past its rate slot's start window is handed back and asks
    # the rate again, behind the pacer already chosen (it logs so): only such a run may
    # start after timers it ranks behind.
    later = sorted(runs(r), key=lambda run: run[4])[int(queued) + 1:]
    logs = "".join(processes.output(p) for p in procs)
    missed = set(re.findall(r"timer (\S+) handed back unstarted: it reached its call past "
                            r"its rate slot's start window", logs))
    out_of_order = [(a[0], b[0], b[4] - a[4]) for i, a in enumerate(later)
                    for b in later[i + 1:] if (-a[1], a[0]) > (-b[1], b[0])]
    assert all(b in missed for _, b, _ in out_of_order), (
        f"not in priority order, then due order: {out_of_order[:5]} (handed back past "
        f"their start window: {sorted(missed)})")
    print(f"\n300 timers at 600/m: busiest 900 ms {busiest} starts, "
          f"{(starts[-1] - starts[0]) / 1000:.1f} s first to last (ideal 29.9 s), "
          f"{len(missed)} handed back past their start window")


# -- priority -------------------------------------------------------------------------


def test_a_high_priority_timer_due_later_takes_the_next_free_slot_before_100_waiting(
        r: redis.Redis, redis_url: str, start_listener) -> None:
    start_listener(tasks=TASKS)
    with Timers(redis_url) as t:
        t.schedule("flow.keyed", ["holder", "k", -1], in_=0, key="k")
        wait_until(lambda: r.llen(STARTED) == 1, 10, message="the holder to start")
        t.schedule_many(TimerSpec("flow.keyed", [f"low{i:03}", "k"], id=f"low{i:03}", in_=0,
                                  key="k") for i in range(100))
        wait_until(lambda: r.zcard(KEYS.key_queue("k")) == 100, 10,
                   message="100 low-priority timers to wait for the key")
        t.schedule("flow.keyed", ["high", "k"], in_=0.05, key="k", priority=10)
        wait_until(lambda: r.zcard(KEYS.key_queue("k")) == 101, 10,
                   message="the high-priority timer to wait too")
        r.set(RELEASE, 1)
        wait_until(lambda: len(runs(r)) == 102, 20, message="all 102 to run")
    order = [run[0] for run in runs(r)]
    assert order[:2] == ["holder", "high"]
    assert order[2:] == [f"low{i:03}" for i in range(100)]
