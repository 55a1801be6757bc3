"""``timers get``, ``list``, ``listeners`` and ``stats``: what is pending, waiting, running.

Parse and print only; every group, priority and flow queue is read by
:mod:`timers.ops.flow_views` through the client.
"""

from __future__ import annotations

import json
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
    when,
)
from timers.model.due import format_duration
from timers.model.keys import DEFAULT_GROUP, DEFAULT_PREFIX

if TYPE_CHECKING:
    from timers.ops.listings import Stats
    from timers.ops.operations import PendingTimer, TimerStatus

IdArgument = Annotated[str, typer.Argument(metavar="ID", help="Timer id.")]
GroupFilter = Annotated[str | None, typer.Option(
    "--group", "-g", metavar="GROUP", help="Only the timers of this group.")]
KeyFilter = Annotated[str | None, typer.Option(
    "--key", "-k", metavar="KEY",
    help="Only the timers of this concurrency key (those waiting for it first).")]


def get(id: IdArgument, url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Show where a timer is: pending or waiting (and on what), running (where), or how
    it ended (completed, skipped, dead, cancelled); exits 1 if timers knows nothing of it
    (never existed, or ended longer ago than the history keeps)."""
    from timers.model.history import TimerState

    with open_timers(url, prefix) as t:
        found = t.status(id)
    if found.state is TimerState.UNKNOWN:
        typer.echo(f"{printable(id)}: unknown (never existed, or ended longer ago than the "
                   "history keeps: see timers listen --history-age, --history-count, and "
                   "a task's history= and history_count=)",
                   err=True)
        raise typer.Exit(1)
    if found.timer is None:
        show_ended(found)
        return
    timer = found.timer
    left = timer.seconds_left(datetime.now(UTC))
    typer.echo(f"id:       {printable(timer.id)}")
    typer.echo(f"status:   {found.state.value}"
               + (f" ({found.waiting_on})" if found.waiting_on else ""))
    typer.echo(f"task:     {printable(timer.task)}")
    typer.echo(f"args:     {json.dumps(timer.args, ensure_ascii=False)}")
    if timer.wait is None:
        typer.echo(f"due:      {when(timer.due)} (in {format_duration(left)})")
        if found.waiting_on is not None:
            typer.echo(f"state:    {printable(found.detail)}")
    else:
        typer.echo(f"state:    {printable(timer.wait.describe())}")
    if timer.waited_from is not None:
        held = datetime.now(UTC) - timer.waited_from
        typer.echo(f"came due: {when(timer.waited_from)} (held back "
                   f"{format_duration(held.total_seconds())} so far)")
    typer.echo(f"attempts: {timer.attempts} (failed runs so far)")
    typer.echo(f"group:    {printable(timer.group)}")
    typer.echo(f"priority: {timer.priority}")
    if timer.key is not None:
        typer.echo(f"key:      {printable(timer.key)}")


def show_ended(found: TimerStatus) -> None:
    """A running or ended timer, as ``timers get`` shows it."""
    from timers.model.history import EndKind, TimerState

    typer.echo(f"id:       {printable(found.id)}")
    typer.echo(f"status:   {found.state.value}")
    if found.state is TimerState.RUNNING:
        typer.echo(f"on:       {printable(found.listener or '?')}")
        if found.since is not None:
            typer.echo(f"due:      {when(found.since)} (started at or after it)")
        typer.echo(f"attempt:  {found.attempt}")
        return
    record = found.ended
    if record is None:  # dead, its history record past retention: its failure record
        failure = found.failure.record if found.failure is not None else None
        if failure is not None:
            typer.echo(f"task:     {printable(failure.task or '?')}")
            typer.echo(f"ended:    {when(datetime.fromtimestamp(failure.failed_at / 1000, UTC))}")
            typer.echo(f"attempts: {failure.attempts}")
            error = clip(f"{failure.error_type}: {failure.message}", 200)
            typer.echo(f"error:    {printable(error)}")
        typer.echo("(its history record is past retention; timers failed shows the rest)")
        return
    typer.echo(f"task:     {printable(record.task)}")
    typer.echo(f"ended:    {when(datetime.fromtimestamp(record.ended, UTC))}")
    label = "by:" if record.outcome is EndKind.CANCELLED else "listener:"
    typer.echo(f"{label:<10}{printable(record.listener or '?')}")
    typer.echo(f"attempts: {record.attempts}")
    if record.duration_ms is not None:
        typer.echo(f"ran:      {record.duration_ms} ms")
    if record.lateness_ms is not None:
        typer.echo(f"late:     {record.lateness_ms} ms (start after its due time)")
    if record.error:
        typer.echo(f"error:    {printable(record.error)}")


def list_(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, metavar="N", help="How many.")] = 20,
    group: GroupFilter = None,
    key: KeyFilter = None,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """List pending timers, soonest first (waiting ones say what they wait for)."""
    with open_timers(url, prefix) as t:
        pending = t.list(limit, group=group, key=key)
        total = _total(t.stats(), group) if key is None else None
    if not pending:
        typer.echo("no pending timers")
        return
    now = datetime.now(UTC)
    rows = [_cells(timer, now) for timer in pending]
    header = ("DUE (UTC)", "IN", "ID", "TASK", "GROUP", "ARGS / STATE")
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=False)]
    for cells in (header, *rows):
        typer.echo(_line(cells, widths))
    if total is not None and total > len(pending):
        typer.echo(f"… {total - len(pending)} more (--limit)")


def _cells(timer: PendingTimer, now: datetime) -> tuple[str, ...]:
    tail = (clip(json.dumps(timer.args, ensure_ascii=False), 60) if timer.wait is None
            else printable(timer.wait.describe()))
    return (when(timer.due), format_duration(timer.seconds_left(now)), printable(timer.id),
            printable(timer.task), printable(timer.group), tail)


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    """One row, each column as wide as its widest cell (IN right-aligned)."""
    due, left, id_, task, group, tail = cells
    return (f"{due:<{widths[0]}} {left:>{widths[1]}}  {id_:<{widths[2]}} "
            f"{task:<{widths[3]}} {group:<{widths[4]}} {tail}").rstrip()


def _total(stats: Stats, group: str | None) -> int:
    if group is None:
        return stats.pending
    counts = stats.groups.get(group)
    return counts.pending if counts else 0


def listeners(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """List live listeners (from their heartbeats) and the groups each serves."""
    with open_timers(url, prefix) as t:
        live = t.listeners()
    if not live:
        typer.echo("no live listeners")
        return
    now = datetime.now(UTC).timestamp()
    typer.echo(f"{'ID':<36} {'HOST':<20} {'PID':>7} {'UP':>8} {'RUNNING':>7} {'FIRED':>9} "
               f"{'STUCK':>5} {'GROUPS':<16} STATE")
    for info in sorted(live, key=lambda i: str(i.get("id"))):
        started = info.get("started")
        up = format_duration(now - started) if isinstance(started, int | float) else "?"
        groups = info.get("groups") or [DEFAULT_GROUP]
        names = ",".join(printable(g) for g in groups) if isinstance(groups, list) else "?"
        typer.echo(f"{printable(info.get('id')):<36} {printable(info.get('host')):<20} "
                   f"{printable(info.get('pid', '')):>7} {up:>8} "
                   f"{printable(info.get('running', 0)):>7} {printable(info.get('fired', 0)):>9} "
                   f"{printable(info.get('stuck', 0)):>5} {names:<16} "
                   f"{printable(info.get('state', ''))}")


_COUNTER_NOTES = {
    "reruns": " (runs whose listener died or stalled past its lease, run again)",
    "late_finishes": " (paused past lease: runs that ended after another listener took "
                     "them over, each overlapping its rerun)",
}
"""What a counter whose name alone says too little means, as ``timers stats`` prints it."""


def stats(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Counts: pending, running, failed, fired; per group; timers waiting per key/rate."""
    with open_timers(url, prefix) as t:
        s = t.stats()
    typer.echo(f"pending:  {s.pending}")
    following = f" ({s.next_in_line} next in line on a key, not started)" if s.next_in_line else ""
    typer.echo(f"running:  {s.running}{following}")
    typer.echo(f"failed:   {s.failed}")
    typer.echo(f"fired:    {s.fired}")
    for name in sorted(set(s.counters) - {"fired", "failed"}):
        typer.echo(f"{name + ':':<9} {s.counters[name]}{_COUNTER_NOTES.get(name, '')}")
    if s.groups and set(s.groups) != {DEFAULT_GROUP}:
        typer.echo(f"\n{'GROUP':<24} {'PENDING':>9} {'WAITING':>9} {'RUNNING':>9}")
        for name, counts in sorted(s.groups.items()):
            typer.echo(f"{printable(name):<24} {counts.pending:>9} {counts.waiting:>9} "
                       f"{counts.running:>9}")
    for title, waiting in (("KEY", s.waiting_keys), ("RATE LIMIT", s.waiting_rates)):
        if waiting:
            typer.echo(f"\n{title:<40} {'WAITING':>9}")
            for name, n in sorted(waiting.items(), key=lambda item: -item[1])[:20]:
                typer.echo(f"{clip(printable(name), 40):<40} {n:>9}")


def register(app: typer.Typer) -> None:
    """Add these commands to the ``timers`` command line."""
    app.command("get")(friendly(get))
    app.command("list")(friendly(list_))
    app.command("listeners")(friendly(listeners))
    app.command("stats")(friendly(stats))
