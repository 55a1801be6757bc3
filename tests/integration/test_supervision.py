"""Running listeners in production: ``timers listen --processes N`` under its supervisor,
``timers listeners``, and a graceful SIGTERM that hands a running timer back.

Everything here runs the real ``timers`` command as a subprocess.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes, run_cli, settled
from tests.processes import alive, children_of
from tests.retry_tasks import RELEASE, calls, done
from timers import Timers, TimerSpec
from timers.model.keys import Keyspace
from timers.store.scripts import Scripts

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TASKS = "tests.retry_tasks"


def listener_pids(t: Timers) -> set[int]:
    """Pids of the listeners whose heartbeat is live."""
    return {int(info["pid"]) for info in t.listeners()}


def cli_listener_pids(url: str) -> list[int]:
    """The PID column of ``timers listeners``."""
    shown = run_cli("listeners", "--url", url)
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split()[:3] == ["ID", "HOST", "PID"], shown.stdout
    return [int(row.split()[2]) for row in rows]


def test_supervised_listeners_are_restarted_and_stop_on_sigterm(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    supervisor = processes.timers("listen", "--processes", "2", "--url", redis_url,
                                  "--tasks", TASKS, "--shutdown-timeout", "2")

    def two_live_children() -> set[int] | bool:
        kids = children_of(supervisor.pid)
        if len(kids) == 2 and listener_pids(timers_client) == kids:
            return kids
        return supervisor.poll() is not None

    first = wait_until(two_live_children, 15, message="2 supervised listeners to heartbeat")
    assert supervisor.poll() is None, processes.output(supervisor)
    assert isinstance(first, set)
    assert sorted(cli_listener_pids(redis_url)) == sorted(first)

    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> set[int] | bool:
        kids = children_of(supervisor.pid, zombies=True)
        if len(kids) == 2 and victim not in kids and kids <= listener_pids(timers_client):
            return kids
        return supervisor.poll() is not None

    second = wait_until(replaced, 15, message="the killed listener to be replaced")
    assert supervisor.poll() is None, processes.output(supervisor)
    assert isinstance(second, set)
    (newcomer,) = second - first
    assert second - {newcomer} == first - {victim}
    assert not alive(victim)
    assert newcomer in cli_listener_pids(redis_url)
    # the killed listener's heartbeat lingers until it lapses; the others are all live
    assert second <= listener_pids(timers_client) <= second | {victim}

    tags = [f"after-{i}" for i in range(6)]
    timers_client.schedule_many(TimerSpec("ok.hit", [tag], in_=0.1) for tag in tags)
    wait_until(lambda: len(done(r)) == len(tags) and settled(timers_client), 10,
               message="the timers scheduled after the restart to fire")
    assert sorted(tag for tag, _ in calls(r)) == sorted(tags), "each fired once"

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0, processes.output(supervisor)
    assert not children_of(supervisor.pid, zombies=True)
    assert not any(alive(pid) for pid in second)
    assert listener_pids(timers_client) <= {victim}, "stopped listeners say goodbye"
    output = processes.output(supervisor)
    assert f"pid {victim} killed by SIGKILL; restarting" in output
    lines = output.splitlines()
    assert "supervisor] timers.listener.supervision.supervisor: stopped: supervisor of 2 " \
        "listener process(es), exit code 0" in lines[-1]
    assert {pid for pid in second if f"[pid {pid} listener " in output} == second
    assert sum("timers.listener: stopped: " in line for line in lines) == 2, output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_hands_a_running_timer_back(sig: signal.Signals, timers_client: Timers,
                                                  r: redis.Redis, redis_url: str,
                                                  processes: Processes, start_listener) -> None:
    """SIGHUP too (it used to kill the listener outright: its run waited for the lease)."""
    tid = timers_client.schedule("slow.hold", ["slow", 30], in_=0, id="slow")
    listener = processes.timers("listen", "--url", redis_url, "--tasks", TASKS,
                                "--shutdown-timeout", "0.5")
    wait_until(lambda: calls(r) == [["slow", 1]] or listener.poll() is not None, 15,
               message="the listener to start the slow task")
    assert listener.poll() is None, processes.output(listener)
    assert timers_client.stats().running == 1

    listener.send_signal(sig)
    assert listener.wait(15) == 0, processes.output(listener)
    output = processes.output(listener)
    assert "handing back 1 unfinished run(s) to run elsewhere: slow\n" in output
    assert "stopped: 0 run(s) fired: 0 ok, 0 failed, 0 to retry, 0 skipped; 1 handed back" \
        in output.splitlines()[-1]

    pending = timers_client.get(tid)
    assert pending is not None, "the unfinished timer is pending again"
    assert (pending.task, pending.args, pending.attempts) == ("slow.hold", ["slow", 30], 0)
    stats = timers_client.stats()
    assert (stats.pending, stats.running) == (1, 0)
    assert stats.counters.get("handed_back") == 1
    assert stats.counters.get("fired", 0) == 0
    assert done(r) == [], "the task never finished there"

    r.set(RELEASE, 1)
    rescuer = start_listener(tasks=TASKS)
    wait_until(lambda: done(r) == [["slow", "released"]] and settled(timers_client), 10,
               message="another listener to run the handed-back timer")
    assert calls(r) == [["slow", 1], ["slow", 2]]
    (report,) = rescuer.reports()
    # cut while its task ran: the second start is a rerun, counted (no lease had to lapse)
    assert (report.timer_id, report.attempt, report.outcome.kind) == ("slow", 2, "ok")
    counters = timers_client.stats().counters
    assert counters.get("fired") == 1
    assert counters.get("reruns") == 1


def test_supervised_burst_listeners_exit_once_idle(timers_client: Timers, r: redis.Redis,
                                                   redis_url: str,
                                                   processes: Processes) -> None:
    """``--burst`` means "exit once nothing is due and nothing runs"; under a supervisor a
    child that did just that has not died and must not be restarted."""
    timers_client.schedule_many(TimerSpec("ok.hit", [f"burst-{i}"], in_=0) for i in range(4))
    supervisor = processes.timers("listen", "--processes", "2", "--burst", "--url", redis_url,
                                  "--tasks", TASKS)
    try:
        code = supervisor.wait(30)
    except Exception:
        pytest.fail("the supervisor did not exit:\n" + processes.output(supervisor))
    output = processes.output(supervisor)
    tail = "\n".join(output.splitlines()[-3:])
    assert sorted(tag for tag, _ in done(r)) == [f"burst-{i}" for i in range(4)]
    restarts = [line for line in output.splitlines() if line.endswith("; restarting")]
    assert restarts == [], f"{len(restarts)} restarts of idle burst listeners:\n{tail}"
    assert code == 0, tail


def test_children_stop_and_hand_back_when_the_supervisor_is_killed(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        start_listener) -> None:
    """``kill -9`` of the supervisor: its listeners used to run on as orphans."""
    tags = [f"held-{i}" for i in range(4)]
    timers_client.schedule_many(TimerSpec("slow.hold", [tag, 30], in_=0, id=tag)
                                for tag in tags)
    supervisor = processes.timers("listen", "--processes", "2", "--url", redis_url,
                                  "--tasks", TASKS, "--shutdown-timeout", "0.5")
    wait_until(lambda: len(calls(r)) == len(tags) or supervisor.poll() is not None, 15,
               message="the listeners to start the slow tasks")
    kids = children_of(supervisor.pid)
    assert supervisor.poll() is None and len(kids) == 2, processes.output(supervisor)
    try:
        os.kill(supervisor.pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(pid) for pid in kids), 15,
                   message="the orphaned listeners to stop")
    finally:
        for pid in kids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    stats = timers_client.stats()
    assert (stats.pending, stats.running) == (len(tags), 0), "handed back, none lost"
    assert stats.counters.get("handed_back") == len(tags)

    r.set(RELEASE, 1)
    start_listener(tasks=TASKS)
    wait_until(lambda: len(done(r)) == len(tags) and settled(timers_client), 10,
               message="another listener to run the handed-back timers")
    assert sorted(tag for tag, how in done(r)) == tags, "each ran to the end once"
    assert timers_client.stats().counters.get("reruns") == len(tags), "each cut run counted"


def descendants_of(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, theirs, …), from /proc."""
    found, todo = set(), [pid]
    while todo:
        kids = children_of(todo.pop())
        found |= kids
        todo += kids
    return found


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM,
                                 signal.SIGINT], ids=lambda s: s.name)
