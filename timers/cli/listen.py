"""``timers listen``: run timers as they come due, in this process or under a supervisor.

Only this command loads the listener's machinery (the root of the command line loads this
module when ``listen`` is asked for, see :mod:`timers.cli.app`), and only to run: its help
reads the listener's defaults from :mod:`timers.listener.defaults` alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from timers.cli import listen_metrics
from timers.cli.common import PrefixOption, UrlOption, friendly
from timers.cli.listen_logs import (
    LogFiresOption,
    LogFormatOption,
    listener_logs,
    set_up_logs,
    supervise,
)
from timers.cli.listen_metrics import MetricsHostOption, MetricsPortOption
from timers.exceptions import (
    EvictionUnsafe,
    PermissionMissing,
    TasksUnavailable,
    UnknownFormat,
    UserError,
)
from timers.listener.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LEASE,
    SETUP_ENV,
    TASKS_ENV,
    WAIT_FOR_REDIS,
)
from timers.listener.tuning import event_loop
from timers.listener.tuning.event_loop import LOOP_ENV, LoopChoice
from timers.model.due import parse_duration
from timers.model.flow.names import served_groups
from timers.model.history import DEFAULT_HISTORY_AGE, DEFAULT_HISTORY_COUNT
from timers.model.keys import DEFAULT_PREFIX
from timers.store.connect import configured_url
from timers.store.server_errors import url_address

if TYPE_CHECKING:
    from timers.listener import Listener
    from timers.listener.endings.history import HistoryPolicy
    from timers.listener.supervision.supervisor import ListenOptions

TasksOption = Annotated[
    str | None,
    typer.Option("--tasks", metavar="PACKAGE", show_default=False,
                 help=f"Package whose functions timers may run, found on PYTHONPATH, then "
                      f"in the working directory [default: ${TASKS_ENV} or tasks]"),
]
SetupOption = Annotated[
    str | None,
    typer.Option("--setup", metavar="MODULE:FUNCTION", show_default=False,
                 help=f"Call this function before the tasks package is imported, in every "
                      f"listener process (e.g. django.setup()) [default: ${SETUP_ENV}]"),
]
ConcurrencyOption = Annotated[int, typer.Option(
    "--concurrency", "-c", min=1, metavar="N", help="Tasks run at once, at most.")]
LeaseOption = Annotated[float, typer.Option(
    "--lease", min=0.1, metavar="SECONDS",
    help="Seconds a crashed listener's timers wait before they run again elsewhere.")]
BurstOption = Annotated[bool, typer.Option(
    "--burst", help="Exit once nothing is due and nothing runs (timers a concurrency key "
    "or rate limit holds back stay pending: a line says how many).")]
ShutdownTimeoutOption = Annotated[float, typer.Option(
    "--shutdown-timeout", metavar="SECONDS",
    help="Seconds running tasks get to finish on SIGTERM/SIGINT.")]
ProcessesOption = Annotated[int, typer.Option(
    "--processes", "-p", min=1, metavar="N",
    help="Listener processes, restarted by a supervisor if one dies.")]
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
WaitForRedisOption = Annotated[float, typer.Option(
    "--wait-for-redis", min=0, metavar="SECONDS",
    help="At start, how long to wait for a server that does not answer (tries 0.5 s "
         "doubling to 5 s apart, a line each) before exiting 1; 0: not at all, inf: "
         "until it answers.")]
MaxMemoryOption = Annotated[float | None, typer.Option(
    "--max-memory-per-child", min=1, metavar="MB", show_default=False,
    help="Replace a listener process once its resident memory reaches MB megabytes; "
         "runs it under a supervisor even without --processes.")]
LoopOption = Annotated[LoopChoice | None, typer.Option(
    "--loop", case_sensitive=False, show_default=False,
    help=f"The event loop of the listener processes: uvloop (installed by "
         f"'pip install redis-timers[fast]'), asyncio's own, or auto: uvloop when it is "
         f"installed [default: ${LOOP_ENV} or auto]")]


ReplicasOption = Annotated[int | None, typer.Option(
    "--replicas", min=0, metavar="N",
    help="Start a run only once its claim is on N replicas, so a failover never runs it "
         "again uncounted (one primary with replicas: a plain or Sentinel URL).")]
ReplicasTimeoutOption = Annotated[float | None, typer.Option(
    "--replicas-timeout", metavar="SECONDS",
    help="How long a claim waits for its replicas (default 1); runs it could not confirm "
         "run after their lease, and no claim is sent until N replicas are in sync.")]
HistoryAgeOption = Annotated[str | None, typer.Option(
    "--history-age", metavar="DURATION", show_default=False,
    help="How long ended timers stay in the run history (`timers history`, `timers get`), "
         "e.g. 7d, 12h, unless their task keeps its own (`@task(history=...)`); 0 keeps "
         "none of any task. Default 7d.")]
HistoryCountOption = Annotated[int | None, typer.Option(
    "--history-count", min=0, metavar="N", show_default=False,
    help="At most this many history records per shard, the oldest dropped first, whatever "
         "their task (a task may keep fewer of its own: `@task(history_count=N)`); 0 keeps "
         "none. The listener keeps both bounds, idle or not, a few hundred records per "
         "call. Default 100000 (about 28 MB).")]
SeriesOption = Annotated[bool, typer.Option(
    "--series/--no-series",
    help="Write each task's per-minute figures (runs, failures, lateness, duration) for "
         "the last 24 h.")]


def history_policy(age: str | None, count: int | None, series: bool) -> HistoryPolicy:
    """The listener's history retention from its options (a bad duration: UserError)."""
    from timers.listener.endings.history import HistoryPolicy

    try:
        seconds_ = DEFAULT_HISTORY_AGE if age is None else parse_duration(age)
        return HistoryPolicy(seconds_, DEFAULT_HISTORY_COUNT if count is None else count,
                             series)
    except ValueError as exc:
        raise UserError(f"--history-age: {exc}") from None


