"""``python -m timers``: the same as the ``timers`` command."""

from timers.listener.supervision.orphans import tie_to_supervisor

tie_to_supervisor()  # a supervised child stops with its supervisor from its first moment

from timers.listener.calling.loader import working_directory_last  # noqa: E402

working_directory_last()  # PYTHONPATH wins over the working directory, as for `timers`

from timers.cli import main  # noqa: E402

main()
