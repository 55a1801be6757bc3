"""Reminders sent a while after something a user did (or did not) do."""

from __future__ import annotations

import logging

from timers import task

log = logging.getLogger(__name__)


def sms(user_id: int, text: str = "You left something in your basket.") -> None:
    """Send a reminder SMS (here: log what would be sent)."""
    log.info("SMS to user %s: %s", user_id, text)


def email(user_id: int, subject: str, body: str = "") -> None:
    """Send a reminder email (here: log it)."""
    log.info("email to user %s: %s", user_id, subject)


@task(retries=3, backoff=[30, 300, 3600], timeout=20, max_lateness=3600)
def morning_digest(user_id: int) -> None:
    """Send a user's morning digest (here: log it); the retries example of docs/guides/tasks.md."""
    log.info("morning digest for user %s", user_id)
