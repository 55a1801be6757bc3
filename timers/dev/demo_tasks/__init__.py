"""The demo's tasks, shipped with timers so ``timers demo`` runs from any directory (and
after a plain ``pip install``). A task path is relative to this package:
``"reminders.sms"`` runs :func:`timers.dev.demo_tasks.reminders.sms`. The repository's own
``tasks/`` package holds the same examples, for the commands of the README and of
docs/getting-started.md."""
