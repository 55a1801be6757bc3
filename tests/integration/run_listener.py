"""Run a :class:`timers.Listener` in this process until SIGTERM or SIGINT.

``python tests/integration/run_listener.py URL TASKS CONCURRENCY LEASE``

The crash tests kill this process with SIGKILL mid-task. It builds the listener directly
rather than through ``timers listen``, so that what they test is the listener's recovery
and not the command line.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from timers import Listener


async def main(url: str, tasks: str, concurrency: int, lease: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listener = Listener(url, tasks=tasks, concurrency=concurrency, lease=lease)
    await listener.run(stop)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    url, tasks, concurrency, lease = sys.argv[1:5]
    asyncio.run(main(url, tasks, int(concurrency), float(lease)))
