"""``timers listen --metrics-port``: a listener's Prometheus metrics, served by the listener
itself, or under ``--processes N`` by the supervisor for all its children on one port."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from typing import TYPE_CHECKING, Annotated, Any

import typer

from timers.exceptions import UserError
from timers.listener.supervision.orphans import supervisor_pid
from timers.observe.serving import http_url

if TYPE_CHECKING:
    from timers.listener import Listener
    from timers.listener.supervision.supervisor import Supervisor

log = logging.getLogger("timers.metrics")

MetricsPortOption = Annotated[int | None, typer.Option(
    "--metrics-port", min=1, max=65535, metavar="PORT", show_default=False,
    help="Serve Prometheus metrics on this port (off by default). With --processes, the "
         "supervisor serves every child's on it.")]
MetricsHostOption = Annotated[str, typer.Option(
    "--metrics-host", metavar="ADDRESS",
    help="Address the metrics port binds to (0.0.0.0 for every interface).")]

_shared_dirs: list[tempfile.TemporaryDirectory[str]] = []


def _metrics_module() -> Any:
    try:
        from timers.observe import listener_metrics
    except ImportError:
        raise UserError("--metrics-port needs prometheus_client: pip install "
                        "'redis-timers[metrics]'") from None
    return listener_metrics


def serve_for_children(supervisor: Supervisor, port: int | None, host: str) -> None:
    """In the supervisor, before it starts children: one port for all of them."""
    if port is None:
        return
    module = _metrics_module()
    shared = tempfile.TemporaryDirectory(prefix="timers-metrics-")
    _shared_dirs.append(shared)  # kept (and removed at exit) with the supervisor
    module.share_with_children(shared.name)
    _serve(module.serve_children, port, host)
    supervisor.child_exited = module.child_died


def record(listener: Listener, port: int | None, host: str) -> Any:
    """In a listener process: record its metrics (and serve them, unless a supervisor
    does). Returns what :func:`sample` takes, or None without ``--metrics-port``."""
    if port is None:
        return None
    module = _metrics_module()
    metrics = module.ListenerMetrics()
    listener.tally.observers.append(metrics)
    if supervisor_pid() is None:
        _serve(module.serve, port, host)
    return metrics


def _serve(serve: Any, port: int, host: str) -> None:
    """Serve now, before the listener connects (so even while Redis is away), and log
    where; a port that cannot be served is one line (exit 1)."""
    try:
        serve(port, host)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") \
            from None
    log.info("serving metrics at %s/metrics", http_url(host, port))


def sample(metrics: Any, listener: Listener, stopping: asyncio.Event) -> asyncio.Task[None]:
    """Keep the listener's gauges (running, free slots, loop lag) up to date."""
    return asyncio.create_task(metrics.sample(lambda: listener.load()[0],
                                              lambda: listener.load()[1], stopping))
