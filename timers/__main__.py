"""``python -m timers``: the same as the ``timers`` command."""

from timers.listener.loader import working_directory_last

working_directory_last()  # PYTHONPATH wins over the working directory, as for `timers`

from timers.cli import main  # noqa: E402

main()
