"""What each dashboard page shows, read through :class:`timers.Timers` (its run history
too): one function per page, returning the template's context. Query parameters are
checked here; a bad one is a ValueError whose message never repeats what was sent (the
page answers 400 with it); a task nothing knows is a LookupError (404), so no link can put
words of its own on a page."""

from __future__ import annotations

import json
import re
from collections import deque
from datetime import UTC, datetime
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.cron.definition import RECURRENCE_OPTION, name_from_option
from timers.model.due import format_duration
from timers.model.flow.names import DEFAULT_GROUP
from timers.ops import browse
from timers.ops.snapshot import OVERDUE_AFTER_MS, SOON_MS, FleetSnapshot
from timers.ops.tasks import Limit, Running, TaskFlow
from timers.producer.client import Timers
from timers.web.charts import render
from timers.web.figures import (
    RATE_WINDOW_S,
    Sample,
    lateness_chart,
    per_minute,
    throughput_chart,
)
from timers.web.reads import TimerView

PAGE = 50
MAX_PAGE = browse.MERGE_DEPTH // PAGE
SAMPLE_SPACING_S = 5.0
"""A snapshot read sooner than this after the last sample is not kept as one."""
SAMPLES_KEPT = int(RATE_WINDOW_S / SAMPLE_SPACING_S) + 2
"""Samples kept for the overview's runs and failures per minute: the rate window's at one
per :data:`SAMPLE_SPACING_S`."""
FAILURES_LOOKED_AT = 500
"""Latest failure records a task page looks through for the task's."""
ARGS_SHOWN = 160
"""Characters of a timer's args shown in a list (its own page shows them whole)."""
_TASK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*([.:][A-Za-z_][A-Za-z0-9_]*)*")
_GROUP = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def task_param(query: Any, name: str = "name", required: bool = True) -> str | None:
    """The task named by query parameter ``name``: a dotted path of ASCII names."""
    text = str(query.get(name, "")).strip()
    if not text and not required:
        return None
    if not (len(text) <= 300 and _TASK.fullmatch(text)):
        raise ValueError(f"{name} must be a task path such as reminders.sms (ASCII letters, "
                         f"digits, '_', separated by '.')")
    return text


def group_param(query: Any) -> str | None:
    text = str(query.get("group", ""))
    if not text:
        return None
    if not _GROUP.fullmatch(text):
        raise ValueError("group must be 1 to 64 ASCII letters, digits, '_', '.' or '-'")
    return text


def priority_param(query: Any) -> int | None:
    text = str(query.get("priority", ""))
    if not text:
        return None
    if not (re.fullmatch(r"-?[0-9]{1,4}", text) and -1000 <= int(text) <= 1000):
        raise ValueError("priority must be a whole number from -1000 to 1000")
    return int(text)


def page_param(query: Any) -> int:
    """The ``page`` asked for (1 if none)."""
    text = str(query.get("page", "1"))
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_PAGE):
        raise ValueError(f"page must be a whole number from 1 to {MAX_PAGE:,} (a page "
                         f"reaches the first {browse.MERGE_DEPTH:,} timers: choose a group "
                         f"or search)")
    return int(text)


def failed_param(query: Any) -> bool:
    text = str(query.get("failed", ""))
    if text not in ("", "0", "1"):
        raise ValueError("failed must be 1 (failed runs only) or 0")
    return text == "1"


def args_text(args: Any, limit: int = ARGS_SHOWN) -> str:
    """A timer's args as compact JSON, cut at ``limit`` characters."""
    text = json.dumps(args, ensure_ascii=False, separators=(",", ":"), default=repr)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def in_words(seconds: float) -> str:
    """``in 4.0s``, ``12m 5s ago``."""
    return f"in {format_duration(seconds)}" if seconds >= 0 else \
        f"{format_duration(-seconds)} ago"


