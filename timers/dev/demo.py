"""``timers demo``: a listener firing real timers, on an embedded server if none is set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime

import redis
import typer

from timers.dev.server import EmbeddedServer
from timers.exceptions import TimersError
from timers.listener import Listener
from timers.model.keys import Keyspace
from timers.model.percentiles import percentile
from timers.model.redact import safe_url
from timers.model.runs import Fired
from timers.producer.client import Timers
from timers.store.connect import URL_ENV

DEMO_TASKS = "timers.dev.demo_tasks"

EXAMPLES: list[tuple[str, list[object] | dict[str, object]]] = [
    ("reminders.sms", {"user_id": 42, "text": "Your basket misses you."}),
    ("orders.expire_unpaid", ["order-1001"]),
    ("webhooks.retry_delivery", {"url": "https://example.com/hook", "payload": {"n": 1}}),
    ("reminders.email", {"user_id": 7, "subject": "Welcome back"}),
]


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    """The URL to use: the configured server, else an embedded one."""
    url = url or os.environ.get(URL_ENV)
    if url:
        typer.echo(f"running on {safe_url(url)}")
        yield url
        return
    with EmbeddedServer() as server:
        typer.echo(f"started an embedded {server.version} on {server.url} "
                   f"(set {URL_ENV} or --url to use your own)")
        yield server.url


def demo_keys(client: redis.Redis, keys: Keyspace) -> list[str]:
    """Every key under the prefix ``keys`` names: its system keys (``P|…``, whatever a
    release adds) and its timer keys (``P:…``). A SCAN: the demo's own few keys."""
    found: list[str] = []
    for start in (keys.timer_key_start, f"{keys.prefix}|"):
        pattern = "".join(f"[{c}]" if c in "*?[]\\" else c for c in start) + "*"
        found += [str(k) for k in client.scan_iter(match=pattern, count=1000)]
    return found


@contextlib.contextmanager
def _own_prefix(url: str, prefix: str) -> Iterator[None]:
    """Refuse a prefix that holds keys already; delete the demo's keys when it ends."""
    keys = Keyspace(prefix)
    with redis.Redis.from_url(url, decode_responses=True) as client:
        if demo_keys(client, keys):
            raise TimersError(f"prefix {prefix!r} already holds keys on this server: the demo "
                              f"deletes its keys when done, so give it an unused --prefix")
        try:
            yield
        finally:
            found = demo_keys(client, keys)
            if found:
                client.delete(*found)


def _clock(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def run_demo(count: int, url: str | None, prefix: str = "timers-demo") -> None:
    """Schedule ``count`` timers over a few seconds, fire them, print each, then remove
    every key the demo wrote."""
    logging.basicConfig(level=logging.INFO, format="           %(name)s: %(message)s")
    logging.getLogger("timers").setLevel(logging.WARNING)
    logging.getLogger(DEMO_TASKS).setLevel(logging.INFO)
    with _server(url) as server_url, _own_prefix(server_url, prefix):
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

    listener = Listener(url, prefix=prefix, observer=show, tasks=DEMO_TASKS)
    await listener.run(done)
    return lateness
