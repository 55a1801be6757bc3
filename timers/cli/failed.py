"""``timers failed …``: list, show, retry and purge the records of failed timers.

Registered on the main command line by :mod:`timers.cli`. A dead timer's record stays until
it is retried or purged, whatever later timers with the same id do; ``show ID`` lists every
record of that id.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from timers.cli.common import PrefixOption, UrlOption, clip, friendly, open_timers, printable, when
from timers.exceptions import TimerAlreadyPending, UserError
from timers.model.due import parse_duration
from timers.model.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from timers.ops.failures import Failure

failed_app = typer.Typer(help="Timers that failed or were refused.", no_args_is_help=False,
                         rich_markup_mode=None)

LimitOption = Annotated[int, typer.Option("--limit", "-n", min=1, metavar="N", help="How many.")]
ReplaceOption = Annotated[bool, typer.Option(
    "--replace", help="Overwrite a timer pending again under the same id.")]
AnywayOption = Annotated[bool, typer.Option(
    "--anyway", help="Retry even timers whose task no live listener can run.")]


@failed_app.callback(invoke_without_command=True)
def failed(
    ctx: typer.Context,
    limit: LimitOption = 20,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Timers that failed for good or were refused (alone: the same as `failed list`)."""
    if ctx.invoked_subcommand is None:
        failed_list(limit=limit, url=url, prefix=prefix)


@failed_app.command("list")
@friendly
def failed_list(
    limit: LimitOption = 20,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """List failed and refused timers, most recent first."""
    with open_timers(url, prefix) as t:
        failures = t.failed(limit)
    if not failures:
        typer.echo("no failed timers")
        return
    typer.echo(f"{'WHEN (UTC)':<24} {'KIND':<9} {'ID':<20} {'TASK':<24} ERROR")
    for f in failures:
        d = f.data
        error = printable(f"{d.get('error_type', '')}: {d.get('message', '')}")
        task = d.get("task") or d.get("key") or ""
        shown_id = printable(d.get("id") or f.failure_id)
        typer.echo(f"{when(f.at):<24} {d.get('kind', ''):<9} {shown_id:<20} "
                   f"{clip(printable(task), 24):<24} {clip(error, 100)}")


def _show(failure: Failure) -> None:
    d = failure.data
    for name in ("id", "task", "args", "kind", "error_type", "message", "attempts", "key"):
        if d.get(name) not in (None, ""):
            value = d[name] if isinstance(d[name], str) else json.dumps(d[name])
            typer.echo(f"{name + ':':<15}{value}")
    for name in ("due_ms", "first_failure", "failed_at"):
        if isinstance(d.get(name), int):
            shown = "due:" if name == "due_ms" else name + ":"
            typer.echo(f"{shown:<15}{when(datetime.fromtimestamp(d[name] / 1000, UTC))}")
    if d.get("traceback"):
        from timers.model.tracebacks import from_task_frames

        typer.echo("traceback:")
        typer.echo(from_task_frames(d["traceback"]).rstrip())  # (records written before)


@failed_app.command("show")
@friendly
def failed_show(
    id: Annotated[str, typer.Argument(help="Timer id (or the :… id of a rejected key).")],
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Show every failure record of a timer id in full, most recent first."""
    with open_timers(url, prefix) as t:
        failures = t.get_failures(id)
    if not failures:
        raise UserError(f"no failure recorded for {id}")
    for n, failure in enumerate(failures):
        if len(failures) > 1:
            typer.echo(f"{'' if n == 0 else chr(10)}record {n + 1} of {len(failures)} "
                       f"({failure.failure_id}):")
        _show(failure)


@failed_app.command("retry")
@friendly
def failed_retry(
    id: Annotated[str | None, typer.Argument(help="Timer id to run again.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Retry every failed timer.")] = False,
    replace: ReplaceOption = False,
    anyway: AnywayOption = False,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Schedule failed timers again, due now, with their attempts reset. A timer whose id
    is pending again is skipped (--replace to overwrite it); so is one whose task no live
    listener of the prefix can run, while any listener is live (--anyway to retry it)."""
    from timers.ops.failures import failure_group
    from timers.ops.fleet import read_fleet

    if (id is None) == (not all_):
        raise UserError("give a timer id or --all")
    with open_timers(url, prefix) as t:
        if id is not None:
            failure = t.get_failure(id)
            if failure is None:
                raise UserError(f"no failure recorded for {id}")
            task = failure.record.task
            if task is not None and not anyway:
                fleet = t.run(read_fleet(t.keys))
                if not fleet.may_run(task, failure_group(failure)):
                    raise UserError(
                        f"no live listener can run {task} (group {failure_group(failure)}): "
                        f"not retried ({fleet.describe()}; --anyway to retry it)")
            try:
                typer.echo(f"retrying {t.retry_failure(failure, replace=replace)}")
            except TimerAlreadyPending as exc:
                raise UserError(f"timer {exc.timer_id} is pending again: not retried "
                                f"(--replace to overwrite it)") from None
            return
        done = t.run(t.ops.retry_all_failures(replace, runnable_only=not anyway))
    line = f"retrying {done.retried} timer(s)"
    if done.pending:
        line += f"; skipped {done.pending} pending again (--replace to overwrite them)"
    if done.not_retryable:
        line += f"; {done.not_retryable} rejected key(s) left as they are"
    if done.unrunnable:
        line += (f"; skipped {done.unrunnable} no live listener can run (e.g. "
                 f"{done.unrunnable_example}; --anyway to retry them)")
    typer.echo(line)


@failed_app.command("purge")
@friendly
def failed_purge(
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Only records older than this, e.g. 7d.")
    ] = None,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Delete failure records (all of them, or those older than --older-than)."""
    age = parse_duration(older_than) if older_than is not None else None
    with open_timers(url, prefix) as t:
        typer.echo(f"purged {t.purge_failures(age)} failure record(s)")
