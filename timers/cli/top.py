"""``timers top``: a live view of a keyspace in the terminal (with ``rich``): pending, due
soon, overdue, fires per second, lateness, the busiest tasks and the listeners. ``q`` or
Ctrl-C quits; when standard output is not a terminal it prints the view once, as text.

Parse and print only: the figures come from :mod:`timers.ops.snapshot` (two round
trips per refresh) and the listeners' heartbeats.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import tty
from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from timers.cli.common import PrefixOption, UrlOption, friendly, open_timers
from timers.model.keys import DEFAULT_PREFIX
from timers.ops.snapshot import SOON_MS, FleetSnapshot

IntervalOption = Annotated[float, typer.Option(
    "--interval", min=0.2, metavar="SECONDS", help="Seconds between refreshes.")]
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


@contextlib.contextmanager
def _keys() -> Iterator[None]:
    """The terminal in cbreak mode (keys arrive one by one, unechoed), restored after."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(timeout: float) -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and os.read(sys.stdin.fileno(), 16).lower().startswith(b"q")


def top(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX,
        interval: IntervalOption = 2.0) -> None:
    """A live view of pending, due, overdue and running timers, fires per second,
    lateness, the busiest tasks and the listeners. q or Ctrl-C quits."""
    with open_timers(url, prefix) as t:
        snap = t.run(t.ops.snapshot())
        if not (sys.stdout.isatty() and sys.stdin.isatty()):
            Console(width=120).print(view(snap, None, t.keys.prefix))
            return
        before: FleetSnapshot | None = None
        with _keys(), Live(view(snap, None, t.keys.prefix), auto_refresh=False,
                           screen=True) as live:
            while not _quit_pressed(interval):
                before, snap = snap, t.run(t.ops.snapshot())
                live.update(view(snap, before, t.keys.prefix), refresh=True)


def register(app: typer.Typer) -> None:
    """Add ``timers top`` to the command line."""
    app.command("top")(friendly(top))
