"""The ``timers`` command line: parses, calls the library, prints.

A usage error (an unknown option, a missing argument, a bad choice) prints one line and
exits 2; any other error (bad JSON, a bad duration, a server that does not answer) prints
one line and exits 1. No tracebacks, no boxes, no passwords.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import typer

from timers.cli import listen_metrics
from timers.cli.common import (
    PrefixOption,
    UrlOption,
    UserError,
    friendly,
    open_timers,
    printable,
)
from timers.cli.cron import cron_app
from timers.cli.errors import run_app
from timers.cli.failed import failed_app
from timers.cli.listen_logs import (
    LogFiresOption,
    LogFormatOption,
    listener_logs,
    set_up_logs,
    supervise,
)
from timers.cli.listen_metrics import MetricsHostOption, MetricsPortOption
from timers.cli.move import register as register_move_command
from timers.cli.observe import register as register_observe_commands
from timers.cli.server import register as register_server_commands
from timers.cli.top import register as register_top_command
from timers.cli.views import register as register_view_commands
from timers.cli.web import register as register_web_command
from timers.client import configured_url
from timers.due import parse_delay
from timers.foreground import check_connection, check_server_once, run_in_foreground
from timers.keys import DEFAULT_PREFIX
from timers.listener import DEFAULT_CONCURRENCY, DEFAULT_LEASE, Listener
from timers.listener.eviction import EvictionUnsafe
from timers.listener.groups import served_groups
from timers.listener.orphans import supervisor_pid
from timers.listener.permissions import PermissionMissing
from timers.listener.recycling import RecycleLimits, check_memory_limit, report_fd
from timers.listener.supervisor import ListenOptions, Supervisor
from timers.loader import TASKS_ENV, TaskLoader, configured_package
from timers.redact import safe_url

app = typer.Typer(
    help="Delayed timers on Redis: schedule a task call for later; listeners fire it once.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(failed_app, name="failed")
app.add_typer(cron_app, name="cron")
register_server_commands(app)
register_view_commands(app)
register_observe_commands(app)
register_top_command(app)
register_web_command(app)
register_move_command(app)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"timers {version('timers')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Delayed timers on Redis: schedule a task call for later; listeners fire it once."""


def _parse_args(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UserError(f"ARGS_JSON is not valid JSON ({exc}): {text[:80]!r}") from None


def _parse_at(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"--at {text!r} is not an ISO 8601 time, e.g. 2026-12-01T09:00:00+01:00")\
            from None
    if value.tzinfo is None:
        raise UserError(f"--at {text!r} has no time zone: add one, e.g. +00:00 or Z")
    return value


def _due(in_: str | None, at: str | None) -> tuple[float | None, datetime | None]:
    """``--in`` / ``--at`` as the library takes them: exactly one of the two."""
    if (in_ is None) == (at is None):
        raise UserError("give exactly one of --in or --at")
    return (parse_delay(in_) if in_ is not None else None,
            _parse_at(at) if at is not None else None)


def _when(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


# -- listen -----------------------------------------------------------------------------


TasksOption = Annotated[
    str | None,
    typer.Option("--tasks", metavar="PACKAGE", show_default=False,
                 help=f"Package whose functions timers may run, found on PYTHONPATH, then "
                      f"in the working directory [default: ${TASKS_ENV} or tasks]"),
]
LogLevel = Literal["debug", "info", "warning", "error"]
LogLevelOption = Annotated[LogLevel, typer.Option("--log-level", case_sensitive=False)]
MaxRunsOption = Annotated[int | None, typer.Option(
    "--max-runs-per-child", min=1, metavar="N", show_default=False,
    help="Replace a listener process after N finished runs (for tasks that leak); "
         "runs it under a supervisor even without --processes.")]
AllowEvictionOption = Annotated[bool, typer.Option(
    "--allow-eviction",
    help="Start even on an allkeys-* eviction policy, which can evict pending timers.")]
GroupOption = Annotated[list[str] | None, typer.Option(
    "--group", "-g", metavar="GROUP",
    help="Claim the timers of this group (repeat for several; default $TIMERS_GROUP or "
         "'default'). Timers of other groups are left to their own listeners.")]
MaxMemoryOption = Annotated[float | None, typer.Option(
    "--max-memory-per-child", min=1, metavar="MB", show_default=False,
    help="Replace a listener process once its resident memory reaches MB megabytes; "
         "runs it under a supervisor even without --processes.")]


@app.command()
@friendly
def listen(
    url: UrlOption = None,
    tasks: TasksOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, metavar="N",
                          help="Tasks run at once, at most.")
    ] = DEFAULT_CONCURRENCY,
    lease: Annotated[
        float, typer.Option("--lease", min=0.1, metavar="SECONDS",
                            help="Seconds a crashed listener's timers wait before they run "
                                 "again elsewhere.")
    ] = DEFAULT_LEASE,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once nothing is due and nothing runs.")
    ] = False,
    shutdown_timeout: Annotated[
        float, typer.Option("--shutdown-timeout", metavar="SECONDS",
                            help="Seconds running tasks get to finish on SIGTERM/SIGINT.")
    ] = 30.0,
    processes: Annotated[
        int, typer.Option("--processes", "-p", min=1, metavar="N",
                          help="Listener processes, restarted by a supervisor if one dies.")
    ] = 1,
    prefix: PrefixOption = DEFAULT_PREFIX,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = None,
    log_fires: LogFiresOption = False,
    allow_eviction: AllowEvictionOption = False,
    max_runs_per_child: MaxRunsOption = None,
    max_memory_per_child: MaxMemoryOption = None,
    group: GroupOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
) -> None:
    """Run timers as they come due (subscribes to expired events and sweeps the due index)."""
    log_format = set_up_logs(log_level, log_format, processes)
    options = ListenOptions(url=url, tasks=tasks, prefix=prefix, concurrency=concurrency,
                            lease=lease, shutdown_timeout=shutdown_timeout,
                            log_level=log_level, burst=burst, allow_eviction=allow_eviction,
                            log_format=log_format, log_fires=log_fires,
                            max_runs_per_child=max_runs_per_child,
                            max_memory_per_child=max_memory_per_child, groups=_served(group),
                            metrics_port=metrics_port, metrics_host=metrics_host)
    if processes > 1 or (options.recycles and report_fd() is None):
        raise typer.Exit(_supervise(options, processes))
    _listen_here(options)