class Dashboard:
    """One keyspace's dashboard: the client it reads with, and the samples of the
    keyspace's counters it keeps for the overview's rates."""

    def __init__(self, timers: Timers, spacing_s: float = SAMPLE_SPACING_S) -> None:
        self.timers, self.spacing_s = timers, spacing_s
        self.samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)

    def snapshot(self) -> FleetSnapshot:
        """The keyspace now; kept as a sample when the last one is old enough."""
        snap = self.timers.run(self.timers.ops.snapshot())
        sample = Sample.of(snap)
        if not self.samples or sample.at_s - self.samples[-1].at_s >= self.spacing_s \
                or sample.at_s < self.samples[-1].at_s:
            self.samples.append(sample)
        return snap

    def charts(self, now_s: float, task: str | None = None) -> dict[str, Any]:
        """The throughput (last hour, last day) and lateness charts of ``task`` (or of
        every task), from the run history's series."""
        hour = self.timers.series(task=task, minutes=60)
        day = self.timers.series(task=task, minutes=1440)
        prefix = "task-" if task else ""
        charts = (
            throughput_chart(f"{prefix}chart-hour", "Runs and failures, last hour", hour,
                             now_s, 60),
            lateness_chart(f"{prefix}chart-lateness", "Lateness, last hour (p50 and p99)",
                           hour, now_s),
            throughput_chart(f"{prefix}chart-day", "Runs and failures, last day", day, now_s,
                             1440, 15))
        return {"charts_note": "From the run history.",
                "charts": [(c.title, render(c)) for c in charts]}


def _history_rates(d: Dashboard, now_s: float) -> tuple[float, float] | None:
    """(runs, failures) per minute from the run history's last full minute and the
    current one so far, until the dashboard has samples for a rate; None when it has no
    runs there."""
    minutes = d.timers.series(minutes=2)
    runs = sum(m.runs for m in minutes)
    if not runs:  # nothing known yet: as without samples
        return None
    span = 1 + (now_s % 60) / 60
    return runs / span, sum(m.failures for m in minutes) / span


def overview(d: Dashboard) -> dict[str, Any]:
    snap = d.snapshot()
    announced = sorted(d.timers.run(d.timers.ops.announced_tasks()))
    now_s = snap.redis_ms / 1000
    rates = per_minute(list(d.samples), now_s) or _history_rates(d, now_s)
    busiest: dict[str, int] = {}
    for x in snap.listeners:
        for task, n in x["busiest_tasks"]:
            busiest[task] = busiest.get(task, 0) + n
    return {"snap": snap, "soon": [snap.due_within(w) for w in SOON_MS],
            "rates": rates, "announced": announced,
            "busiest": sorted(busiest.items(), key=lambda t: -t[1]),
            "latest": d.samples[-1] if d.samples else None,
            "listeners": [{**x, "age": _age(snap.redis_ms, x)} for x in snap.listeners],
            **d.charts(now_s)}


def _age(now_ms: int, listener: dict[str, Any]) -> str:
    beat = listener.get("heartbeat_ms")
    return "-" if not isinstance(beat, int | float) else f"{max(now_ms - beat, 0) / 1000:.0f} s"


def pending(d: Dashboard, query: Any) -> dict[str, Any]:
    """The pending page: a search by id prefix (and, for the whole id of a timer that runs
    or ended, where it is: ``ended``), a filter by task, or a page of every group and
    priority (or one), held-back timers included."""
    prefix = str(query.get("q", "")).strip()
    task = task_param(query, "task", required=False)
    group, priority = group_param(query), priority_param(query)
    page_no = page_param(query)
    complete = True
    t = d.timers
    ended = None
    if prefix:
        found, complete = t.run(t.ops.search_id_prefix(prefix, PAGE))
        if all(p.id != prefix for p in found):  # the id whole: a timer that ran or ended
            view = TimerView.read(t, prefix)
            ended = view.status if view is not None and view.known else None
    elif task:
        found = t.run(t.ops.filter_task(task, PAGE))
    else:
        found = t.run(t.ops.browse_page((page_no - 1) * PAGE, PAGE, group, priority))
    snap = d.snapshot()
    return {"found": found, "ended": ended, "q": prefix, "task": task or "", "group": group or "",
            "priority": "" if priority is None else priority, "complete": complete,
            "page_no": page_no, "more": len(found) == PAGE and not (prefix or task)
            and page_no < MAX_PAGE, "now": datetime.now(UTC), "window": browse.FILTER_WINDOW,
            "queues": sorted(snap.queues, key=lambda q: (q.group != DEFAULT_GROUP, q.group,
                                                         -q.priority)),
            "held_back": snap.held_back, "filtered": bool(group or priority is not None)}


