"""What ``timers listen`` delegates to the library: the children's command line, signal
escalation, and reading a server for ``check``."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import typer.main

from tests.conftest import wait_until_async
from timers.cli import app
from timers.listener.supervision.foreground import StopOnSignals, run_in_foreground
from timers.listener.supervision.supervisor import ListenOptions, Supervisor


def _parsed_listen_options(argv: list[str]) -> dict[str, object]:
    """What the real CLI makes of a child's argv (``python -m timers listen …``)."""
    command = typer.main.get_command(app)
    assert argv[1:4] == ["-m", "timers", "listen"]
    ctx = command.make_context("timers", argv[3:], resilient_parsing=True)
    sub = command.get_command(ctx, "listen")  # type: ignore[attr-defined]
    sub_ctx = sub.make_context("listen", argv[4:])
    return dict(sub_ctx.params)


def test_child_command_parses_back_to_the_same_options() -> None:
    options = ListenOptions(url="redis://h:1/2", tasks="myapp.tasks", prefix="app1",
                            concurrency=7, lease=2.5, shutdown_timeout=4.0,
                            log_level="debug", burst=True, allow_eviction=True)
    params = _parsed_listen_options(options.child_command())
    assert params["url"] == "redis://h:1/2" and params["tasks"] == "myapp.tasks"
    assert params["prefix"] == "app1" and params["concurrency"] == 7
    assert params["lease"] == 2.5 and params["shutdown_timeout"] == 4.0
    assert params["log_level"] == "debug" and params["burst"] and params["allow_eviction"]
    assert params["processes"] == 1, "a child is one listener, never a supervisor again"


def test_unset_options_leave_the_listener_defaults() -> None:
    argv = ListenOptions().child_command()
    assert "--url" not in argv and "--tasks" not in argv and "--burst" not in argv


def test_supervisor_for_burst_listeners_does_not_restart_clean_exits() -> None:
    sup = Supervisor.for_listeners(ListenOptions(burst=True, shutdown_timeout=3.0), 3)
    assert (sup.processes, sup.shutdown_timeout, sup.restart_clean_exits) == (3, 3.0, False)
    assert Supervisor.for_listeners(ListenOptions(), 2).restart_clean_exits


class FakeListener:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.done = asyncio.Event()
        self.stopped = asyncio.Event()
        self.redis = None

    def stop(self) -> None:
        self.calls.append("stop")
        self.stopped.set()

    def abort(self) -> None:
        self.calls.append("abort")
        self.done.set()

    async def run(self, stop: asyncio.Event | None = None, *, burst: bool = False) -> None:
        await self.done.wait()


def test_first_signal_stops_any_later_one_aborts() -> None:
    target = FakeListener()
    handler = StopOnSignals(target)
    handler()
    assert target.calls == ["stop"]
    handler()
    handler()
    assert target.calls == ["stop", "abort", "abort"]


def test_a_supervised_child_takes_a_signal_right_after_the_first_as_the_same_stop() -> None:
    """systemd's default KillMode signals the child directly and through its supervisor."""
    now = [100.0]
    target = FakeListener()
    handler = StopOnSignals(target, same_stop_window=1.0, monotonic=lambda: now[0])
    handler()
    now[0] += 0.3
    handler()
    assert target.calls == ["stop"]
    now[0] += 1.0
    handler()
    assert target.calls == ["stop", "abort"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_reach_a_foreground_listener(sig: signal.Signals) -> None:
    target = FakeListener()

    async def main() -> None:
        default = signal.getsignal(sig)
        task = asyncio.create_task(run_in_foreground(target))  # type: ignore[arg-type]
        await wait_until_async(lambda: signal.getsignal(sig) != default,
                               message="the listener's signal handlers")
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(target.stopped.wait(), 5)
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert target.calls == ["stop", "abort"]
    # the handlers are removed afterwards: the default disposition is back
    assert signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler)
