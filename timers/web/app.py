"""The dashboard's pages and actions (Starlette). Every figure is read through
:class:`timers.Timers` and :mod:`timers.observe`; every page escapes what it shows."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from timers.client import Timers
from timers.exceptions import TimersError
from timers.observe import browse
from timers.observe.snapshot import SOON_MS, FleetSnapshot
from timers.web.auth import COOKIE, Guard
from timers.web.reads import ACTIONS, TimerView, dead_timers

PAGE = 50
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

    def page(self, request: Request, name: str, **context: Any) -> Response:
        logged_in = self.guard.logged_in(request.cookies.get(COOKIE))
        return self.templates.TemplateResponse(request, name, {
            "can_act": self.guard.actions_allowed and logged_in, "guard": self.guard,
            "logged_in": logged_in, "prefix": self.timers.keys.prefix, **context})


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
        return d.page(request, "timers.html",
                      **await run_in_threadpool(_list_context, d, request.query_params))

    async def timer(request: Request) -> Response:
        view = await run_in_threadpool(TimerView.read, d.timers,
                                       request.query_params.get("id", ""))
        return d.page(request, "timer.html", view=view, status_code=200 if view else 404)

    async def dead(request: Request) -> Response:
        return d.page(request, "dead.html",
                      failures=await run_in_threadpool(dead_timers, d.timers, PAGE))

    async def recurrences(request: Request) -> Response:
        return d.page(request, "recurrences.html",
                      recurrences=await run_in_threadpool(d.timers.recurrences))

    return [Route("/", overview), Route("/live", live), Route("/timers", timers_page),
            Route("/timer", timer), Route("/dead", dead), Route("/recurrences", recurrences),
            *action_routes(d)]


def _list_context(d: Dashboard, query: Any) -> dict[str, Any]:
    prefix, task = query.get("q", "").strip(), query.get("task", "").strip()
    offset = max(int(query.get("page", "1")) - 1, 0) * PAGE if query.get(
        "page", "1").isdigit() else 0
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
            return HTMLResponse(f"<p>refused: {_escape(refusal or '')}</p>", status_code=403)
        back = await run_in_threadpool(action, d.timers, fields)
        return RedirectResponse(back, status_code=303)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return d.page(request, "login.html", failed=False)
        form = await request.form()
        cookie = d.guard.cookie_for(str(form.get("token", "")))
        if cookie is None:
            await asyncio.sleep(0.2)  # a wrong token costs the guesser
            return d.page(request, "login.html", failed=True, status_code=403)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict")
        return response

    return [Route("/act", act, methods=["POST"]), Route("/login", login,
                                                        methods=["GET", "POST"])]


def _escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def metrics_route(d: Dashboard) -> list[Route]:
    """``/metrics``: the keyspace's Prometheus metrics, as ``timers metrics`` serves them
    (when prometheus_client is installed: ``redis-timers[metrics]``)."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        from timers.observe.fleet_metrics import FleetCollector
    except ImportError:
        return []
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: d.timers.run(d.timers.ops.snapshot())))

    async def metrics(request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return [Route("/metrics", metrics)]


def create_app(timers: Timers, guard: Guard | None = None) -> Starlette:
    """The dashboard of ``timers``'s keyspace as an ASGI app (and its ``/metrics``)."""
    dashboard = Dashboard(timers, guard or Guard())

    async def unavailable(request: Request, exc: Exception) -> Response:
        return HTMLResponse(f"<p>Redis did not answer: {_escape(str(exc))}. This page "
                            f"works again once it does.</p>", status_code=503)

    return Starlette(routes=routes(dashboard) + metrics_route(dashboard),
                     exception_handlers={TimersError: unavailable})
