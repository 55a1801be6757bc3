"""``timers metrics``: the keyspace's state as Prometheus metrics, one scrape target for
the whole fleet (parse and print only: :mod:`timers.observe` reads and serves)."""

from __future__ import annotations

import threading
from typing import Annotated, Any

import typer

from timers.cli.common import PrefixOption, UrlOption, friendly, one_line
from timers.exceptions import TimersError, UserError
from timers.model.keys import DEFAULT_PREFIX
from timers.model.redact import safe_url
from timers.observe.serving import http_url
from timers.store.connect import configured_url

PortOption = Annotated[int, typer.Option("--port", min=1, max=65535, metavar="PORT",
                                         help="Port to serve /metrics on.")]
HostOption = Annotated[str, typer.Option(
    "--host", metavar="ADDRESS", help="Address to bind (0.0.0.0 for every interface).")]


def _fleet_metrics() -> Any:
    try:
        from timers.observe import fleet_metrics
    except ImportError:
        raise UserError("timers metrics needs prometheus_client: pip install "
                        "'redis-timers[metrics]'") from None
    return fleet_metrics


def metrics(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX,
            port: PortOption = 9465, host: HostOption = "127.0.0.1") -> None:
    """Serve the keyspace's state (pending, overdue, dead, listeners …) as Prometheus
    metrics, read from Redis at each scrape, until Ctrl-C. It starts while Redis is away
    (each scrape then says so: timers_keyspace_readable 0)."""
    module = _fleet_metrics()
    try:
        reader = module.KeyspaceReader(url, prefix)
    except ValueError as exc:
        raise UserError(f"bad Redis URL {safe_url(configured_url(url))!r}: {exc}") from None
    try:
        module.serve(reader, port, host)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: "
                        f"{exc.strerror or exc}") from None
    where = safe_url(configured_url(url))
    typer.echo(f"serving the metrics of prefix {reader.keyspace_prefix or prefix!r} on {where} at "
               f"{http_url(host, port)}/metrics (Ctrl-C stops)")
    try:
        reader()
    except TimersError as exc:
        typer.echo(f"warning: Redis does not answer yet ({one_line(str(exc))}): scrapes "
                   f"report timers_keyspace_readable 0 until it does", err=True)
    threading.Event().wait()


def register(app: typer.Typer) -> None:
    """Add these commands to the ``timers`` command line."""
    app.command("metrics")(friendly(metrics))
