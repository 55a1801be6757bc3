"""Tasks of the rolling upgrade test (``tests/integration/test_rolling_upgrade.py``), run by
listeners of this release and of the last one on one prefix (``--tasks
tests.upgrade_tasks``: task paths ``jobs.<function>``).

They use only what both releases have (``timers.task`` with ``concurrency=`` and
``rate=``), and note each run in the file named by ``$TIMERS_UPGRADE_LEDGER``, one
``write`` per line on an ``O_APPEND`` descriptor (lines from several processes never
interleave)::

    <kind> <tag> <timers version> <pid> <start ns> <end ns>

with the start and end of the run on ``time.monotonic_ns()`` (one clock for every process
of the machine). :mod:`tests.upgrade_producer` schedules them from either release.
"""
