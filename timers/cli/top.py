"""``timers top``: a live view of a keyspace in the terminal (with ``rich``): pending, due
soon, overdue, fires per second, lateness, the busiest tasks and the listeners. ``q`` or
Ctrl-C quits; when standard output is not a terminal it prints the view once, as text.

Parse and print only: the figures come from :mod:`timers.ops.snapshot` (two round
trips per refresh) and the listeners' heartbeats; :mod:`timers.cli.top_view` draws them
(loaded when the command runs, so ``timers top --help`` loads no ``rich``).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import tty
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from timers.cli.common import PrefixOption, UrlOption, friendly, open_timers
from timers.model.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from timers.ops.snapshot import FleetSnapshot

IntervalOption = Annotated[float, typer.Option(
    "--interval", min=0.2, metavar="SECONDS", help="Seconds between refreshes.")]


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
    from rich.console import Console
    from rich.live import Live

    from timers.cli.top_view import view

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
