"""The ``timers`` command line: parse, call the library, print.

``app`` (the root group, loading each command's module on demand: :mod:`timers.cli.app`),
``listen``, ``produce`` (schedule, reschedule, cancel), ``views``, ``cron`` and ``failed``
(their command groups), ``server`` (``timers server``, ``demo``, ``check``), ``common``
(shared options and one-line errors) and ``errors`` (how the command ends: exit 2 for
usage errors, 1 for the rest).
"""

from timers.cli.app import app, main

__all__ = ["app", "main"]
