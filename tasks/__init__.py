"""Example tasks. A timer's task path is relative to this package:
``"reminders.sms"`` runs :func:`tasks.reminders.sms`."""
