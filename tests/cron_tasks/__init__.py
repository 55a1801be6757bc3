"""Tasks for the recurring-timer integration tests (``tests.cron_tasks.jobs.<function>``).

Each writes to the Redis server named by ``$TIMERS_TEST_URL`` (set by the integration
fixtures), so a test sees every run whether it happened in a thread of the test process or
in a listener subprocess:

- ``cron:runs``     list: ``[tag, started, ended]`` (epoch seconds) as each run returns
- ``cron:started``  list: the tag of every run of :func:`jobs.hold` as it starts
- ``cron:release``  a key a test sets to let :func:`jobs.hold` return

The tests flush the database before each test, so these start empty.
"""

from __future__ import annotations

RUNS = "cron:runs"
STARTED = "cron:started"
RELEASE = "cron:release"
