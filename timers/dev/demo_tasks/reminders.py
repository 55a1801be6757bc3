"""Reminders sent a while after something a user did (or did not) do."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def sms(user_id: int, text: str = "You left something in your basket.") -> None:
    """Send a reminder SMS (here: log what would be sent)."""
    log.info("SMS to user %s: %s", user_id, text)


def email(user_id: int, subject: str, body: str = "") -> None:
    """Send a reminder email (here: log it)."""
    log.info("email to user %s: %s", user_id, subject)
