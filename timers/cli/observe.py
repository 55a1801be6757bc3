"""``timers metrics``: the keyspace's state as Prometheus metrics, one scrape target for
the whole fleet (parse and print only: :mod:`timers.observe` reads and serves)."""

from __future__ import annotations

import threading
from typing import Annotated, Any

import typer

from timers.cli.common import PrefixOption, UrlOption, UserError, friendly, open_timers
from timers.keys import DEFAULT_PREFIX
from timers.redact import safe_url

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
    metrics, read from Redis at each scrape, until Ctrl-C."""
    module = _fleet_metrics()
    with open_timers(url, prefix) as t:
        t.run(t.ops.snapshot())  # a bad URL or a server away: say so now, not per scrape
        try:
            module.serve(lambda: t.run(t.ops.snapshot()), port, host)
        except OSError as exc:
            raise UserError(f"cannot serve metrics on {host}:{port}: "
                            f"{exc.strerror or exc}") from None
        typer.echo(f"serving the metrics of prefix {t.keys.prefix!r} on "
                   f"{safe_url(url or '') or 'the configured server'} at "
                   f"http://{host}:{port}/metrics (Ctrl-C stops)")
        threading.Event().wait()


def register(app: typer.Typer) -> None:
    """Add these commands to the ``timers`` command line."""
    app.command("metrics")(friendly(metrics))
