"""``timers --version``, ``timers schedule --help`` and ``timers schedule`` in a fresh
interpreter: what each loads. The listener's machinery stays out of all three, and the
first two load no command module but their own (start-up time is measured, not asserted:
see docs/guides/command-line.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from timers import Timers

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
    assert timers_client.get("startup-probe") is not None
