"""``timers cron …``: declare, list, pause, resume and remove recurring timers.

Registered on the main command line by :mod:`timers.cli`. Like the rest of the command line,
a user error prints one line and exits 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from timers.cli.common import (
    PrefixOption,
    UrlOption,
    fail,
    open_timers,
    parse_args_json,
    user_errors,
)
from timers.exceptions import TimersError
from timers.model.due import format_duration, parse_duration
from timers.model.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from timers.model.cron import Recurrence
    from timers.producer.client import Timers

cron_app = typer.Typer(
    help="Recurring timers: cron expressions in a time zone, or fixed intervals.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

NameArgument = Annotated[str, typer.Argument(help="Name of the recurrence.")]


@contextlib.contextmanager
def _timers(url: str | None, prefix: str) -> Iterator[Timers]:
    """A client; the errors a user can cause become one line and exit code 1."""
    with user_errors(url), open_timers(url, prefix) as t:
        yield t


def _local(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S %Z")


def next_runs(rec: Recurrence, now: datetime, count: int = 3) -> str:
    """The next ``count`` run times in the recurrence's own zone, or why there are none."""
    if rec.paused:
        return "paused"
    try:
        return ", ".join(_local(t) for t in rec.upcoming(count, after=now))
    except (ValueError, TimersError) as exc:
        return f"unknown ({exc})"


CatchUpOption = Annotated[str, typer.Option(
    "--catch-up", help="After downtime: latest (run the latest missed once), all (each, in "
                       "order) or none.")]
MaxLatenessOption = Annotated[str | None, typer.Option(
    "--max-lateness", help="Never start an occurrence later than this after its time.")]
NoOverlapOption = Annotated[bool, typer.Option(
    "--no-overlap", help="Skip an occurrence while the previous run is still running.")]
GroupOption = Annotated[str | None, typer.Option(
    "--group", "-g", metavar="GROUP",
    help="Its occurrences' group (default $TIMERS_GROUP or 'default').")]
KeyOption = Annotated[str | None, typer.Option(
    "--key", "-k", metavar="KEY", help="Its occurrences' concurrency key.")]
PriorityOption = Annotated[int, typer.Option(
    "--priority", metavar="N", help="Higher runs first among waiting timers.")]


@cron_app.command("add")
def add(
    name: NameArgument,
    task: Annotated[str, typer.Argument(help="Dotted path under the tasks package.")],
    args_json: Annotated[
        str | None,
        typer.Argument(metavar="ARGS_JSON", help="JSON list (positional) or object "
                                                   "(keyword)."),
    ] = None,
    cron: Annotated[
        str | None, typer.Option("--cron", help="Cron expression, e.g. '0 9 * * mon-fri' "
                                                "(a 6th field: seconds).")
    ] = None,
    every: Annotated[
        str | None, typer.Option("--every", help="Interval: 30s, 5m, 2h, 1d, or seconds.")
    ] = None,
    tz: Annotated[str, typer.Option("--tz", help="Time zone the cron fields are read in.")]
    = "UTC",
    catch_up: CatchUpOption = "latest",
    max_lateness: MaxLatenessOption = None,
    no_overlap: NoOverlapOption = False,
    group: GroupOption = None,
    key: KeyOption = None,
    priority: PriorityOption = 0,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Declare a recurrence, or change it in place (declaring it unchanged does nothing)."""
    from timers.model.cron import CATCH_UP_VALUES

    if (cron is None) == (every is None):
        raise fail("give exactly one of --cron or --every")
    if catch_up not in CATCH_UP_VALUES:
        raise fail(f"--catch-up must be one of {', '.join(CATCH_UP_VALUES)}")
    args = parse_args_json(args_json)
    with _timers(url, prefix) as t:
        interval = parse_duration(every) if every is not None else None
        late = parse_duration(max_lateness) if max_lateness is not None else None
        rec = t.every(name, task, args, cron=cron, interval=interval, tz=tz,
                      catch_up=catch_up,
                      max_lateness=late, overlap=not no_overlap, group=group, key=key,
                      priority=priority)
    typer.echo(f"{rec.name} (version {rec.version}): {rec.when} {rec.tz}; next "
               f"{next_runs(rec, datetime.now(UTC), 1)}")


@cron_app.command("list")
def list_(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """List recurrences with their next three run times, in their own time zones."""
    with _timers(url, prefix) as t:
        recurrences = t.recurrences()
    if not recurrences:
        typer.echo("no recurrences")
        return
    now = datetime.now(UTC)
    rows = [("NAME", "SCHEDULE", "TZ", "TASK", "NEXT RUNS")]
    rows += [(rec.name, _schedule(rec), rec.tz, rec.task, next_runs(rec, now))
             for rec in recurrences]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                       strict=False))
                   + "  " + row[4])


def _schedule(rec: Recurrence) -> str:
    """The schedule and any policy that is not the default."""
    parts = [rec.when]
    if rec.catch_up != "latest":
        parts.append(f"catch-up={rec.catch_up}")
    if rec.max_lateness is not None:
        parts.append(f"max-lateness={format_duration(rec.max_lateness.total_seconds())}")
    if not rec.overlap:
        parts.append("no-overlap")
    return " ".join(parts)


@cron_app.command("remove")
def remove(name: NameArgument, url: UrlOption = None,
           prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Delete a recurrence and its pending occurrence."""
    _on_recurrence(name, url, prefix, _unschedule, "removed")


@cron_app.command("pause")
def pause(name: NameArgument, url: UrlOption = None,
          prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Stop a recurrence from running until it is resumed."""
    _on_recurrence(name, url, prefix, _pause, "paused")


def _unschedule(t: Timers, name: str) -> bool:
    return t.unschedule_recurring(name)


def _pause(t: Timers, name: str) -> bool:
    return t.pause(name)


def _on_recurrence(name: str, url: str | None, prefix: str,
                   action: Callable[[Timers, str], bool], done: str) -> None:
    """Apply ``action`` to the recurrence ``name``; one line if there is none."""
    with _timers(url, prefix) as t:
        found = action(t, name)
    if not found:
        raise fail(f"no recurrence named {name!r}")
    typer.echo(f"{done} {name}")


@cron_app.command("resume")
def resume(name: NameArgument, url: UrlOption = None,
           prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Run a paused recurrence again from its next time (missed times are not caught up)."""
    with _timers(url, prefix) as t:
        found = t.resume(name)
        rec = t.get_recurrence(name) if found else None
    if rec is None:
        raise fail(f"no recurrence named {name!r}")
    typer.echo(f"resumed {name}; next {next_runs(rec, datetime.now(UTC), 1)}")
