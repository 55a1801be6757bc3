"""The dashboard's routes, actions and middleware (Starlette). What each page reads is in
:mod:`timers.web.pages`; every page escapes what it shows."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from timers.exceptions import (
    InvalidTimer,
    MalformedTimerKey,
    ServerError,
    ServerOutOfMemory,
    ServerTimeout,
    ServerUnavailable,
    TimerAlreadyPending,
    TimersError,
)
from timers.ops.snapshot import FleetSnapshot
from timers.producer.client import Timers
from timers.web import pages
from timers.web.auth import (
    COOKIE,
    NOTE_COOKIE,
    Guard,
    LoginGate,
    client_of,
    refused,
    too_many,
)
from timers.web.reads import ACTIONS, TimerView
from timers.web.security import LOCAL_HOSTS, SecurityHeaders


def _templates() -> Jinja2Templates:
    folder = str(resources.files("timers.web").joinpath("templates"))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), autoescape=True)
    env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False, indent=1)
    env.filters["when"] = _when
    env.filters["epoch"] = lambda s: "-" if s is None else _when(
        datetime.fromtimestamp(s, UTC))
    env.filters["ms"] = lambda v: "-" if v is None else f"{v:,.1f} ms"
    env.filters["args"] = pages.args_text
    env.filters["count"] = lambda n: f"{n:,}"
    return Jinja2Templates(env=env)


def _when(dt: datetime | None) -> str:
    return "-" if dt is None else dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


class Site:
    """The dashboard's pages: the reads (:class:`timers.web.pages.Dashboard`), who may
    act, and the templates."""

    def __init__(self, timers: Timers, guard: Guard) -> None:
        self.timers, self.guard = timers, guard
        self.reads = pages.Dashboard(timers)
        self.templates = _templates()

    def page(self, request: Request, name: str, status_code: int = 200,
             **context: Any) -> Response:
        """Page ``name`` rendered with ``context``, answered with ``status_code``. A whole
        page (not the overview's ``/live`` part) shows the notice an action left in its
        signed cookie, once."""
        logged_in = self.guard.logged_in(request.cookies.get(COOKIE))
        whole = not name.startswith("_")
        said = self.guard.note(request.cookies.get(NOTE_COOKIE)) if whole else None
        response = self.templates.TemplateResponse(request, name, {
            "can_act": self.guard.actions_allowed and logged_in, "guard": self.guard,
            "logged_in": logged_in, "prefix": self.timers.keys.prefix, "said": said,
            "nonce": request.state.csp_nonce, **context}, status_code=status_code)
        if whole and NOTE_COOKIE in request.cookies:
            response.delete_cookie(NOTE_COOKIE, httponly=True, samesite="strict")
        return response


def _read(reader: Callable[..., dict[str, Any]], *args: Any) -> Any:
    """``reader``'s context, a bad query parameter answered 400 saying what it must be, a
    task nothing knows 404."""
    try:
        return reader(*args)
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        if isinstance(exc, MalformedTimerKey | InvalidTimer):
            raise
        raise HTTPException(400, str(exc)) from None


def routes(d: Site) -> list[Route]:
    def page(template: str, reader: Callable[..., dict[str, Any]], with_query: bool = True
             ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            args = (d.reads, request.query_params) if with_query else (d.reads,)
            return d.page(request, template, **await run_in_threadpool(_read, reader, *args))
        return endpoint

    async def timer(request: Request) -> Response:
        view = await run_in_threadpool(TimerView.read, d.timers,
                                       request.query_params.get("id", ""))
        return d.page(request, "timer.html", status_code=200 if view and view.known else 404,
                      view=view)

    async def dead(request: Request) -> Response:
        return d.page(request, "dead.html",
                      failures=await run_in_threadpool(d.timers.failed, pages.PAGE))

    return [Route("/", page("overview.html", pages.overview, False)),
            Route("/live", page("_live.html", pages.overview, False)),
            Route("/timers", page("timers.html", pages.pending)),
            Route("/task", page("task.html", pages.task_page)),
            Route("/history", page("history.html", pages.history_page)),
            Route("/timer", timer), Route("/dead", dead),
            Route("/recurrences", page("recurrences.html", pages.recurrences, False)),
            *action_routes(d)]


def action_routes(d: Site) -> list[Route]:
    async def act(request: Request) -> Response:
        form = await request.form()
        fields = {k: str(v) for k, v in form.items()}
        refusal = d.guard.refusal(request.cookies.get(COOKIE), fields.get("csrf"))
        action = ACTIONS.get(fields.get("action", ""))
        if refusal is None and action is None:
            refusal = f"unknown action {fields.get('action', '')!r}"
        if refusal is not None or action is None:
            return PlainTextResponse(f"refused: {refusal}", status_code=403)
        back = await run_in_threadpool(action, d.timers, fields)
        response = RedirectResponse(back.path, status_code=303)
        response.set_cookie(NOTE_COOKIE, d.guard.note_cookie(back.said), httponly=True,
                            samesite="strict")
        return response

    async def login(request: Request) -> Response:
        code = request.query_params.get("code") if request.method == "GET" else None
        if request.method == "GET" and code is None:
            return d.page(request, "login.html", failed=False)
        client = client_of(request)
        if (wait := d.guard.wait_s(client)) > 0:  # its token is not looked at
            return too_many(wait)
        if code is not None:  # the one-time link timers web printed
            cookie = d.guard.cookie_for_code(code, client)
        else:
            form = await request.form()
            cookie = d.guard.cookie_for(str(form.get("token", "")), client)
        if cookie is None:
            return d.page(request, "login.html", status_code=403, failed=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict")
        return response

    return [Route("/act", act, methods=["POST"]), Route("/login", login,
                                                        methods=["GET", "POST"])]


def metrics_route(read: Callable[[], FleetSnapshot]) -> list[Route]:
    """``/metrics``: the keyspace's Prometheus metrics, as ``timers metrics`` serves them
    (when prometheus_client is installed: ``redis-timers[metrics]``), each scrape a
    ``read``."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        from timers.observe.fleet_metrics import FleetCollector
    except ImportError:
        return []
    registry = CollectorRegistry()
    registry.register(FleetCollector(read))

    async def metrics(request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return [Route("/metrics", metrics)]


ERRORS: list[tuple[type[Exception], int, str]] = [
    (ServerTimeout, 503, "Redis did not answer in time"),
    (ServerOutOfMemory, 503, "Redis is out of memory"),
    (ServerUnavailable, 503, "Redis cannot be reached"),
    (ServerError, 502, "Redis answered with an error"),
    (TimerAlreadyPending, 409, "already pending"),
    (InvalidTimer, 400, "bad input"),
    (MalformedTimerKey, 400, "bad input"),
    (ValueError, 400, "bad input"),
    (TimersError, 500, "timers failed"),
]
"""Each error the pages can meet, its status and what it is, most specific first."""


async def _error(request: Request, exc: Exception) -> Response:
    """One line saying what went wrong (a Redis outage clears itself: say so)."""
    for kind, status, what in ERRORS:
        if isinstance(exc, kind):
            again = (" This page works again once Redis answers."
                     if isinstance(exc, ServerUnavailable) else "")
            return PlainTextResponse(f"{what}: {str(exc).rstrip('.')}.{again}",
                                     status_code=status)
    raise exc  # (not registered for anything else)


def create_app(timers: Timers, guard: Guard | None = None, *,
               hosts: Sequence[str] = LOCAL_HOSTS,
               metrics: Callable[[], FleetSnapshot] | None = None) -> Starlette:
    """The dashboard of ``timers``'s keyspace as an ASGI app (and its ``/metrics``).

    ``hosts``: the ``Host`` names it answers to (others get 400), see
    :func:`timers.web.security.allowed_hosts`. ``metrics``: what a scrape of ``/metrics``
    reads (default: a snapshot through ``timers``; ``timers web`` gives one with short
    timeouts, :class:`timers.observe.fleet_metrics.KeyspaceReader`)."""
    site = Site(timers, guard or Guard())
    read = metrics or (lambda: timers.run(timers.ops.snapshot()))

    return Starlette(
        routes=routes(site) + metrics_route(read),
        middleware=[Middleware(SecurityHeaders),
                    Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts),
                               www_redirect=False),
                    Middleware(AuthenticationMiddleware, backend=LoginGate(site.guard),
                               on_error=refused)],
        exception_handlers={kind: _error for kind, _, _ in ERRORS})