def test_every_descendant_exits_within_seconds_when_the_supervisor_dies(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        sig: signal.Signals) -> None:
    """A supervisor killed while its listeners run tasks, one of them reruns in a
    quarantine child (a run whose listener died): the listeners, their fork servers and the
    quarantine child are all gone within 5 s (the shutdown timeout is 30 s: an orphaned
    listener lets its tasks go on 2 s, then hands them back). SIGTERM and SIGINT stop the
    supervisor gracefully (its children get the shutdown timeout, 2 s here), and it exits
    only once every one of them is gone."""
    shutdown = "30" if sig in (signal.SIGKILL, signal.SIGSEGV) else "2"
    tags = [f"held-{i}" for i in range(3)]
    timers_client.schedule_many(TimerSpec("slow.hold", [tag, 60], in_=0, id=tag)
                                for tag in tags)
    timers_client.schedule("slow.hold", ["rerun", 60], in_=0, id="rerun")
    scripts = Scripts(redis.Redis.from_url(redis_url), Keyspace())
    # a listener that claims it and dies at once: its rerun goes to a quarantine child
    scripts.claim(limit=1, lease_ms=1, horizon_ms=0, listener_id="dead", groups=("default",),
                  event_ids=["rerun"])
    supervisor = processes.timers("listen", "--processes", "3", "--url", redis_url,
                                  "--tasks", TASKS, "--shutdown-timeout", shutdown)

    def quarantined() -> set[int]:
        """The quarantine children: forked by a fork server (a listener's grandchild)."""
        return {pid for listener in children_of(supervisor.pid)
                for server in children_of(listener) for pid in children_of(server)}

    wait_until(lambda: (len(calls(r)) == len(tags) + 1 and quarantined())
               or supervisor.poll() is not None, 30,
               message="the tasks to start, the rerun in a quarantine child")
    assert supervisor.poll() is None, processes.output(supervisor)
    everyone = descendants_of(supervisor.pid)
    assert len(children_of(supervisor.pid)) == 3 and quarantined() <= everyone
    try:
        killed = time.monotonic()
        os.kill(supervisor.pid, sig)
        wait_until(lambda: not any(alive(pid) for pid in everyone), 5,
                   message=f"every one of {len(everyone)} descendants to exit")
        print(f"\n{len(everyone)} descendants gone {time.monotonic() - killed:.2f} s after "
              f"{sig.name}")
    finally:
        for pid in everyone:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    stats = timers_client.stats()
    assert (stats.pending, stats.running) == (len(tags) + 1, 0), "handed back, none lost"


