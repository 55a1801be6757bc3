"""A poison timer: its task kills the listener process (``os._exit``, a segfault).

Before: it ran again after every lease lapse, without limit, never recorded failed; under
``--processes 2 --lease 2`` the supervisor gave up after 10 restarts and stranded the
unrelated timers. Now its first death makes it a suspect, run in quarantine, where its
third death seen makes it a dead timer, and everything else runs once. (A lapsed lease
is no death seen: the listener may have been stopped; it is counted, never toward the
limit.)

And the timers in flight alongside the poison when it killed its listener (collateral, not
poison) must not be recorded dead with it: a run whose listener died runs again in a
quarantine process, so only the poison's own crashes count against it.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from bench.chaos.world import descendants
from tests.conftest import wait_until
from tests.integration.helpers import KEYS, Processes, settled
from tests.processes import alive
from tests.retry_tasks import RELEASE, calls, done
from tests.retry_tasks.poison import ATTEMPTS, STARTS
from timers import Timers, TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

ORDINARY = 200


def test_a_poison_timer_dies_after_three_crashes_and_the_rest_run_once(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    timers_client.schedule("poison.die", ["poison", ORDINARY], in_=0, id="poison")
    timers_client.schedule_many(TimerSpec("ok.hit", [f"t{i}"], in_=0, id=f"t{i}")
                                for i in range(ORDINARY))
    supervisor = processes.timers("listen", "--processes", "2", "--lease", "2", "--url",
                                  redis_url, "--tasks", "tests.retry_tasks")

    def poison_dead() -> bool:
        return bool(timers_client.failed()) or supervisor.poll() is not None

    wait_until(poison_dead, 40, message="the poison timer to be recorded dead")
    assert supervisor.poll() is None, processes.output(supervisor)
    (failure,) = timers_client.failed()
    assert failure.timer_id == "poison"
    message = failure.data["message"]
    assert message.startswith("its process died 3 times in quarantine (last: exit code 1 in "
                              "a quarantine process on "), message
    assert message.endswith(", after its lease lapsed once (its listener died or stalled)"), \
        message
    wait_until(lambda: settled(timers_client), 10, message="nothing pending or running")

    poison_calls = [n for tag, n in calls(r) if tag == "poison"]
    assert poison_calls == [1, 2, 3, 4], "once in a listener, 3 times in quarantine: dead"
    # each start an attempt: the first child's after the lapse, each later one's after a
    # child that died (the same claim: no rerun between them)
    assert [int(a) for a in r.lrange(ATTEMPTS, 0, -1)] == [1, 2, 3, 4]
    runs = Counter(tag for tag, _ in done(r))
    assert runs == Counter({f"t{i}": 1 for i in range(ORDINARY)}), "lost 0, runs per timer 1"
    stats = timers_client.stats()
    # one listener death (the first run: a lapse); the three deaths seen were in quarantine
    assert (stats.fired, stats.failed, stats.counters.get("reruns")) == (ORDINARY, 1, 1)

    # the supervisor still runs its two listeners: new timers fire
    timers_client.schedule_many(TimerSpec("ok.hit", [f"after-{i}"], in_=0) for i in range(5))
    wait_until(lambda: len(done(r)) == ORDINARY + 5, 10, message="timers after the poison")
    output = processes.output(supervisor)
    assert output.count("killed by") + output.count("exited with code 1") == 1, output[-3000:]
    assert output.count("its quarantine process died (exit code 1)") == 3, output[-3000:]
    assert "giving up" not in output


ALONGSIDE = 20


def test_timers_in_flight_alongside_a_poison_run_to_completion_and_none_is_dead(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """The poison kills its listener while 20 ordinary 0.5 s timers run beside it: they are
    cut short, rerun in quarantine once and complete; only the poison is dead."""
    timers_client.schedule("poison.die_amid", ["poison", ALONGSIDE], in_=0, id="poison")
    timers_client.schedule_many(TimerSpec("slow.nap", [f"n{i}"], in_=0, id=f"n{i}")
                                for i in range(ALONGSIDE))
    # one listener's first sweep claims all 21 (25 slots): the naps share the poison's process
    supervisor = processes.timers("listen", "--processes", "2", "--lease", "2",
                                  "--concurrency", "25", "--url", redis_url,
                                  "--tasks", "tests.retry_tasks")

    def all_ended() -> bool:
        return ((bool(timers_client.failed()) and settled(timers_client))
                or supervisor.poll() is not None)

    wait_until(all_ended, 40, message="the poison dead and every other timer ended")
    assert supervisor.poll() is None, processes.output(supervisor)
    failures = timers_client.failed()
    assert [f.timer_id for f in failures] == ["poison"], "no timer but the poison is dead"
    assert failures[0].data["message"].startswith("its process died 3 times in quarantine"), \
        failures[0].data
    completed = Counter(tag for tag, _ in done(r))
    assert set(completed) == {f"n{i}" for i in range(ALONGSIDE)}, "every nap completed"
    assert all(n == 1 for n in completed.values()), completed
    starts = Counter(tag for tag, _ in calls(r) if tag != "poison")
    cut_short = sorted(tag for tag, n in starts.items() if n > 1)
    assert cut_short, "the scenario needs naps in flight when the poison killed its process"
    assert max(starts.values()) == 2, f"a cut-short nap runs once more, no more: {starts}"
    stats = timers_client.stats()
    assert (stats.fired, stats.failed) == (ALONGSIDE, 1)



def test_a_poison_is_recorded_dead_of_the_starts_that_died_not_of_lapses(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """Two poison timers held by one listener: the first kills it while the second, claimed
    a few ms ahead of its due time, has not started (or, claimed late, just has). The
    second was once recorded "died 3 times" after 2 starts. Now each record counts the
    starts that died in quarantine, and only those toward the limit; the lapse of the
    listener that went away is told apart."""
    first = processes.timers("listen", "--lease", "2", "--url", redis_url,
                             "--tasks", "tests.retry_tasks")
    wait_until(lambda: r.zcard(KEYS.listeners) or first.poll() is not None, 20,
               message="the listener to start")
    timers_client.schedule("poison.die_once_claimed", ["first", "second"], in_=0, id="first")
    timers_client.schedule("poison.die_noting", ["second"], in_=0.5, id="second")
    wait_until(lambda: first.poll() is not None, 20, message="the poison to kill its listener")
    held = [run for run in r.hvals(KEYS.running_records) if "|second:" in run]
    assert held, "the second poison was held by the listener that died"
    second = processes.timers("listen", "--lease", "2", "--url", redis_url,
                              "--tasks", "tests.retry_tasks")
    wait_until(lambda: len(timers_client.failed()) == 2 or second.poll() is not None, 40,
               message="both poison timers to be recorded dead")
    assert second.poll() is None, processes.output(second)
    starts = [json.loads(item) for item in r.lrange(STARTS, 0, -1)]
    in_quarantine = Counter(tag for tag, pid in starts if pid not in (first.pid, second.pid))
    in_listener = Counter(tag for tag, pid in starts if pid == first.pid)
    # the second is claimed a few ms ahead of its due time, and the first takes the listener
    # down as it sees that claim; on a loaded machine the claim can come after its due time
    # and the second starts in the listener before it goes down. Either way its lease
    # lapses with the listener: a lapse, never a crash (its quarantine deaths below: 3)
    assert in_listener["first"] == 1 and in_listener["second"] <= 1, starts
    assert set(in_listener) <= {"first", "second"}, starts
    # the second first: the one that never started in the listener it went down with
    for failure in sorted(timers_client.failed(), key=lambda f: f.timer_id != "second"):
        message = failure.data["message"]
        counted = int(message.removeprefix("its process died ").split(" ")[0])
        started = sum(1 for tag, _ in starts if tag == failure.timer_id)
        assert counted <= started, f"{failure.timer_id}: {message!r} after {started} starts"
        died = in_quarantine[failure.timer_id]
        assert died == 3, (failure.timer_id, message, starts)  # max_crashes 3, lapses apart
        assert message.startswith(f"its process died {died} times in quarantine (last: "
                                  "exit code 1 in a quarantine process on "), message
        assert message.endswith(", after its lease lapsed once (its listener died or stalled)")


def test_timers_listen_starts_its_quarantine_process_before_any_rerun(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """The first rerun after a listener died would otherwise start an interpreter and
    import timers while the listener's other timers come due."""
    from pathlib import Path

    from tests.processes import children_of

    listener = processes.timers("listen", "--url", redis_url, "--tasks", "tests.retry_tasks")

    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        except OSError:
            return ""

    def forkserver() -> bool:
        assert listener.poll() is None, processes.output(listener)
        return any("forkserver" in cmdline(pid) for pid in children_of(listener.pid))

    wait_until(forkserver, 20, message="the quarantine process to start")
    assert r.hlen(KEYS.stats) == 0 or not r.hget(KEYS.stats, "reruns")  # before any rerun


