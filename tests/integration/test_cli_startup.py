"""``timers --version``, ``timers schedule --help``, ``timers schedule``, every command's
help and ``timers get`` in a fresh interpreter: what each loads. The listener's machinery
stays out of all of them, the first two load no command module but their own, no help
loads the operations or the client, ``timers get`` loads neither ``timers move``'s
operations nor the log formats nor another command, and neither it nor ``timers schedule``
loads task policies, the dashboard's snapshot or Sentinel (start-up time is measured, not
asserted: see docs/guides/command-line.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from timers import Timers
from timers.cli.app import COMMANDS

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

PROBE = """
import json, sys
from timers.cli.app import app
from timers.cli.errors import run_app

seen = {}
for argv in json.loads(sys.argv[1]):
    code = run_app(app, argv)
    seen[" ".join(argv[:2])] = (code, sorted(m for m in sys.modules
                                           if m.startswith(("timers", "pydantic"))))
print(json.dumps(seen))
"""


def test_schedule_loads_no_listener(redis_url: str, timers_client: Timers) -> None:
    runs = [["--version"], ["schedule", "--help"],
            ["schedule", "reminders.sms", "[42]", "--in", "1h", "--url", redis_url,
             "--id", "startup-probe"]]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(runs)],
                          capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout.splitlines()[-1])
    for code, modules in seen.values():
        assert code == 0
        assert not [m for m in modules if m.startswith("timers.listener")], modules
    version, help_, schedule = (set(seen[k][1]) for k in
                                ("--version", "schedule --help", "schedule reminders.sms"))
    assert not {m for m in version if m.startswith("timers.cli.")} - {
        "timers.cli.app", "timers.cli.coerce", "timers.cli.common", "timers.cli.errors"}
    assert "timers.producer.client" not in help_ and "timers.cli.produce" in help_
    assert "timers.cli.views" not in help_ and "timers.cli.listen" not in help_
    assert not any(m.startswith("pydantic") for m in version | help_ | schedule)  # (typer's
    # conversion of values: timers.cli.coerce converts them, 0.1 s of CPU less)
    assert "timers.producer.client" in schedule
    assert not [m for m in schedule if m.startswith(NOT_FOR_PRODUCERS)], schedule
    assert timers_client.get("startup-probe") is not None


HELP_RUNS = [["--help"], *([name, "--help"] for name in COMMANDS if name not in {"listen", "move"}),
             ["failed", "list", "--help"], ["cron", "list", "--help"]]
"""Every command's help but those of ``timers listen`` (its options name the listener's
defaults) and ``timers move`` (its --wait default is the one of :mod:`timers.ops.moves`)."""

NOT_FOR_HELP = ("timers.ops.", "timers.producer.", "timers.listener", "timers.model.history",
                "timers.model.cron", "timers.logs", "rich")
"""What no command's help loads: the operations and the client (loaded by a command when
it runs), the listener, the history and cron models, the log formats, rich (``timers top``
draws with it)."""

NOT_FOR_PRODUCERS = ("timers.model.policy", "timers.model.flow.rates", "timers.ops.snapshot",
                     "timers.store.sentinel")
"""What no producer command loads on one shard over a plain URL: task policies and rate
limits (a sharded prefix's placement reads them), the dashboard's snapshot, Sentinel."""

NOT_FOR_GET = ("timers.listener", "timers.ops.moves", "timers.logs", "timers.cli.produce",
               "timers.ops.fleet", "rich", *NOT_FOR_PRODUCERS)
"""What ``timers get`` does not load: the listener, moves, the log formats, other
commands, the fleet's tasks (read by a retry and a first schedule), nor
:data:`NOT_FOR_PRODUCERS`."""


def loaded(runs: list[list[str]]) -> dict[str, tuple[int, list[str]]]:
    """Each run's exit code and every module loaded by then (``timers…`` and ``rich…``),
    the runs made in turn in one fresh interpreter."""
    probe = PROBE.replace('m.startswith(("timers", "pydantic"))',
                          'm.startswith(("timers", "pydantic", "rich"))')
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(runs)],
                          capture_output=True, text=True, timeout=60, check=True)
    seen: dict[str, tuple[int, list[str]]] = json.loads(done.stdout.splitlines()[-1])
    return seen


def test_help_loads_no_operations() -> None:
    seen = loaded(HELP_RUNS)
    assert [code for code, _ in seen.values()] == [0] * len(HELP_RUNS)
    modules = seen[" ".join(HELP_RUNS[-1][:2])][1]  # (everything the runs loaded)
    assert not [m for m in modules if m.startswith(NOT_FOR_HELP)], modules
    assert {"timers.cli.views", "timers.cli.top", "timers.cli.cron"} <= set(modules)
    code, modules = loaded([["move", "--help"]])["move --help"]
    assert code == 0
    assert not [m for m in modules if m.startswith((
        "timers.producer.", "timers.ops.operations", "timers.ops.fleet", "timers.listener",
        "timers.model.cron", "timers.logs", "rich"))], modules


LISTEN_HELP_LOADS = {"timers.listener", "timers.listener.defaults", "timers.listener.tuning",
                     "timers.listener.tuning.event_loop", "timers.listener.supervision",
                     "timers.listener.supervision.orphans"}
"""All ``timers listen --help`` loads of the listener: its defaults, the event loop's
choices and the supervisor's pid (none of them imports more of it)."""


def test_listen_help_loads_none_of_the_listener_it_would_run() -> None:
    code, modules = loaded([["listen", "--help"]])["listen --help"]
    assert code == 0
    assert {m for m in modules if m.startswith("timers.listener")} == LISTEN_HELP_LOADS
    assert not [m for m in modules if m.startswith((
        "timers.producer.", "timers.ops.", "timers.model.cron", "timers.model.policy",
        "rich"))], modules


def test_get_loads_what_it_shows(redis_url: str, timers_client: Timers) -> None:
    timers_client.schedule("reminders.sms", [42], in_=3600, id="startup-get")
    runs = [["get", "startup-get", "--url", redis_url]]
    code, modules = loaded(runs)["get startup-get"]
    assert code == 0
    assert not [m for m in modules if m.startswith(NOT_FOR_GET)], modules
    assert "timers.producer.client" in modules and "timers.ops.status" in modules
