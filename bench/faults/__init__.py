"""Fault injection: ``python -m bench.faults [--quick] [--timers N] [--only FAULT[,FAULT]]``
(``--fault`` is the same as ``--only``).

For each fault this starts its own server (the repository's ``redis.conf``, ``appendonly
yes``), real listener processes (``python -m timers listen --lease 2 …`` with the task
package :mod:`bench.fault_tasks`; two of them unless the fault needs another shape),
schedules thousands of timers spread over a few seconds with a ledger of what must fire,
and injects the fault while they fire:

==============  ============================================================================
kill9           ``kill -9`` one of the two listeners while slow tasks run on it
client-kill     ``CLIENT KILL TYPE pubsub``: every listener's subscription drops
events-off      ``CONFIG SET notify-keyspace-events ""``, back to ``Ex`` 3 s later
restart         ``SHUTDOWN`` (the AOF is written), Redis down 1 s while timers come due,
                started again on the same port with the same data; listeners left alone
pause           ``CLIENT PAUSE 3000`` (all clients); these listeners get ``--lease 5``: a
                lease must outlast any stall of Redis, or runs are taken over
pause-over-     (only when named) the same pause with ``--lease 2``: measures what
lease           happens when a stall outlasts the lease (second runs: the check fails)
tiny-buffer     ``client-output-buffer-limit pubsub 1kb 512 1``, then a burst of 1,000 timers
                and 2,000 other keys expiring at once: the server drops the subscriptions;
                then the limit is restored
sigterm         SIGTERM to one listener during a burst with slow tasks running
                (``--shutdown-timeout 1``): unfinished runs are handed back; a new listener
                takes its place
sigstop         SIGSTOP one of the two listeners while slow tasks run on it, for twice its
                lease, then SIGCONT: only the runs it was in may run twice (fencing)
oom             ``noeviction`` at ``maxmemory``, kept full 5 s while tasks longer than the
                lease run; then the filler keys are deleted
evict-volatile  ``volatile-lru`` at ``maxmemory``: the expiring timer keys are evicted, the
                sweeper must still fire every timer
poison          a task that ``os._exit(1)``s under ``--processes 2``: recorded dead after at
                most 3 runs (not lost), the supervisor keeps going
blocked-loop    ``async def`` tasks that ``time.sleep`` past the lease on the event loop
supervisor-     ``kill -9`` of a ``--processes 2`` supervisor next to a plain listener: its
kill9           children must exit, their runs run again on the other listener
==============  ============================================================================

Every run of a task appends ``S id pid time`` as it starts and ``E id pid time`` when it
returns to a ledger file (``O_APPEND``; Redis faults cannot touch it). From the ledger:

- **fired**: timers with a completed run; **lost**: timers without one.
- **duplicate runs**: starts beyond the first. One is *expected* only when the run before it
  was cut short by a signal this script sent, or a process death the fault caused (a
  poison task's ``os._exit``, a killed supervisor's children): it started in that process
  before and did not end before it (for SIGKILL and deaths: did not end more than 0.5 s
  before, the time a listener takes to write a finished run; for SIGTERM: did not end
  within the shutdown timeout, so it was handed back). Any other duplicate is a failure;
  ``oom``, ``evict-volatile`` and ``blocked-loop`` explain none.
- **lateness**: first start minus due time (both on this machine's clock).
- **back to normal**: after the fault the listeners are subscribed again by themselves,
  expired events reach them again (a probe key in the timers namespace that names no task
  expires and is recorded as rejected), and a final batch of timers, scheduled after the
  fault, fires on time (every one within ``ON_TIME_MS``).

With ``--keys N`` the main batch's timers go round N concurrency keys of limit 1
(``schedule(..., key=…)``): each fault then also checks, from the ledger, that no key ever
ran two of them at once (a run a fault cut short lasts until its process could no longer
run it; a run a stopped listener was in, which goes on when it resumes, is left out: the
listener counts it as a late finish).

It exits 1 if any fault lost a timer, ran one twice unexpectedly, did not come back to
normal, or found what the fault checks besides (a poison not recorded dead or run more than
3 times, orphans of a killed supervisor, ``stats`` failing under OOM). Each fault ends within
a deadline whatever the listeners do.

Modules: :mod:`~bench.faults.ledger` (what the ledger says), :mod:`~bench.faults.processes`
(listener processes, waiting), :mod:`~bench.faults.scenario` (one fault's run),
:mod:`~bench.faults.classic` and :mod:`~bench.faults.hostile` (the faults),
:mod:`~bench.faults.run` (running them, the command line), :mod:`~bench.faults.report`
(the table). The tests do not import the bench: ``tests/integration/test_faults.py`` runs
small versions of some faults on its own harness (``tests/integration/faults.py``).
"""

from bench.faults.classic import expire_together, subscription_losses
from bench.faults.ledger import (
    Mark,
    RunRecord,
    Signal,
    Verdict,
    analyse,
    completed,
    open_runs,
    read_ledger,
    runs_by_timer,
)
from bench.faults.processes import FaultError, ListenerProcess, subscribers, wait_for
from bench.faults.scenario import (
    ON_TIME_MS,
    Fault,
    Plan,
    Result,
    Scenario,
    final_batch,
    main_batch,
)

__all__ = [
    "ON_TIME_MS", "Fault", "FaultError", "ListenerProcess", "Mark", "Plan", "Result",
    "RunRecord", "Scenario", "Signal", "Verdict", "analyse", "completed",
    "expire_together", "final_batch", "main_batch", "open_runs",
    "read_ledger", "runs_by_timer", "subscribers", "subscription_losses", "wait_for",
]
