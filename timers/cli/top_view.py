"""What ``timers top`` draws for one refresh (with ``rich``), from a
:class:`~timers.ops.snapshot.FleetSnapshot` and the one before it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from timers.ops.snapshot import SOON_MS, FleetSnapshot

ENDED = ("fired", "failed", "retried", "skipped")


def _rate(now: FleetSnapshot, before: FleetSnapshot | None) -> float | None:
    """Runs ended per second between two snapshots."""
    if before is None or now.redis_ms <= before.redis_ms:
        return None
    done = sum(now.counters.get(c, 0) - before.counters.get(c, 0) for c in ENDED)
    return done * 1000 / (now.redis_ms - before.redis_ms)


def _late(listeners: list[dict[str, Any]], field: str) -> str:
    values = [x[field] for x in listeners if isinstance(x.get(field), int | float)]
    return f"{max(values):.1f} ms" if values else "-"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def view(now: FleetSnapshot, before: FleetSnapshot | None, prefix: str) -> Group:
    """The screen for one refresh."""
    rate = _rate(now, before)
    head = Table.grid(padding=(0, 3))
    for label, value in (
            ("pending", f"{now.pending:,}"), ("due in 1 min", f"{now.due_within(SOON_MS[0]):,}"),
            ("due in 1 h", f"{now.due_within(SOON_MS[1]):,}"), ("overdue", f"{now.overdue:,}"),
            ("running", f"{sum(now.running.values()):,}"), ("dead", f"{now.dead:,}"),
            ("fires/s", "-" if rate is None else f"{rate:,.1f}"),
            ("lateness p50 (worst listener)", _late(now.listeners, "lateness_p50_ms")),
            ("lateness p99 (worst listener)", _late(now.listeners, "lateness_p99_ms"))):
        head.add_row(Text(label, style="bold"), Text(value))
    busiest: Counter[str] = Counter()
    for listener in now.listeners:
        for task, n in listener.get("busiest_tasks") or []:
            busiest[str(task)] += int(n)
    tasks = Table("busiest tasks (last minute)", "runs", box=None)
    for task, n in busiest.most_common(5):
        tasks.add_row(Text(task), f"{n:,}")
    listeners = Table("listener", "groups", "running", "runs/min", "p99", box=None)
    for x in now.listeners:
        listeners.add_row(Text(str(x.get("id", "?"))), Text(",".join(x.get("groups") or [])),
                          _or_dash(x.get("running")), _or_dash(x.get("runs_last_minute")),
                          "-" if x.get("lateness_p99_ms") is None
                          else f"{x['lateness_p99_ms']} ms")
    title = Text(f"timers top — prefix {prefix!r} — q quits", style="reverse")
    return Group(title, head, Text(""), tasks, Text(""), listeners)
