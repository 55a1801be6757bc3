"""``timers schedule``, ``reschedule`` and ``cancel``: the producer's commands.

They load the producer (the client over the sans-I/O operations) when they run, and never
the listener's machinery.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from timers.cli.common import (
    PrefixOption,
    UrlOption,
    friendly,
    open_timers,
    parse_args_json,
    printable,
    when,
)
from timers.exceptions import UserError
from timers.model.due import parse_delay
from timers.model.keys import DEFAULT_PREFIX


def _parse_at(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO 8601 time, e.g. "
                                 f"2026-12-01T09:00:00+01:00", param_hint="'--at'") from None
    if value.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no time zone: add one, e.g. +00:00 or Z",
                                 param_hint="'--at'")
    return value


def _due(in_: str | None, at: str | None) -> tuple[float | None, datetime | None]:
    """``--in`` / ``--at`` as the library takes them: exactly one of the two."""
    if (in_ is None) == (at is None):
        raise typer.BadParameter("give exactly one of --in or --at", param_hint="'--in' / '--at'")
    try:
        delay = parse_delay(in_) if in_ is not None else None
    except ValueError as exc:  # a usage error: exit 2
        raise typer.BadParameter(str(exc), param_hint="'--in'") from None
    return delay, _parse_at(at) if at is not None else None



InOption = Annotated[str | None, typer.Option(
    "--in", metavar="DURATION", show_default=False,
    help="Delay: 30s, 5m, 2h, 1d, 1h30m, or seconds (negative: due now).")]
AtOption = Annotated[str | None, typer.Option(
    "--at", metavar="TIME", show_default=False,
    help="ISO 8601 time with a zone, e.g. 2026-12-01T09:00:00+01:00")]
IdArgument = Annotated[str, typer.Argument(metavar="ID", help="Timer id.")]


def schedule(
    task: Annotated[str, typer.Argument(metavar="TASK", help="Dotted path under the tasks "
                                                             "package, e.g. reminders.sms")],
    args_json: Annotated[
        str | None,
        typer.Argument(metavar="ARGS_JSON", show_default=False,
                       help='JSON list (positional) or object (keyword), e.g. '
                            '\'{"user_id": 42}\''),
    ] = None,
    in_: InOption = None,
    at: AtOption = None,
    id: Annotated[
        str | None, typer.Option("--id", metavar="ID", show_default=False,
                                 help="Timer id; a pending timer with it is replaced.")
    ] = None,
    group: Annotated[str | None, typer.Option(
        "--group", "-g", metavar="GROUP",
        help="Its group (default $TIMERS_GROUP or 'default').")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", "-k", metavar="KEY", help="Its concurrency key.")] = None,
    priority: Annotated[int, typer.Option(
        "--priority", metavar="N", help="Higher runs first among waiting timers.")] = 0,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Schedule a timer; prints its id."""
    delay, due_at = _due(in_, at)
    args = parse_args_json(args_json)
    with open_timers(url, prefix) as t:
        typer.echo(t.schedule(task, args, in_=delay, at=due_at, id=id, group=group, key=key,
                              priority=priority))


def reschedule(
    id: IdArgument,
    in_: InOption = None,
    at: AtOption = None,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Move a pending timer to a new due time; exits 1 if it is not pending."""
    delay, due_at = _due(in_, at)
    with open_timers(url, prefix) as t:
        if t.reschedule(id, in_=delay, at=due_at):
            timer = t.get(id)
            typer.echo(f"rescheduled {printable(id)}"
                       + (f" to {when(timer.due)}" if timer is not None else ""))
            return
    raise UserError(f"{printable(id)} is not pending (already fired, cancelled, or never "
                    f"scheduled)")


def cancel(id: IdArgument, url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Cancel a pending timer; exits 1 if it was not pending."""
    with open_timers(url, prefix) as t:
        if t.cancel(id):
            typer.echo(f"cancelled {printable(id)}")
            return
    typer.echo(f"{printable(id)} is not pending (already fired, cancelled, or never "
               f"scheduled)", err=True)
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add these commands to the ``timers`` command line."""
    app.command("schedule")(friendly(schedule))
    app.command("reschedule")(friendly(reschedule))
    app.command("cancel")(friendly(cancel))
