"""``python -m timers``: the same as the ``timers`` command."""

from timers.cli import main

main()