def merged_limits(flows: list[TaskFlow]) -> list[Limit]:
    """One row per limit over every shard: counts added, the first known limit kept."""
    rows: dict[tuple[str, str], Limit] = {}
    for flow in flows:
        for limit in flow.limits:
            have = rows.get((limit.kind, limit.name))
            if have is None:
                rows[(limit.kind, limit.name)] = limit
                continue
            rows[(limit.kind, limit.name)] = Limit(
                limit.kind, limit.name, have.limit if have.limit != "?" else limit.limit,
                have.running + limit.running, have.waiting + limit.waiting,
                have.waiting_here + limit.waiting_here,
                min((x for x in (have.next_slot_ms, limit.next_slot_ms) if x is not None),
                    default=None))
    return sorted(rows.values(), key=lambda r: (r.kind, r.name))


def task_page(d: Dashboard, query: Any) -> dict[str, Any]:
    """A task's page: its limits and what waits on them, its runs under way, its pending
    timers, its recent runs and failures, its charts."""
    task = task_param(query)
    assert task is not None
    t = d.timers
    flows = t.run(t.ops.task_flow(task))
    found = t.run(t.ops.filter_task(task, PAGE))
    failures = [f for f in t.failed(FAILURES_LOOKED_AT) if f.record.task == task][:PAGE]
    runs = t.history(task=task, limit=PAGE)
    if not (found or failures or runs or any(f.limits or f.running for f in flows)) \
            and task not in t.run(t.ops.announced_tasks()):
        raise LookupError(f"no such task: no live listener announces it, and no timer of it "
                          f"(among the first {browse.FILTER_WINDOW:,} of each queue), run "
                          f"under way or failure was found")
    snap = d.snapshot()
    groups = sorted({p.group for p in found} | {r.group for f in flows for r in f.running})
    return {"task": task, "limits": merged_limits(flows),
            "running": [r for f in flows for r in f.running], "found": found,
            "failures": failures, "runs": runs, "groups": groups, "now": datetime.now(UTC),
            "window": browse.FILTER_WINDOW, "looked_at": FAILURES_LOOKED_AT,
            **d.charts(snap.redis_ms / 1000, task)}


def history_page(d: Dashboard, query: Any) -> dict[str, Any]:
    """The latest ended runs (of a task; failed ones only), newest first."""
    task = task_param(query, "task", required=False)
    failed = failed_param(query)
    return {"task": task or "", "failed": failed,
            "runs": d.timers.history(task=task, failed=failed, limit=100)}


def recurrence_state(paused: bool, running: bool, next_due: datetime | None,
                     now: datetime) -> str:
    """``paused``, ``running`` (an occurrence runs now), ``overdue`` (its next one is due
    and no listener has claimed it), ``waiting`` (the next one is pending) or ``idle``
    (none pending and none running: between a run's start and its successor's
    scheduling, or its last occurrence was cancelled)."""
    if paused:
        return "paused"
    if running:
        return "running"
    if next_due is None:
        return "idle"
    late = (now - next_due).total_seconds() * 1000
    return "overdue" if late > OVERDUE_AFTER_MS else "waiting"


def recurrence_names(running: list[Running]) -> set[str]:
    """The recurrences with an occurrence running now."""
    out = set()
    for r in running:
        value = r.record.options.get(RECURRENCE_OPTION) if r.record is not None else None
        if value is not None:
            try:
                out.add(name_from_option(value))
            except MalformedTimerKey:
                continue
    return out


def recurrences(d: Dashboard) -> dict[str, Any]:
    t = d.timers
    found = t.recurrences()
    running = recurrence_names(t.run(t.ops.running_runs()))
    now = datetime.now(UTC)
    return {"recurrences": [{
        "r": r, "schedule": f"{r.when} ({r.tz})" if r.cron is not None else r.when,
        "next": "-" if r.next_due is None else in_words((r.next_due - now).total_seconds()),
        "state": recurrence_state(r.paused, r.name in running, r.next_due, now)}
        for r in found]}
