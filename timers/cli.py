"""The ``timers`` command line.

A user error (bad JSON, a bad duration, an unknown task, a server that does not answer)
prints one line saying what is wrong and exits 1; no tracebacks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import redis
import typer

from timers.check import assess, permission_findings, verdict
from timers.cli_common import PrefixOption, UrlOption, UserError, friendly, open_timers
from timers.cli_cron import cron_app
from timers.cli_failed import failed_app
from timers.client import URL_ENV, configured_url
from timers.due import format_duration, parse_duration
from timers.keys import DEFAULT_PREFIX
from timers.listener import DEFAULT_CONCURRENCY, DEFAULT_LEASE, Listener
from timers.listener.eviction import EvictionUnsafe
from timers.listener.orphans import ask_for_signal_on_parent_death, supervisor_pid, watch_parent
from timers.listener.permissions import PermissionMissing, probe_url
from timers.listener.supervisor import Supervisor
from timers.loader import TASKS_ENV, TaskLoader, configured_package

app = typer.Typer(
    help="Delayed timers on Redis: schedule a task call for later; listeners fire it once.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(failed_app, name="failed")
app.add_typer(cron_app, name="cron")


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


def _when(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# -- listen -----------------------------------------------------------------------------


@app.command()
@friendly
def listen(
    url: UrlOption = None,
    tasks: Annotated[
        str | None,
        typer.Option("--tasks", help=f"Package whose functions timers may run [default: "
                                     f"${TASKS_ENV} or tasks], imported from the working "
                                     f"directory."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Tasks run at once, at most.")
    ] = DEFAULT_CONCURRENCY,
    lease: Annotated[
        float, typer.Option("--lease", min=0.1, help="Seconds a crashed listener's timers wait "
                                                     "before they run again elsewhere.")
    ] = DEFAULT_LEASE,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once nothing is due and nothing runs.")
    ] = False,
    shutdown_timeout: Annotated[
        float, typer.Option("--shutdown-timeout", help="Seconds running tasks get to finish "
                                                       "on SIGTERM/SIGINT.")
    ] = 30.0,
    processes: Annotated[
        int, typer.Option("--processes", "-p", min=1, help="Listener processes, restarted "
                                                          "by a supervisor if one dies.")
    ] = 1,
    prefix: PrefixOption = DEFAULT_PREFIX,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
    allow_eviction: Annotated[
        bool, typer.Option("--allow-eviction", help="Start even on an allkeys-* eviction "
                                                    "policy, which can evict pending timers.")
    ] = False,
) -> None:
    """Run timers as they come due (subscribes to expired events and sweeps the due index)."""
    _configure_logging(log_level)
    if processes > 1:  # refuse before starting children that would each refuse
        TaskLoader(configured_package(tasks), search_path=os.getcwd()).load()
        command = [sys.executable, "-m", "timers", "listen", "--concurrency", str(concurrency),
                   "--lease", str(lease), "--shutdown-timeout", str(shutdown_timeout),
                   "--prefix", prefix, "--log-level", log_level]
        command += ["--url", url] if url else []
        command += ["--tasks", tasks] if tasks else []
        command += ["--burst"] if burst else []
        command += ["--allow-eviction"] if allow_eviction else []
        supervisor = Supervisor(command, processes, shutdown_timeout=shutdown_timeout,
                                restart_clean_exits=not burst)
        raise typer.Exit(supervisor.run())
    try:
        listener = Listener(url, prefix=prefix, tasks=tasks, concurrency=concurrency,
                            lease=lease, shutdown_timeout=shutdown_timeout,
                            allow_eviction=allow_eviction)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    asyncio.run(_listen(listener, burst, _safe_url(configured_url(url))))
    # Threads of tasks that outlived the shutdown timeout were handed back; don't wait
    # for them at interpreter exit.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(1 if listener.aborted or listener.crashed else 0)


def _safe_url(url: str) -> str:
    """The URL without a password."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


async def _listen(listener: Listener, burst: bool, where: str) -> None:
    try:
        await listener.redis.ping()
    except redis.exceptions.ConnectionError as exc:
        await listener.redis.aclose()
        raise UserError(
            f"cannot connect to Redis at {where}: {exc} (set --url or ${URL_ENV}; "
            f"`timers demo` runs on an embedded server)"
        ) from None
    logging.getLogger("timers").info(
        "listening on %s (tasks package %r, concurrency %d)",
        where, listener.loader.package, listener.concurrency)
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            logging.getLogger("timers").info("stopping: waiting for running tasks (signal "
                                             "again to exit at once)")
            listener.stop()
        else:
            listener.abort()

    # SIGHUP (a closed terminal, a service manager's reload) stops gracefully too
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal)
    parent = supervisor_pid()
    watcher = None
    if parent is not None:
        ask_for_signal_on_parent_death()
        watcher = asyncio.create_task(watch_parent(parent, on_signal))
    try:
        await listener.run(burst=burst)
    except (EvictionUnsafe, PermissionMissing) as exc:
        raise UserError(str(exc)) from None
    finally:
        if watcher is not None:
            watcher.cancel()


# -- producer commands ------------------------------------------------------------------


