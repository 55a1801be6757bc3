"""A quarantine child whose listener went away (its end of the pipe closed: a timeout, a
shutdown, a listener killed) says so in one log line, in the listener's log format, and
exits; no traceback past the format."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT
from tests.integration.helpers import subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

CHILD = textwrap.dedent("""\
    import multiprocessing, os, sys
    from timers.listener.quarantine import child as quarantine_child

    receiver, sender = multiprocessing.Pipe(duplex=False)
    receiver.close()  # the listener went away
    logs = quarantine_child.ChildLogs("INFO", "json", "web-1:4242:ab12cd")
    quarantine_child.child_main("tests.unit.sample_tasks", None, "mod.add", b"", "[1, 2]",
                                sender, dict(os.environ), None, logs)
    """)


def test_a_quarantine_child_whose_listener_went_away_logs_one_line_in_its_format() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each line is JSON
    (said,) = lines
    assert said["level"] == "WARNING" and said["role"] == "quarantine"
    assert said["listener"] == "web-1:4242:ab12cd"
    assert "the listener went away" in said["message"] and "mod.add" in said["message"]
