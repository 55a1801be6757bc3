"""The ``timers`` command line: parse, call the library, print.

``app`` (the commands, :mod:`timers.cli.app`), ``cron`` and ``failed`` (their command
groups), ``server`` (``timers server``), ``common`` (shared options and one-line errors)
and ``errors`` (how the command ends: exit 2 for usage errors, 1 for the rest).
"""

from timers.cli.app import app, main

__all__ = ["app", "main"]