def test_a_child_still_starting_exits_when_the_supervisor_dies(
        redis_url: str, processes: Processes, tmp_path: Path) -> None:
    """``kill -9`` of the supervisor while its children import a slow tasks package (a
    model that loads for a minute): they used to ask for the kernel's signal only once
    listening, and went on importing, then listened as orphans."""
    package = tmp_path / "slow_start_tasks"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        import os, pathlib, time
        if os.environ.get("TIMERS_SUPERVISOR_PID"):  # in a child only
            pathlib.Path({str(tmp_path)!r}, f"importing-{{os.getpid()}}").touch()
            time.sleep(60)  # the slow import itself
        def noop() -> None:
            pass
    """))
    env = processes.env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    supervisor = processes.spawn(TIMERS_COMMAND, "listen", "--processes", "2", "--url",
                                 redis_url, "--tasks", "slow_start_tasks", env=env)
    wait_until(lambda: len(list(tmp_path.glob("importing-*"))) == 2
               or supervisor.poll() is not None, 30, message="the children to import")
    assert supervisor.poll() is None, processes.output(supervisor)
    everyone = descendants_of(supervisor.pid)
    assert len(everyone) == 2
    try:
        os.kill(supervisor.pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(pid) for pid in everyone), 5,
                   message="the children still starting to exit")
    finally:
        for pid in everyone:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
