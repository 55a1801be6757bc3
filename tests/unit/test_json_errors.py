"""Under ``timers listen --log-format json`` every line is JSON, the one error line
included; the supervisor's death is one graceful stop, however it is noticed."""

from __future__ import annotations

import asyncio
import json

import pytest

from timers.cli import app
from timers.cli.common import ERRORS, ErrorOutput
from timers.cli.errors import asks_for_json, run_app
from timers.listener.supervision.foreground import StopOnSignals
from timers.listener.supervision.orphans import watch_parent


@pytest.fixture(autouse=True)
def text_errors_after() -> None:
    yield
    ERRORS.as_json = False


@pytest.mark.parametrize(("args", "env", "wanted"), [
    (["listen", "--log-format", "json"], {}, True),
    (["listen", "--log-format=JSON", "-p", "2"], {}, True),
    (["listen"], {"TIMERS_LOG_FORMAT": "json"}, True),
    (["listen", "--log-format", "text"], {"TIMERS_LOG_FORMAT": "json"}, False),
    (["listen"], {}, False),
    (["list"], {"TIMERS_LOG_FORMAT": "json"}, False),  # the log format is listen's
    (["schedule", "listen", "--in", "1s"], {"TIMERS_LOG_FORMAT": "json"}, False),
])
def test_json_is_asked_for_by_the_option_or_the_environment(
        args: list[str], env: dict[str, str], wanted: bool) -> None:
    assert asks_for_json(args, env) is wanted


def test_the_error_line_is_a_json_log_line() -> None:
    line = ErrorOutput(as_json=True).line("cannot connect to Redis at redis://:pw@h:1/0\nagain")
    data = json.loads(line)
    assert (data["level"], data["logger"]) == ("ERROR", "timers.cli")
    assert data["message"] == "cannot connect to Redis at redis://***@h:1/0 again"
    assert {"ts", "pid", "role", "listener"} <= set(data)
    assert ErrorOutput().line("x") == "error: x"


@pytest.mark.parametrize("argv", [
    ["listen", "--log-format", "json", "--concurrency", "0"],  # a usage error
    ["listen", "--log-format", "json", "--bogus"],
    ["listen", "--log-format", "json", "--tasks", "no_such_tasks_package_here"],
])
def test_listen_errors_under_json_are_json(capsys: pytest.CaptureFixture[str],
                                           argv: list[str]) -> None:
    code = run_app(app, argv)
    out, err = capsys.readouterr()
    assert code in (1, 2) and out == ""
    lines = err.splitlines()
    assert lines and all(json.loads(line)["level"] for line in lines), err
    assert json.loads(lines[-1])["level"] == "ERROR"


class Target:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def stop(self) -> None:
        self.calls.append("stop")

    def abort(self) -> None:
        self.calls.append("abort")


def test_the_supervisor_seen_gone_after_its_death_signal_is_the_same_graceful_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    target = Target()
    handler = StopOnSignals(target, same_stop_window=1.0, monotonic=lambda: now[0])
    handler()  # PR_SET_PDEATHSIG's SIGTERM
    now[0] = 5.0  # the parent watch notices later than the same-stop window
    parents = iter([42, 1])

    async def watch() -> None:
        watching = asyncio.create_task(watch_parent(
            42, handler.stop_once, target.abort, getppid=lambda: next(parents),
            interval=0.001, grace=0.2))
        await asyncio.sleep(0.1)
        assert target.calls == ["stop"], "no abort yet: the tasks get the grace"
        await watching

    asyncio.run(asyncio.wait_for(watch(), 5))
    assert target.calls == ["stop", "abort"], "then handed back, as the line says"
    (line,) = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert "running tasks get 0.2 s (at most the shutdown timeout) to finish" in line
    assert "handed back" in line
    alone = Target()
    StopOnSignals(alone).stop_once()
    assert alone.calls == ["stop"]