@app.command()
@friendly
def schedule(
    task: Annotated[str, typer.Argument(help="Dotted path under the tasks package, e.g. "
                                             "reminders.sms")],
    args_json: Annotated[
        str | None,
        typer.Argument(metavar="[ARGS_JSON]", help='JSON list (positional) or object '
                                                   '(keyword), e.g. \'{"user_id": 42}\''),
    ] = None,
    in_: Annotated[
        str | None, typer.Option("--in", help="Delay: 30s, 5m, 2h, 1d, 1h30m, or seconds.")
    ] = None,
    at: Annotated[
        str | None, typer.Option("--at", help="ISO 8601 time with a zone, e.g. "
                                              "2026-12-01T09:00:00+01:00")
    ] = None,
    id: Annotated[
        str | None, typer.Option("--id", help="Timer id; a pending timer with it is replaced.")
    ] = None,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Schedule a timer; prints its id."""
    if (in_ is None) == (at is None):
        raise UserError("give exactly one of --in or --at")
    args = _parse_args(args_json)
    delay = parse_duration(in_) if in_ is not None else None
    when = _parse_at(at) if at is not None else None
    with open_timers(url, prefix) as t:
        typer.echo(t.schedule(task, args, in_=delay, at=when, id=id))


@app.command()
@friendly
def cancel(
    id: Annotated[str, typer.Argument(help="Timer id.")],
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Cancel a pending timer; exits 1 if it was not pending."""
    with open_timers(url, prefix) as t:
        if t.cancel(id):
            typer.echo(f"cancelled {id}")
            return
    typer.echo(f"{id} is not pending (already fired, cancelled, or never scheduled)", err=True)
    raise typer.Exit(1)


@app.command()
@friendly
def get(
    id: Annotated[str, typer.Argument(help="Timer id.")],
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Show a pending timer; exits 1 if it is not pending."""
    with open_timers(url, prefix) as t:
        timer = t.get(id)
    if timer is None:
        typer.echo(f"{id} is not pending", err=True)
        raise typer.Exit(1)
    left = timer.seconds_left(datetime.now(UTC))
    typer.echo(f"id:       {timer.id}")
    typer.echo(f"task:     {timer.task}")
    typer.echo(f"args:     {json.dumps(timer.args, ensure_ascii=False)}")
    typer.echo(f"due:      {_when(timer.due)} (in {format_duration(left)})")
    if timer.attempts:
        typer.echo(f"attempts: {timer.attempts}")


@app.command("list")
@friendly
def list_(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many.")] = 20,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """List pending timers, soonest first."""
    with open_timers(url, prefix) as t:
        pending = t.list(limit)
        total = t.stats().pending
    if not pending:
        typer.echo("no pending timers")
        return
    now = datetime.now(UTC)
    typer.echo(f"{'DUE (UTC)':<24} {'IN':>9}  {'ID':<20} {'TASK':<24} ARGS")
    for timer in pending:
        args = json.dumps(timer.args, ensure_ascii=False)
        typer.echo(f"{_when(timer.due):<24} {format_duration(timer.seconds_left(now)):>9}  "
                   f"{timer.id:<20} {timer.task:<24} {args[:60]}")
    if total > len(pending):
        typer.echo(f"… {total - len(pending)} more (--limit)")


@app.command()
@friendly
def listeners(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """List live listeners (from their heartbeats)."""
    with open_timers(url, prefix) as t:
        live = t.listeners()
    if not live:
        typer.echo("no live listeners")
        return
    now = datetime.now(UTC).timestamp()
    typer.echo(f"{'ID':<36} {'HOST':<20} {'PID':>7} {'UP':>8} {'RUNNING':>7} {'FIRED':>9} "
               f"{'STUCK':>5}")
    for info in sorted(live, key=lambda i: str(i.get("id"))):
        up = format_duration(now - float(info.get("started", now)))
        typer.echo(f"{info.get('id')!s:<36} {info.get('host')!s:<20} "
                   f"{info.get('pid', ''):>7} {up:>8} {info.get('running', 0):>7} "
                   f"{info.get('fired', 0):>9} {info.get('stuck', 0):>5}")


@app.command()
@friendly
def stats(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Counts: pending, running, failed, fired (and reruns after crashes)."""
    with open_timers(url, prefix) as t:
        s = t.stats()
    typer.echo(f"pending:  {s.pending}")
    typer.echo(f"running:  {s.running}")
    typer.echo(f"failed:   {s.failed}")
    typer.echo(f"fired:    {s.fired}")
    for name in sorted(set(s.counters) - {"fired", "failed"}):
        typer.echo(f"{name + ':':<9} {s.counters[name]}")


@app.command()
@friendly
def check(url: UrlOption = None, prefix: PrefixOption = DEFAULT_PREFIX) -> None:
    """Check that a server will fire timers reliably; exits 1 if it will not."""
    client = redis.Redis.from_url(configured_url(url), decode_responses=True)
    try:
        info = {str(k): str(v) for k, v in client.info("server").items()}
        try:
            config = {str(k): str(v) for k, v in client.config_get("*").items()}
        except redis.exceptions.ResponseError:
            config = {}
    finally:
        client.close()
    findings = assess(info, config) + permission_findings(
        probe_url(configured_url(url), prefix))
    for f in findings:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[f.level]
        typer.echo(f"{mark} {f.name}: {f.value}")
        if f.advice:
            typer.echo(f"     {f.advice}")
    if not verdict(findings):
        typer.echo("timers would not fire reliably on this server", err=True)
        raise typer.Exit(1)


@app.command()
@friendly
def demo(
    count: Annotated[int, typer.Option("--count", min=1, help="Timers to schedule.")] = 5,
    url: UrlOption = None,
) -> None:
    """Start a listener (on an embedded Redis unless a URL is configured) and fire timers."""
    from timers.demo import run_demo

    run_demo(count, url)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
