"""Orders that must be paid within a time limit."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def expire_unpaid(order_id: str) -> None:
    """Cancel an order that is still unpaid when its payment window closes.

    An ``async def`` task: it runs on the listener's event loop, not in a thread.
    """
    await asyncio.sleep(0)  # stands in for an async database call
    log.info("order %s: payment window closed; cancelled if still unpaid", order_id)
