"""``timers history``: recent ends of timers (completed, skipped, dead, cancelled), newest
first, from the run history the listeners keep (``timers listen --history-age``,
``--history-count``). Parse and print only."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from timers.cli.common import (
    PrefixOption,
    UrlOption,
    clip,
    friendly,
    open_timers,
    printable,
)
from timers.model.due import parse_duration
from timers.model.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from timers.model.history import HistoryRecord


def _ms(value: int | None) -> str:
    return "-" if value is None else str(value)


def _row(record: HistoryRecord) -> tuple[str, ...]:
    ended = datetime.fromtimestamp(record.ended, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return (ended, record.outcome.value, printable(record.id), printable(record.task),
            str(record.attempts), _ms(record.duration_ms), _ms(record.lateness_ms),
            printable(record.listener or "-"), clip(printable(record.error), 80))


def history(
    task: Annotated[str | None, typer.Option("--task", "-t", metavar="TASK",
                                             help="Only the timers of this task.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="DURATION", help="Only those that ended within this long, e.g. "
        "15m, 2h, 1d.")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Only dead timers.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, metavar="N",
                                       help="How many.")] = 20,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """List timers that ended (completed, skipped, dead, cancelled), newest first: how, when,
    on which listener, attempts, run time and lateness in ms, and the error of a dead one."""
    try:
        after = None if since is None else time.time() - parse_duration(since)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--since'") from None
    with open_timers(url, prefix) as t:
        records = t.history(task, after, failed, limit)
    if not records:
        typer.echo("no ended timers in the history")
        return
    header = ("ENDED (UTC)", "OUTCOME", "ID", "TASK", "ATTEMPTS", "RAN_MS", "LATE_MS",
              "LISTENER", "ERROR")
    rows = [_row(r) for r in records]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    for cells in (header, *rows):
        typer.echo("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())


def register(app: typer.Typer) -> None:
    """Add ``timers history`` to the command line."""
    app.command("history")(friendly(history))
