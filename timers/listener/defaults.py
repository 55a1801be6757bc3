"""The listener's defaults and the environment variables it reads, in a module of their own
so that ``timers listen --help`` can show them without loading the listener."""

from __future__ import annotations

DEFAULT_LEASE = 15.0
"""Seconds a claimed run is held before another listener may take it over."""
DEFAULT_CONCURRENCY = 32
"""Runs at once in one listener process."""
DEFAULT_FAILURE_RETENTION = 7 * 86400.0
"""Seconds a failure record is kept."""
WAIT_FOR_REDIS = 60.0
"""Seconds ``timers listen`` waits at start for a server that does not answer (a Redis
restarting beside it, a container started before its Redis) before it gives up."""

DEFAULT_PACKAGE = "tasks"
"""The tasks package when neither ``--tasks`` nor ``$TIMERS_TASKS`` names one."""
TASKS_ENV = "TIMERS_TASKS"
"""Names the tasks package (``timers listen --tasks``)."""
SETUP_ENV = "TIMERS_SETUP"
"""``module:function`` called once in each process before the tasks package is imported
(``timers listen --setup``): ``django.setup()``, say. Inherited by every process a
listener starts (supervised children, quarantine processes)."""
