"""Recurring jobs (see docs/guides/recurrences.md)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def daily(team: str) -> None:
    """Build and send a team's daily report (here: log it)."""
    log.info("daily report for team %s", team)


def cleanup() -> None:
    """Remove expired sessions, stale carts and the like (here: log it)."""
    log.info("cleanup ran")
