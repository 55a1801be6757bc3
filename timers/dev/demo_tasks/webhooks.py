"""Webhook deliveries retried later."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def retry_delivery(url: str, payload: dict[str, object], attempt: int = 1) -> None:
    """Deliver a webhook again (here: log it)."""
    log.info("webhook attempt %d to %s: %s", attempt, url, payload)