def listen(
    url: UrlOption = None,
    tasks: TasksOption = None,
    setup: SetupOption = None,
    concurrency: ConcurrencyOption = DEFAULT_CONCURRENCY,
    lease: LeaseOption = DEFAULT_LEASE,
    burst: BurstOption = False,
    shutdown_timeout: ShutdownTimeoutOption = 30.0,
    processes: ProcessesOption = 1,
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
    wait_for_redis: WaitForRedisOption = WAIT_FOR_REDIS,
    history_age: HistoryAgeOption = None,
    history_count: HistoryCountOption = None,
    series: SeriesOption = True,
    loop: LoopOption = None,
    replicas: ReplicasOption = None,
    replicas_timeout: ReplicasTimeoutOption = None,
) -> None:
    """Run timers as they come due (subscribes to expired events and sweeps the due index)."""
    from timers.listener.supervision.recycling import report_fd
    from timers.listener.supervision.supervisor import ListenOptions

    log_format = set_up_logs(log_level, log_format, processes)
    _pass_on(loop, setup)
    options = ListenOptions(url=url, tasks=tasks, prefix=prefix, concurrency=concurrency,
                            lease=lease, shutdown_timeout=shutdown_timeout,
                            log_level=log_level, burst=burst, allow_eviction=allow_eviction,
                            log_format=log_format, log_fires=log_fires,
                            max_runs_per_child=max_runs_per_child,
                            max_memory_per_child=max_memory_per_child, groups=_served(group),
                            metrics_port=metrics_port, metrics_host=metrics_host,
                            wait_for_redis=wait_for_redis, history_age=history_age,
                            history_count=history_count, series=series,
                            replicas=replicas, replicas_timeout=replicas_timeout)
    _check_policies(options)
    if processes > 1 or (report_fd() is None and (options.recycles or _is_init())):
        raise typer.Exit(_supervise(options, processes))
    _listen_here(options)


def _pass_on(loop: LoopChoice | None, setup: str | None) -> None:
    """Check ``--loop`` and ``--setup`` here, once, and put them in the environment, which
    carries them to every process the listener starts."""
    from timers.listener.calling.loader import check_setup

    try:
        event_loop.chosen_loop(loop)  # a loop that cannot be had: refused here, once
    except ValueError as exc:
        raise UserError(f"--loop: {exc}" if loop else f"${LOOP_ENV}: {exc}") from None
    if loop is not None:  # the environment carries it to every process the listener starts
        os.environ[LOOP_ENV] = loop
    if setup is not None:  # the environment carries it to every process the listener starts
        try:
            check_setup(setup)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        os.environ[SETUP_ENV] = setup


def _check_policies(options: ListenOptions) -> None:
    """Refuse a bad history retention or replica policy here, once, before any listener
    process starts (each would refuse it)."""
    from timers.ops.replication import ReplicaPolicy

    history_policy(options.history_age, options.history_count, options.series)
    try:  # (--replicas takes any N ≥ 0: typer checks it)
        ReplicaPolicy(options.replicas, options.replicas_timeout)
    except ValueError as exc:
        raise UserError(f"--replicas-timeout: {exc}") from None


