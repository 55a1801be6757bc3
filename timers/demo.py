"""``timers demo``: a listener firing real timers, on an embedded server if none is set."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import typer

from timers.client import URL_ENV, Timers
from timers.exceptions import TimersError
from timers.listener import Listener
from timers.percentiles import percentile
from timers.runs import Fired
from timers.server import EmbeddedServer

EXAMPLES: list[tuple[str, list[object] | dict[str, object]]] = [
    ("reminders.sms", {"user_id": 42, "text": "Your basket misses you."}),
    ("orders.expire_unpaid", ["order-1001"]),
    ("webhooks.retry_delivery", {"url": "https://example.com/hook", "payload": {"n": 1}}),
    ("reminders.email", {"user_id": 7, "subject": "Welcome back"}),
]


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[tuple[str, str]]:
    """A URL and the prefix to use: the configured server, else an embedded one."""
    url = url or os.environ.get(URL_ENV)
    if url:
        yield url, "timers-demo"
        return
    with EmbeddedServer() as server:
        typer.echo(f"started an embedded {server.version} on {server.url} "
                   f"(set {URL_ENV} or --url to use your own)")
        yield server.url, "timers"


def _clock(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def run_demo(count: int, url: str | None) -> None:
    sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module("tasks.reminders")
    except ImportError:
        raise TimersError("the demo runs the example tasks in tasks/: run it from the "
                          "timers repository root") from None
    logging.basicConfig(level=logging.INFO, format="           %(name)s: %(message)s")
    logging.getLogger("timers").setLevel(logging.WARNING)
    with _server(url) as (server_url, prefix):
        with Timers(server_url, prefix=prefix) as producer:
            specs = [EXAMPLES[i % len(EXAMPLES)] for i in range(count)]
            for i, (task, args) in enumerate(specs):
                producer.schedule(task, args, in_=1.0 + i * 0.75)
            typer.echo(f"scheduled {count} timers, due over the next "
                       f"{1.0 + (count - 1) * 0.75:.2f} s; listening…")
        lateness = asyncio.run(_listen(server_url, prefix, count))
    typer.echo(f"all {count} fired: lateness p50 {percentile(lateness, 50):.1f} ms, "
               f"max {max(lateness):.1f} ms (task start minus due time, Redis clock)")


async def _listen(url: str, prefix: str, count: int) -> list[float]:
    lateness: list[float] = []
    done = asyncio.Event()

    def show(fired: Fired) -> None:
        lateness.append(fired.lateness_ms)
        if len(lateness) >= count:
            done.set()
        status = "ok" if fired.outcome.ok else f"FAILED {fired.outcome.message}"
        typer.echo(f"{_clock(fired.started_ms)}  fired {fired.task:<24} due "
                   f"{_clock(fired.due_ms)}  {fired.lateness_ms:6.1f} ms late  via "
                   f"{fired.source:<6} {status}")

    listener = Listener(url, prefix=prefix, observer=show, search_path=os.getcwd())
    await listener.run(done)
    return lateness
