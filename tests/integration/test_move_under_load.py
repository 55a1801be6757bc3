"""``timers move`` while both prefixes' listeners run at full load (issue 45, finding 4).

Two apps shared the prefix ``app`` by mistake. Its listeners: ``tests.move_one`` (runs
``own.mark`` only, 3,000 of them coming due during the move) and the old listener of the
mail app (``tests.move_two``, ``mail.mark``). 5,000 mail timers, some coming due during the
move, move to ``mail``, whose listener runs ``mail.mark``, and so do 20 more that are
running under ``app`` as the move starts (their first attempt fails, and they are retried);
then the old listener stops, as its operator would once the move said it was done. Every
run is written to a file ledger (:mod:`tests.fault_tasks.ledger`): each of the 8,020 timers
must run exactly once, none be dead, and no mail timer be left under ``app`` unreported
(the staying app's listener would refuse it once the old listener is gone).
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.fault_tasks.ledger import LEDGER_ENV
from tests.integration.faults import read_ledger
from tests.integration.helpers import TIMERS_COMMAND, Processes, run_cli
from timers import Timers
from timers.ops.operations import TimerSpec

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

OWN, MAIL, FLAKY = 3_000, 5_000, 20


def settled(t: Timers) -> bool:
    stats = t.stats()
    return stats.pending == 0 and stats.running == 0


def test_a_move_under_full_load_leaves_nothing_behind_and_every_timer_runs_once(
        processes: Processes, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    env = processes.env()
    env[LEDGER_ENV] = str(ledger)

    def listen(package: str, prefix: str) -> subprocess.Popen[bytes]:
        return processes.spawn(TIMERS_COMMAND, "listen", "--url", processes.url, "--prefix",
                               prefix, "--tasks", package, "--concurrency", "32",
                               "--shutdown-timeout", "5", env=env)

    with Timers(processes.url, prefix="app") as app, \
            Timers(processes.url, prefix="mail") as mail:
        listen("tests.move_one", "app")
        old = listen("tests.move_two", "app")
        new = listen("tests.move_two", "mail")
        wait_until(lambda: {b.get("tasks") for b in app.listeners() if b.get("task_set")}
                   == {"tests.move_one", "tests.move_two"}, 30, 0.1, message="app's listeners")
        wait_until(lambda: {b.get("tasks") for b in mail.listeners() if b.get("task_set")}
                   == {"tests.move_two"}, 30, 0.1, message="mail's listener")
        # 20 mail timers are running under 'app' as the move starts, held by the old
        # listener for 6 s: their first attempt fails then, and they are retried a second
        # later, pending under 'app' again once the walks have passed
        app.schedule_many([TimerSpec("mail.mark", [f"flaky{i}", 6.0], in_=0,
                                     id=f"flaky{i}") for i in range(FLAKY)])
        wait_until(lambda: app.stats().running == FLAKY, 30, 0.05, message="20 running")
        # app's own timers come due at once, a backlog its listener claims from the head of
        # the due index the move walks; the mail timers from 0.5 s on, over 6 s: those due
        # before the move takes them run under 'app', claimed by the old listener (or by
        # the other, which hands them to it)
        app.schedule_many([TimerSpec("own.mark", [f"own{i}"], in_=0.3 * i / OWN,
                                     id=f"own{i}") for i in range(OWN)])
        app.schedule_many([TimerSpec("mail.mark", [f"mail{i}"], in_=0.5 + 6 * i / MAIL,
                                     id=f"mail{i}") for i in range(MAIL)])
        started = time.monotonic()
        done = run_cli("move", "--to-prefix", "mail", "--task", "mail.mark",
                       "--prefix", "app", "--url", processes.url, timeout=60)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        behind = sum(1 for p in app.list(limit=20_000) if p.task == "mail.mark")
        old.send_signal(signal.SIGTERM)  # the old listener goes: the move said it was done
        old.wait(30)
        wait_until(lambda: settled(app) and settled(mail), 45, 0.1,
                   message="both prefixes settled")
        failures = app.failed(10_000) + mail.failed(10_000)
        dead = len(failures)

    starts = Counter(tid for kind, tid, _, _ in read_ledger(ledger) if kind == "S")
    ends = Counter(tid for kind, tid, _, _ in read_ledger(ledger) if kind == "E")
    where = Counter(pid for kind, tid, pid, _ in read_ledger(ledger)
                    if kind == "S" and not tid.startswith("own"))
    twice = sum(1 for n in starts.values() if n > 1)
    ids = ([f"own{i}" for i in range(OWN)] + [f"mail{i}" for i in range(MAIL)]
           + [f"flaky{i}" for i in range(FLAKY)])
    never = sum(1 for tid in ids if not ends[tid])
    print(f"\n{done.stdout.strip()} ({took:.1f} s); mail timers pending under 'app' after it: "
          f"{behind}; mail timers run under 'mail' {where[new.pid]}, under 'app' "
          f"{where[old.pid]}; ran twice {twice}; never ran {never}; dead {dead}")
    said = re.fullmatch(r"moved (\d+) pending timer\(s\) from 'app' to 'mail', left (\d+)",
                        done.stdout.strip())
    assert said is not None, done.stdout
    moved, left = int(said[1]), int(said[2])
    assert (left, behind, twice, never, dead) == (0, 0, 0, 0, 0), [f.raw for f in failures[:3]]
    assert where[new.pid] == moved and where[new.pid] + where[old.pid] == MAIL + FLAKY
