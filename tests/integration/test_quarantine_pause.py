"""A rerun's task that returned in its quarantine child is not run again when its listener
pauses before it reads the outcome (design invariant 8, in the child's process): the child
notes the completion beside its listener's journal before it says so
(:func:`timers.listener.endings.journal.note_aside`), and a listener of the host that recovers the
run ends it the same way. Before, the note was the listener's to write once it read the
outcome: paused past its lease there, the run ran again (the chaos checker's seed 63, on a
loaded machine: 2 runs completed twice)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes
from tests.unit.test_crashes import PAST, crash
from timers import Timers
from timers.listener.endings.journal import DIR_ENV
from timers.model.keys import Keyspace
from timers.store.script_modes import register_all

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_a_rerun_that_returned_in_its_child_is_not_run_again_while_its_listener_is_paused(
        timers_client: Timers, r: redis.Redis, redis_url: str, processes: Processes,
        tmp_path: Path) -> None:
    trace, pid_file = tmp_path / "runs", tmp_path / "pid"
    timers_client.schedule("pause.listener", [str(trace), str(pid_file)], at=PAST, id="x")
    crash(r, Keyspace(), register_all(r), "web-1:101:ab")  # a rerun now: in a child
    env = processes.env()
    env[DIR_ENV] = str(tmp_path / "journals")
    command = (TIMERS_COMMAND, "listen", "--lease", "1", "--url", redis_url,
               "--tasks", "tests.fault_tasks", "--log-level", "info")
    paused = processes.spawn(*command, env=env)
    pid_file.write_text(str(paused.pid))
    try:
        wait_until(lambda: trace.exists() and _state(paused.pid) == "T", 30,
                   message="the rerun's child to return and stop its listener")
        running = Keyspace().running
        wait_until(lambda: all(score < _redis_ms(r) for _, score in
                               r.zrange(running, 0, -1, withscores=True)), 10,
                   message="the paused listener's lease to lapse")
        other = processes.spawn(*command, env=env)
        wait_until(lambda: timers_client.stats().fired == 1, 30,
                   message="the other listener to end the recovered run")
        assert trace.read_text().split() == [trace.read_text().split()[0]], \
            "the task ran again"
        wait_until(lambda: "ended the same way" in processes.output(other), 10,
                   message="the other listener to say how it ended the run")
        other.send_signal(signal.SIGTERM)
        assert other.wait(30) == 0
    finally:
        paused.send_signal(signal.SIGCONT)
    paused.send_signal(signal.SIGTERM)
    assert paused.wait(30) == 0, processes.output(paused)[-2000:]
    assert timers_client.stats().fired == 1


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _redis_ms(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return seconds * 1000 + micros / 1000