def _supervise(options: ListenOptions, processes: int) -> int:
    # refuse before starting children that would each refuse
    TaskLoader(configured_package(options.tasks), search_path=os.getcwd()).load()
    check_memory_limit(options.max_memory_per_child)  # about a child's size: refuse once
    url_now = configured_url(options.url)
    check_server_once(url_now, safe_url(url_now))  # the children wait for it later
    supervisor = Supervisor.for_listeners(options, processes)
    listen_metrics.serve_for_children(supervisor, options.metrics_port, options.metrics_host)
    return supervise(supervisor)


def _served(groups: list[str] | None) -> tuple[str, ...]:
    try:
        return served_groups(groups)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _listen_here(options: ListenOptions) -> None:
    try:
        listener = Listener(options.url, prefix=options.prefix,
                            tasks=options.tasks,
                            concurrency=options.concurrency or DEFAULT_CONCURRENCY,
                            lease=options.lease or DEFAULT_LEASE,
                            shutdown_timeout=options.shutdown_timeout,
                            allow_eviction=options.allow_eviction,
                            recycle=RecycleLimits(options.max_runs_per_child,
                                                  options.max_memory_per_child),
                            groups=options.groups or None)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    listener_logs(listener, options.log_fires)
    metrics = listen_metrics.record(listener, options.metrics_port, options.metrics_host)
    asyncio.run(_listen(listener, options.burst, safe_url(configured_url(options.url)),
                        metrics))
    listener.tally.log_stopped()
    # Threads of tasks that outlived the shutdown timeout were handed back; don't wait
    # for them at interpreter exit.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(1 if listener.aborted or listener.crashed else 0)


async def _listen(listener: Listener, burst: bool, where: str, metrics: Any) -> None:
    await check_connection(listener.redis, where, wait=supervisor_pid() is not None)
    logging.getLogger("timers").info(
        "starting on %s (tasks package %r, concurrency %d)",
        where, listener.loader.package, listener.concurrency)
    done = asyncio.Event()
    sampler = listen_metrics.sample(metrics, listener, done) if metrics else None
    try:
        await run_in_foreground(listener, burst=burst)
    except (EvictionUnsafe, PermissionMissing) as exc:
        raise UserError(str(exc)) from None
    finally:
        done.set()
        if sampler is not None:
            await sampler


# -- producer commands ------------------------------------------------------------------

InOption = Annotated[str | None, typer.Option(
    "--in", metavar="DURATION", show_default=False,
    help="Delay: 30s, 5m, 2h, 1d, 1h30m, or seconds (negative: due now).")]
AtOption = Annotated[str | None, typer.Option(
    "--at", metavar="TIME", show_default=False,
    help="ISO 8601 time with a zone, e.g. 2026-12-01T09:00:00+01:00")]
IdArgument = Annotated[str, typer.Argument(metavar="ID", help="Timer id.")]


@app.command()
@friendly
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
    delay, when = _due(in_, at)
    args = _parse_args(args_json)
    with open_timers(url, prefix) as t:
        typer.echo(t.schedule(task, args, in_=delay, at=when, id=id, group=group, key=key,
                              priority=priority))


@app.command()
@friendly
def reschedule(
    id: IdArgument,
    in_: InOption = None,
    at: AtOption = None,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Move a pending timer to a new due time; exits 1 if it is not pending."""
    delay, when = _due(in_, at)
    with open_timers(url, prefix) as t:
        if t.reschedule(id, in_=delay, at=when):
            timer = t.get(id)
            typer.echo(f"rescheduled {printable(id)}"
                       + (f" to {_when(timer.due)}" if timer is not None else ""))
            return
    raise UserError(f"{printable(id)} is not pending (already fired, cancelled, or never "
                    f"scheduled)")


@app.command()
@friendly
def cancel(id: IdArgument, url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Cancel a pending timer; exits 1 if it was not pending."""
    with open_timers(url, prefix) as t:
        if t.cancel(id):
            typer.echo(f"cancelled {printable(id)}")
            return
    typer.echo(f"{printable(id)} is not pending (already fired, cancelled, or never "
               f"scheduled)", err=True)
    raise typer.Exit(1)


def main() -> None:
    """The ``timers`` command: exit 2 on a usage error, 1 on any other error."""
    sys.exit(run_app(app))


if __name__ == "__main__":  # pragma: no cover
    main()