def test_a_quarantined_run_whose_listener_dies_is_cut_not_finished_unseen(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes) -> None:
    """A rerun runs in a quarantine child (the fork server's child, not the listener's);
    the listener is killed. The child went on and finished the task with nobody left to
    read its outcome, and the run, its lease lapsed, ran again: a finished run run twice
    (the chaos checker's Cluster run). It exits with its listener now: the run is cut, and
    the next listener runs it once."""
    from tests.unit.test_crashes import crash
    from timers.model.keys import Keyspace
    from timers.store.script_modes import register_all

    timers_client.schedule("slow.hold", ["cut", 30.0], in_=0, id="cut")
    crash(r, Keyspace(), register_all(r), "web-0:100:ab")  # a suspect: it runs in quarantine
    first = processes.timers("listen", "--lease", "2", "--url", redis_url,
                             "--tasks", "tests.retry_tasks")
    wait_until(lambda: [tag for tag, _ in calls(r)] == ["cut"] or first.poll() is not None,
               20, message="the rerun to start in its quarantine child")
    below = descendants(first.pid)
    assert below, "a fork server and its child"
    first.kill()
    first.wait(5)
    wait_until(lambda: not any(alive(pid) for pid in below), 5,
               message="the quarantine child to exit with its listener")
    r.set(RELEASE, 1)  # what would have let the orphaned task return
    second = processes.timers("listen", "--lease", "2", "--url", redis_url,
                              "--tasks", "tests.retry_tasks")
    wait_until(lambda: done(r) or second.poll() is not None, 20,
               message="the cut run to run again and return")
    wait_until(lambda: settled(timers_client), 10, message="nothing pending or running")
    assert [tag for tag, _ in done(r)] == ["cut"], "finished once"
    assert [tag for tag, _ in calls(r)] == ["cut", "cut"], "cut once, run again once"
