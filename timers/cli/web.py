"""``timers web``: serve the dashboard (parse and print only: :mod:`timers.web` builds it)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from timers.cli.common import PrefixOption, UrlOption, UserError, friendly, open_timers
from timers.keys import DEFAULT_PREFIX

TOKEN_ENV = "TIMERS_WEB_TOKEN"
PortOption = Annotated[int, typer.Option("--port", min=1, max=65535, metavar="PORT",
                                         help="Port to serve the dashboard on.")]
HostOption = Annotated[str, typer.Option(
    "--host", metavar="ADDRESS",
    help="Address to bind. The default serves this machine only; 0.0.0.0 serves every "
         "interface (then put it behind TLS).")]
AuthOption = Annotated[str | None, typer.Option(
    "--auth", metavar="TOKEN", show_default=False,
    help=f"Token that unlocks actions (cancel, reschedule, retry, purge, pause), entered on "
         f"the login page; default ${TOKEN_ENV}. Without one the dashboard only shows.")]
ReadOnlyOption = Annotated[bool, typer.Option(
    "--read-only", help="Show only: no action buttons, every action refused.")]


def _web() -> tuple[Any, Any, Any]:
    try:
        import uvicorn

        from timers.web.app import create_app
        from timers.web.auth import Guard
    except ImportError:
        raise UserError("timers web needs Starlette, uvicorn and Jinja2: pip install "
                        "'redis-timers[web]'") from None
    return uvicorn, create_app, Guard


def web(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX,
        port: PortOption = 8080, host: HostOption = "127.0.0.1", auth: AuthOption = None,
        read_only: ReadOnlyOption = False) -> None:
    """Serve a dashboard of the keyspace: overview, pending timers, a timer's page with
    cancel / reschedule / run now, dead timers with retry and purge, recurrences."""
    uvicorn, create_app, guard_class = _web()
    token = auth or os.environ.get(TOKEN_ENV) or None
    with open_timers(url, prefix) as t:
        t.stats()  # a bad URL or a server away: say so now, not on the first page
        app = create_app(t, guard_class(token=token, read_only=read_only))
        mode = "read-only" if read_only or token is None else "actions need the token"
        typer.echo(f"dashboard of prefix {t.keys.prefix!r} on http://{host}:{port}/ ({mode}; "
                   f"Ctrl-C stops)")
        try:
            uvicorn.run(app, host=host, port=port, log_level="warning")
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def register(app: typer.Typer) -> None:
    """Add ``timers web`` to the command line."""
    app.command("web")(friendly(web))
