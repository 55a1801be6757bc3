"""``timers web``: serve the dashboard (parse and print only: :mod:`timers.web` builds it)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from timers.cli.common import PrefixOption, UrlOption, friendly, open_timers
from timers.exceptions import UserError
from timers.model.keys import DEFAULT_PREFIX
from timers.observe.serving import http_url, listening_socket

TOKEN_ENV = "TIMERS_WEB_TOKEN"
PortOption = Annotated[int, typer.Option("--port", min=1, max=65535, metavar="PORT",
                                         help="Port to serve the dashboard on.")]
HostOption = Annotated[str, typer.Option(
    "--host", metavar="ADDRESS",
    help="Address to bind. The default serves this machine only; 0.0.0.0 serves every "
         "interface (then put it behind TLS).")]
AuthOption = Annotated[str | None, typer.Option(
    "--auth", metavar="TOKEN", show_default=False,
    help=f"Token every page needs (entered once on the login page, or log in with the "
         f"one-time link printed at start; /metrics takes "
         f"Authorization: Bearer TOKEN) and that unlocks actions (cancel, reschedule, "
         f"retry, purge, pause); default ${TOKEN_ENV}. Without one the dashboard only "
         f"shows, to anyone who reaches it.")]
ReadOnlyOption = Annotated[bool, typer.Option(
    "--read-only", help="Show only: no action buttons, every action refused.")]
AllowHostOption = Annotated[list[str] | None, typer.Option(
    "--allow-host", metavar="NAME", show_default=False,
    help="Also answer requests whose Host is NAME (repeatable; *.example.com for every "
         "subdomain). By default only localhost, 127.0.0.1, [::1] and the --host address: "
         "a page elsewhere cannot reach the dashboard by DNS rebinding.")]


def _web() -> tuple[Any, Any, Any, Any]:
    try:
        import uvicorn

        from timers.web.app import create_app
        from timers.web.auth import Guard
        from timers.web.security import allowed_hosts
    except ImportError:
        raise UserError("timers web needs Starlette, uvicorn and Jinja2: pip install "
                        "'redis-timers[web]'") from None
    return uvicorn, create_app, Guard, allowed_hosts


def _scrape_reader(url: str | None, prefix: str) -> Any:
    """What ``/metrics`` reads with (short timeouts), or None without prometheus_client."""
    try:
        from timers.observe.fleet_metrics import KeyspaceReader
    except ImportError:
        return None
    return KeyspaceReader(url, prefix)


def web(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX,
        port: PortOption = 8080, host: HostOption = "127.0.0.1", auth: AuthOption = None,
        read_only: ReadOnlyOption = False, allow_host: AllowHostOption = None) -> None:
    """Serve a dashboard of the keyspace: overview with charts, pending timers of every
    group, a timer's page with cancel / reschedule / run now, a page per task (its limits
    and what waits on them), run history, dead timers with retry and purge, recurrences."""
    uvicorn, create_app, guard_class, allowed_hosts = _web()
    token = auth or os.environ.get(TOKEN_ENV) or None
    source = "--auth" if auth else f"${TOKEN_ENV}"
    try:
        hosts = allowed_hosts(host, allow_host or ())
    except ValueError as exc:
        raise UserError(f"not a name to answer to: {exc}") from None
    if "*" in hosts:
        typer.echo("warning: --allow-host '*' turns the Host check off: a page on any site "
                   "can read the dashboard through DNS rebinding (name the hosts instead)",
                   err=True)
    with open_timers(url, prefix) as t:
        t.stats()  # a bad URL or a server away: say so now, not on the first page
        guard = guard_class(token=token, read_only=read_only)
        app = create_app(t, guard, hosts=hosts,
                         metrics=_scrape_reader(url, prefix))
        try:
            sock = listening_socket(host, port)
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        mode = ("read-only" if read_only else "read-only (no --auth)" if token is None
                else "pages and actions need the token")
        typer.echo(f"dashboard of prefix {t.keys.prefix!r} on {http_url(host, port)}/ "
                   f"({mode}; answers to Host {', '.join(hosts)}; Ctrl-C stops)")
        if token is not None:
            from timers.web.auth import LOGIN_LINK_S

            typer.echo(login_line(host, port, guard.login_code(), source, LOGIN_LINK_S))
        with sock:
            uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def login_line(host: str, port: int, code: str, source: str, valid_s: float) -> str:
    """How to log in: the one-time link (to this machine's own address when the dashboard
    serves every interface), or the token from ``source`` on the login page."""
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host.strip("[]"), host)
    return (f"log in: open {http_url(local, port)}/login?code={code} (works once, within "
            f"{valid_s / 60:.0f} min), or enter the token from {source} at "
            f"{http_url(local, port)}/login")


def register(app: typer.Typer) -> None:
    """Add ``timers web`` to the command line."""
    app.command("web")(friendly(web))