def _is_init() -> bool:
    """This process is PID 1 (a container's first process): then even one listener runs
    under the supervisor, which reaps every process the container's tasks leave behind."""
    return os.getpid() == 1


def _supervise(options: ListenOptions, processes: int) -> int:
    from timers.listener.calling.loader import TaskLoader, configured_package
    from timers.listener.supervision.foreground import wait_for_server_at
    from timers.listener.supervision.recycling import check_memory_limit
    from timers.listener.supervision.supervisor import Supervisor

    # refuse before starting children that would each refuse
    TaskLoader(configured_package(options.tasks), search_path=os.getcwd()).load()
    check_memory_limit(options.max_memory_per_child)  # about a child's size: refuse once
    url_now = configured_url(options.url)
    # the children wait for the server themselves later, without limit
    if not wait_for_server_at(url_now, url_address(url_now), options.wait_for_redis):
        return 0
    supervisor = Supervisor.for_listeners(options, processes)
    listen_metrics.serve_for_children(supervisor, options.metrics_port, options.metrics_host)
    return supervise(supervisor)


def _served(groups: list[str] | None) -> tuple[str, ...]:
    try:
        return served_groups(groups)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _listen_here(options: ListenOptions) -> None:
    from timers.listener import Listener
    from timers.listener.supervision.recycling import RecycleLimits
    from timers.listener.tuning import collector

    try:
        listener = Listener(options.url, prefix=options.prefix,
                            tasks=options.tasks,
                            concurrency=options.concurrency or DEFAULT_CONCURRENCY,
                            lease=options.lease or DEFAULT_LEASE,
                            shutdown_timeout=options.shutdown_timeout,
                            allow_eviction=options.allow_eviction,
                            recycle=RecycleLimits(options.max_runs_per_child,
                                                  options.max_memory_per_child),
                            groups=options.groups or None, quarantine_ahead=True,
                            history=history_policy(options.history_age,
                                                   options.history_count, options.series),
                            replicas=options.replicas,
                            replicas_timeout=options.replicas_timeout)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    listener_logs(listener, options.log_fires)
    listener.loader.load()  # a package that cannot be imported: refused before any wait
    metrics = listen_metrics.record(listener, options.metrics_port, options.metrics_host)
    collector.tune()  # the app is imported: what it holds now lasts the process
    event_loop.run(_listen(listener, options, url_address(configured_url(options.url)),
                           metrics))
    listener.tally.log_stopped()
    # Threads of tasks that outlived the shutdown timeout were handed back; don't wait
    # for them at interpreter exit.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(1 if listener.aborted or listener.crashed else 0)


async def _listen(listener: Listener, options: ListenOptions, where: str,
                  metrics: Any) -> None:
    from timers.listener.supervision.foreground import run_in_foreground, wait_for_server
    from timers.listener.supervision.orphans import supervisor_pid

    wait = math.inf if supervisor_pid() is not None else options.wait_for_redis
    if not await wait_for_server(listener.redis, where, wait=wait):
        return  # stopped by a signal before the server answered
    logging.getLogger("timers").info(
        "starting on %s (tasks package %r, concurrency %d, event loop %s)",
        where, listener.loader.package, listener.concurrency, event_loop.loop_name())
    done = asyncio.Event()
    sampler = listen_metrics.sample(metrics, listener, done) if metrics else None
    try:
        await run_in_foreground(listener, burst=options.burst)
    except (EvictionUnsafe, PermissionMissing, UnknownFormat) as exc:
        raise UserError(str(exc)) from None
    finally:
        done.set()
        if sampler is not None:
            await sampler


def where_tasks_come_from(message: str, given: str | None, cwd: str) -> str:
    """A listener's tasks package that cannot be imported, said with how to name the right
    one: ``--tasks`` / ``$TIMERS_TASKS`` when neither named it, where it is looked for."""
    if given is None and not os.environ.get(TASKS_ENV):
        return (f"{message}; name your tasks package with --tasks myapp.tasks or "
                f"{TASKS_ENV}=myapp.tasks (looked for on PYTHONPATH, then in {cwd})")
    return f"{message} (looked for on PYTHONPATH, then in {cwd})"


def _hinting(command: Any) -> Any:
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TasksUnavailable as exc:
            raise TasksUnavailable(where_tasks_come_from(
                str(exc), kwargs.get("tasks"), os.getcwd())) from None
    return run


def register(app: typer.Typer) -> None:
    """Add ``listen`` to the ``timers`` command line."""
    app.command("listen")(friendly(_hinting(listen)))
