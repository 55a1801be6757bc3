"""The dashboard's pages and actions (Starlette). Every figure is read through
:class:`timers.Timers` and :mod:`timers.observe`; every page escapes what it shows."""

from __future__ import annotations

import asyncio
import json
from collections import deque
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

from timers.client import Timers
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
from timers.observe import browse
from timers.observe.snapshot import SOON_MS, FleetSnapshot
from timers.web.auth import COOKIE, NOTE_COOKIE, Guard, LoginGate, refused
from timers.web.reads import ACTIONS, TimerView, dead_timers
from timers.web.security import LOCAL_HOSTS, SecurityHeaders

PAGE = 50
MAX_PAGE = 10**9
HISTORY = 120
"""Snapshots kept for the overview's curves (one per refresh of any open page)."""


def _templates() -> Jinja2Templates:
    folder = str(resources.files("timers.web").joinpath("templates"))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), autoescape=True)
    env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False, indent=1)
    env.filters["when"] = lambda dt: "-" if dt is None else dt.astimezone(UTC).strftime(
        "%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    return Jinja2Templates(env=env)


class Dashboard:
    """One keyspace's dashboard: the client it reads with and who may act."""

    def __init__(self, timers: Timers, guard: Guard) -> None:
        self.timers, self.guard = timers, guard
        self.templates = _templates()
        self.history: deque[tuple[int, int, float | None, float | None]] = deque(
            maxlen=HISTORY)

    def snapshot(self) -> FleetSnapshot:
        snap = self.timers.run(self.timers.ops.snapshot())
        late = [(x.get("lateness_p50_ms"), x.get("lateness_p99_ms")) for x in snap.listeners]
        p50 = max((a for a, _ in late if a is not None), default=None)
        p99 = max((b for _, b in late if b is not None), default=None)
        self.history.append((snap.redis_ms, snap.counters.get("fired", 0), p50, p99))
        return snap

    def fired_per_minute(self) -> float | None:
        if len(self.history) < 2 or self.history[-1][0] <= self.history[0][0]:
            return None
        (t0, f0, *_), (t1, f1, *_) = self.history[0], self.history[-1]
        return (f1 - f0) * 60_000 / (t1 - t0)

    def curve(self, at: int) -> str:
        """SVG polyline points of history column ``at`` (2: p50, 3: p99), 300x60."""
        values = [row[at] for row in self.history]
        known = [v for v in values if v is not None]
        if len(known) < 2:
            return ""
        top = max(max(known), 1e-9)
        step = 300 / max(len(values) - 1, 1)
        return " ".join(f"{i * step:.1f},{60 - 58 * v / top:.1f}"
                        for i, v in enumerate(values) if v is not None)

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


def _overview_context(d: Dashboard) -> dict[str, Any]:
    snap = d.snapshot()
    now = snap.redis_ms
    return {"snap": snap, "soon": [snap.due_within(w) for w in SOON_MS],
            "per_minute": d.fired_per_minute(), "p50": d.curve(2), "p99": d.curve(3),
            "latest": d.history[-1] if d.history else None,
            "listeners": [{**x, "age": _age(now, x)} for x in snap.listeners]}


def _age(now_ms: int, listener: dict[str, Any]) -> str:
    beat = listener.get("heartbeat_ms")
    return "-" if not isinstance(beat, int | float) else f"{max(now_ms - beat, 0) / 1000:.0f} s"


def routes(d: Dashboard) -> list[Route]:
    async def overview(request: Request) -> Response:
        return d.page(request, "overview.html", **await run_in_threadpool(_overview_context, d))

    async def live(request: Request) -> Response:
        return d.page(request, "_live.html", **await run_in_threadpool(_overview_context, d))

    async def timers_page(request: Request) -> Response:
        offset = (_page_number(request) - 1) * PAGE
        return d.page(request, "timers.html",
                      **await run_in_threadpool(_list_context, d, request.query_params,
                                                offset))

    async def timer(request: Request) -> Response:
        view = await run_in_threadpool(TimerView.read, d.timers,
                                       request.query_params.get("id", ""))
        return d.page(request, "timer.html", status_code=200 if view and view.timer else 404,
                      view=view)

    async def dead(request: Request) -> Response:
        return d.page(request, "dead.html",
                      failures=await run_in_threadpool(dead_timers, d.timers, PAGE))

    async def recurrences(request: Request) -> Response:
        return d.page(request, "recurrences.html",
                      recurrences=await run_in_threadpool(d.timers.recurrences))

    return [Route("/", overview), Route("/live", live), Route("/timers", timers_page),
            Route("/timer", timer), Route("/dead", dead), Route("/recurrences", recurrences),
            *action_routes(d)]


def _page_number(request: Request) -> int:
    """The ``page`` asked for (1 if none); 400 for anything but a whole number from 1."""
    text = request.query_params.get("page", "1")
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_PAGE):
        raise HTTPException(400, f"page must be a whole number from 1 to {MAX_PAGE:,}")
    return int(text)


def _list_context(d: Dashboard, query: Any, offset: int) -> dict[str, Any]:
    prefix, task = query.get("q", "").strip(), query.get("task", "").strip()
    complete = True
    if prefix:
        found, complete = d.timers.run(d.timers.ops.search_id_prefix(prefix, PAGE))
    elif task:
        found = d.timers.run(d.timers.ops.filter_task(task, PAGE))
    else:
        found = d.timers.run(d.timers.ops.browse_page(offset, PAGE))
    return {"found": found, "q": prefix, "task": task, "complete": complete,
            "page_no": offset // PAGE + 1, "more": len(found) == PAGE and not (prefix or task),
            "now": datetime.now(UTC), "window": browse.FILTER_WINDOW}


def action_routes(d: Dashboard) -> list[Route]:
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
        if request.method == "GET":
            return d.page(request, "login.html", failed=False)
        form = await request.form()
        cookie = d.guard.cookie_for(str(form.get("token", "")))
        if cookie is None:
            await asyncio.sleep(0.2)  # a wrong token costs the guesser
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
    dashboard = Dashboard(timers, guard or Guard())
    read = metrics or (lambda: timers.run(timers.ops.snapshot()))
    return Starlette(
        routes=routes(dashboard) + metrics_route(read),
        middleware=[Middleware(SecurityHeaders),
                    Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts),
                               www_redirect=False),
                    Middleware(AuthenticationMiddleware, backend=LoginGate(dashboard.guard),
                               on_error=refused)],
        exception_handlers={kind: _error for kind, _, _ in ERRORS})
