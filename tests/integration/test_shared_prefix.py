"""Two apps on one Redis with the same prefix (or a stray ``tasks`` package): no timer is
dead while a live listener can run it (issue 32, item 1).

Real listener processes: ``tests.app_one`` runs ``billing.charge`` only, ``tests.app_two``
``mailing.send`` only; the stray listener imports the repository's example ``tasks``. Each
claims the other's timers and hands them back, due a little later each time
(:mod:`timers.ops.fleet`).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import Processes, run_cli, runs
from timers import Timers
from timers.model.encoding import Record
from timers.model.keys import Keyspace
from timers.ops.fleet import handed_over
from timers.ops.operations import TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

KEYS = Keyspace()
N = 300


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listen(processes: Processes, *args: str) -> Any:
    return processes.timers("listen", "--url", processes.url, "--concurrency", "16",
                            "--shutdown-timeout", "2", *args)


def wait_for_listeners(t: Timers, packages: set[str]) -> None:
    wait_until(lambda: {b.get("tasks") for b in t.listeners() if b.get("task_set")}
               == packages, 30, 0.1, message=f"listeners of {sorted(packages)} to announce")


def schedule(t: Timers, task: str, tag: str, n: int, in_: float) -> None:
    t.schedule_many([TimerSpec(task, [f"{tag}{i}"], in_=in_, id=f"{tag}{i}")
                     for i in range(n)])


def by_app(r: redis.Redis) -> Counter[tuple[str, str]]:
    """(tag's app as scheduled, app that ran it) for every run."""
    return Counter(("app_one" if tag.startswith("one") else "app_two", app)
                   for tag, app, _ in runs(r))


def assert_nothing_dead(t: Timers) -> None:
    stats = t.stats()
    failures = t.failed(limit=5)
    assert stats.failed == 0 and not failures, [f.data for f in failures]
    assert stats.counters.get("rejected", 0) == 0


def test_two_apps_on_one_prefix_each_run_their_own_timers_and_none_is_dead(
        processes: Processes, timers_client: Timers, r: redis.Redis) -> None:
    one = listen(processes, "--tasks", "tests.app_one")
    two = listen(processes, "--tasks", "tests.app_two")
    wait_for_listeners(timers_client, {"tests.app_one", "tests.app_two"})
    cpu_before = cpu_seconds(one.pid), cpu_seconds(two.pid)
    started = time.monotonic()
    schedule(timers_client, "billing.charge", "one", N, 1.0)
    schedule(timers_client, "mailing.send", "two", N, 1.0)
    due = {p.id: p.due.timestamp() for p in timers_client.list(limit=2 * N)}
    wait_until(lambda: r.llen("test:runs") >= 2 * N, 60, 0.05,
               message=f"{2 * N} runs")
    elapsed = time.monotonic() - started
    ran = by_app(r)
    cpu = [cpu_seconds(p.pid) - before for p, before in zip((one, two), cpu_before,
                                                              strict=True)]
    late = sorted(1000 * (at - due[tag]) for tag, _, at in runs(r))
    print(f"\n2 x {N} timers, two apps on one prefix: runs by (scheduled for, ran by) "
          f"{dict(ran)} in {elapsed:.1f} s; lateness p50 {late[len(late) // 2]:.0f} ms, "
          f"p99 {late[len(late) * 99 // 100]:.0f} ms, max {late[-1]:.0f} ms; listener CPU "
          f"{cpu[0]:.2f} s and {cpu[1]:.2f} s")
    assert ran == {("app_one", "app_one"): N, ("app_two", "app_two"): N}
    assert len({tag for tag, _, _ in runs(r)}) == 2 * N, "each timer ran once"
    assert_nothing_dead(timers_client)
    wait_until(lambda: timers_client.stats().pending == 0, 10, message="nothing pending")


def test_a_stalled_listener_s_timers_wait_for_it_without_a_busy_loop_elsewhere(
        processes: Processes, timers_client: Timers, r: redis.Redis) -> None:
    """App two's listener is stopped (SIGSTOP) but still live by its heartbeat: app one
    claims its timers and hands them back, each less often, at little CPU; once app two
    runs again, it runs them all."""
    one = listen(processes, "--tasks", "tests.app_one")
    two = listen(processes, "--tasks", "tests.app_two")
    wait_for_listeners(timers_client, {"tests.app_one", "tests.app_two"})
    os.kill(two.pid, signal.SIGSTOP)
    try:
        schedule(timers_client, "mailing.send", "two", N, 0.0)
        before, started = cpu_seconds(one.pid), time.monotonic()
        wait_until(lambda: time.monotonic() - started >= 6.0, 10, 0.5,
                   message="six seconds of app two stalled")  # the span measured
        cpu = cpu_seconds(one.pid) - before
        span = time.monotonic() - started
        # the pending ones (a few are claimed by app one at any moment, to be handed back)
        records = [Record.decode(v) for v in r.hvals(KEYS.records)]
        times = Counter(handed_over(record) for record in records)
        print(f"\napp two stalled {span:.1f} s with {N} due timers: app one handed each "
              f"of the {len(records)} pending back (times: timers) {dict(sorted(times.items()))}"
              f", CPU {cpu:.2f} s ({100 * cpu / span:.0f}% of a core)")
        assert runs(r) == [], "app one ran none of app two's timers"
        assert len(records) >= N - 64 and min(times) >= 1
        assert max(times) <= 10, "each timer handed back a bounded number of times"
        assert cpu / span < 0.35, "no busy loop"
    finally:
        os.kill(two.pid, signal.SIGCONT)
    resumed = time.monotonic()
    wait_until(lambda: r.llen("test:runs") >= N, 30, 0.05, message=f"{N} runs by app two")
    print(f"app two ran all {N} within {time.monotonic() - resumed:.1f} s of resuming")
    assert by_app(r) == {("app_two", "app_two"): N}
    assert_nothing_dead(timers_client)


def test_a_stray_tasks_package_kills_no_timer_and_its_listener_names_the_other(
        processes: Processes, timers_client: Timers, r: redis.Redis) -> None:
    """A listener started where an unrelated ``tasks`` package is importable (the
    repository's examples) shares the prefix with the app's listener."""
    app = listen(processes, "--tasks", "tests.app_one")
    wait_for_listeners(timers_client, {"tests.app_one"})
    stray = listen(processes)
    wait_for_listeners(timers_client, {"tests.app_one", "tasks"})
    schedule(timers_client, "billing.charge", "one", 200, 1.0)
    wait_until(lambda: r.llen("test:runs") >= 200, 60, 0.05, message="200 runs")
    assert by_app(r) == {("app_one", "app_one"): 200}
    assert_nothing_dead(timers_client)
    warning = "another tasks package serves this prefix"
    wait_until(lambda: warning in processes.output(stray), 10,
               message="the stray listener's warning")
    line = next(x for x in processes.output(stray).splitlines() if warning in x)
    print(f"\nstray listener: {line.strip()}")
    assert "'tests.app_one'" in line
    assert app.poll() is None and stray.poll() is None


def test_a_timer_no_live_listener_can_run_is_refused_naming_those_seen(
        processes: Processes, timers_client: Timers) -> None:
    listen(processes, "--tasks", "tests.app_one")
    listen(processes, "--tasks", "tests.app_two")
    wait_for_listeners(timers_client, {"tests.app_one", "tests.app_two"})
    timers_client.schedule("nobody.has", [1], id="lost", in_=0)
    failure = wait_until(lambda: timers_client.get_failure("lost"), 20, 0.05,
                         message="the timer to be refused")
    print(f"\nrefused: {failure.data['message']}")
    assert failure.data["kind"] == "refused"
    assert "'tests.app_one'" in failure.data["message"]
    assert "'tests.app_two'" in failure.data["message"]


def test_failed_retry_skips_timers_no_live_listener_can_run_and_says_so(
        processes: Processes, timers_client: Timers, r: redis.Redis) -> None:
    listen(processes, "--tasks", "tests.app_one")
    wait_for_listeners(timers_client, {"tests.app_one"})
    schedule(timers_client, "mailing.send", "two", 20, 0.0)  # only app one is live: refused
    wait_until(lambda: timers_client.stats().failed == 20, 20, 0.05,
               message="20 timers refused")
    done = run_cli("failed", "retry", "--all", "--url", processes.url)
    print(f"\nwith app one alone: {done.stdout.strip()}")
    assert done.returncode == 0, done.stderr
    assert "retrying 0 timer(s); skipped 20 no live listener can run (e.g. two" in done.stdout
    assert "mailing.send, group default" in done.stdout
    one = run_cli("failed", "retry", "two3", "--url", processes.url)
    assert one.returncode != 0 and "no live listener can run mailing.send" in one.stderr
    assert timers_client.stats().failed == 20, "nothing retried, nothing refused again"

    listen(processes, "--tasks", "tests.app_two")
    wait_for_listeners(timers_client, {"tests.app_one", "tests.app_two"})
    done = run_cli("failed", "retry", "--all", "--url", processes.url)
    print(f"with app two live too: {done.stdout.strip()}")
    assert done.stdout.strip() == "retrying 20 timer(s)"
    wait_until(lambda: r.llen("test:runs") >= 20, 30, 0.05, message="20 runs by app two")
    assert by_app(r) == {("app_two", "app_two"): 20}
    assert_nothing_dead(timers_client)


def test_timers_move_moves_1000_timers_to_the_prefix_whose_listener_runs_them(
        processes: Processes, timers_client: Timers, r: redis.Redis) -> None:
    """Mail timers scheduled under the billing app's prefix by mistake (100 already refused
    there) move to the mail app's own prefix, due times kept, and run there once."""
    listen(processes, "--tasks", "tests.app_one")
    listen(processes, "--tasks", "tests.app_two", "--prefix", "mail")
    with Timers(processes.url, prefix="mail") as mail:
        wait_for_listeners(timers_client, {"tests.app_one"})
        wait_for_listeners(mail, {"tests.app_two"})
        schedule(timers_client, "mailing.send", "two-dead", 100, 0.0)
        wait_until(lambda: timers_client.stats().failed == 100, 30, 0.05,
                   message="100 timers refused under the wrong prefix")
        schedule(timers_client, "mailing.send", "two", 1000, 15.0)
        schedule(timers_client, "billing.charge", "one", 100, 15.0)
        due = {p.id: p.due for p in timers_client.list(limit=2000)}
        refused = run_cli("move", "--to-prefix", "mail", "--task", "billing.charge",
                          "--url", processes.url)
        assert refused.returncode == 1 and refused.stdout == ""
        assert "no live listener of 'mail' runs 'billing.charge'" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert len(timers_client.list(limit=2000)) == 1100, "nothing moved"
        started = time.monotonic()
        done = run_cli("move", "--to-prefix", "mail", "--task", "mailing.send", "--dead",
                       "--url", processes.url)
        took = time.monotonic() - started
        print(f"\n{done.stdout.strip()} (the command took {took:.1f} s)")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == ("moved 1000 pending timer(s) and 100 dead one(s) "
                                       "from 'timers' to 'mail', left 0")
        left = timers_client.list(limit=2000)
        assert {p.task for p in left} == {"billing.charge"} and len(left) == 100
        moved = mail.list(limit=2000)
        assert len(moved) == 1000 and all(p.due == due[p.id] for p in moved)
        assert timers_client.stats().failed == 0 and mail.stats().failed == 100
        assert run_cli("failed", "retry", "--all", "--prefix", "mail",
                       "--url", processes.url).stdout.strip() == "retrying 100 timer(s)"
        wait_until(lambda: r.llen("test:runs") >= 1200, 60, 0.1, message="1200 runs")
        assert by_app(r) == {("app_one", "app_one"): 100, ("app_two", "app_two"): 1100}
        assert len({tag for tag, _, _ in runs(r)}) == 1200, "each timer ran once"
        assert_nothing_dead(timers_client)
        assert_nothing_dead(mail)
