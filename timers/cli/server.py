"""``timers server``, ``timers demo`` and ``timers check``: a server to try timers on, the
demo, and whether a server will fire timers reliably."""

from __future__ import annotations

from typing import Annotated

import typer

from timers.cli.common import PrefixOption, UrlOption, friendly, prefix_callback
from timers.model.keys import DEFAULT_PREFIX

DEMO_PREFIX = "timers-demo"
DemoPrefixOption = Annotated[str, typer.Option(
    "--prefix", metavar="PREFIX", callback=prefix_callback,
    help="Key prefix of the demo's timers (an unused one: the demo deletes its keys when "
         "done).")]


def check(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Check that a server will fire timers reliably; exits 1 if it will not."""
    from timers.store.check import inspect_server, verdict

    findings = inspect_server(url, prefix)
    for f in findings:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[f.level]
        typer.echo(f"{mark} {f.name}: {f.value}")
        if f.advice:
            typer.echo(f"     {f.advice}")
    if not verdict(findings):
        typer.echo("timers would not fire reliably on this server", err=True)
        raise typer.Exit(1)


def demo(
    count: Annotated[int, typer.Option("--count", min=1, metavar="N",
                                       help="Timers to schedule.")] = 5,
    url: UrlOption = None,
    prefix: DemoPrefixOption = DEMO_PREFIX,
) -> None:
    """Start a listener (on an embedded Redis unless a URL is configured) and fire timers;
    removes its keys when done."""
    from timers.dev.demo import run_demo

    run_demo(count, url, prefix)


def server(
    port: Annotated[int | None, typer.Option(
        "--port", metavar="PORT", show_default=False,
        help="Port to listen on (127.0.0.1) [default: 6379 if free, else a free one]")] = None,
    data_dir: Annotated[str | None, typer.Option(
        "--data-dir", metavar="DIR", show_default=False,
        help="Keep the server's data (its append-only file) in DIR, made if missing, so "
             "its timers are there at the next start [default: a temporary directory, "
             "removed when it stops]")] = None,
) -> None:
    """Run a Redis server with timers' redis.conf in the foreground, until Ctrl-C."""
    from timers.dev.server import run_foreground

    run_foreground(port, typer.echo, data_dir)


def register(app: typer.Typer) -> None:
    """Add these commands to the ``timers`` command line."""
    app.command("check")(friendly(check))
    app.command("demo")(friendly(demo))
    app.command("server")(friendly(server))
