"""The docs' shell walkthroughs that need a server, run as written by bash against the
test server (the unit tests only parse their ``timers`` commands): the five-minute path
and the tour of docs/getting-started.md, a task package of your own
(docs/guides/your-own-app.md) and the JSON logs (docs/guides/listeners.md). Only where a
block names a place of the reader's do the tests put their own: the server's URL, and a
temporary directory for ``/tmp/…`` or for the five-minute path's "same directory"."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import poll
from tests.docs_blocks import Block, blocks_of
from tests.integration.helpers import TIMERS_COMMAND
from tests.unit.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def block(page: str, starting: str, lang: str = "sh") -> Block:
    (found,) = [b for b in blocks_of(ROOT / page)
                if b.lang == lang and b.code.startswith(starting)]
    return found


def env_for(url: str) -> dict[str, str]:
    """This environment with ``timers`` (and ``python``) of this venv first on PATH, the
    server at ``url``, and no ``PYTHONPATH``: it would put this repository's ``tasks``
    package ahead of the one a block makes in its own directory."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("TIMERS_", "PYTEST_"))}
    env["PATH"] = os.pathsep.join([str(Path(TIMERS_COMMAND).parent), env.get("PATH", "")])
    env["TIMERS_REDIS_URL"] = url
    return env


def run(script: str, url: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``script`` under ``bash -e``, in ``cwd`` (default: the repository)."""
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env_for(url), text=True,
                          capture_output=True, timeout=90, check=False)


def test_the_getting_started_tour(redis_url: str) -> None:
    (code,) = [b.code for b in blocks_of(ROOT / "docs/getting-started.md")
               if b.lang == "sh" and "\ntimers check\n" in b.code]
    lines = code.splitlines()
    # the venv is this test's own (on PATH); the server is the suite's, not `timers server`'s
    assert lines[0] == ". .venv/bin/activate" and lines[1].startswith("export TIMERS_REDIS_URL=")
    done = run("\n".join(lines[2:]), redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reminders.sms" in done.stdout  # timers list
    assert "SMS to user 42" in done.stderr  # the listener ran tasks/reminders.py's sms
    assert re.search(r"^fired: +1$", done.stdout, re.M)  # timers stats


def test_a_tasks_package_of_your_own(redis_url: str, tmp_path: Path) -> None:
    code = block("docs/guides/your-own-app.md", "mkdir -p /tmp/myapp-demo").code
    done = run(code.replace("/tmp/myapp-demo", str(tmp_path / "myapp-demo")), redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "invoicing customer 7" in done.stdout


def test_the_json_logs(redis_url: str, tmp_path: Path) -> None:
    code = block("docs/guides/listeners.md", "mkdir -p /tmp/logs-demo").code
    done = run(code.replace("/tmp/logs-demo", str(tmp_path / "logs-demo")), redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello ada" in done.stdout
    schedule_output, _, _ = done.stdout.partition("hello ada")
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    (fire,) = [line for line in lines if line["logger"] == "timers.fires"]
    assert (fire["id"], fire["task"], fire["outcome"]) == ("greet-ada", "hello", "ok")
    assert "greet-ada" in schedule_output  # timers schedule printed the id


def test_the_five_minute_path(redis_url: str, tmp_path: Path) -> None:
    """docs/getting-started.md, steps 3 to 6, as written, in an empty directory: the task,
    ``schedule.py``, a listener that prints ``hello ada`` when the timer fires, and
    ``timers get`` with the lines the page shows."""
    page = "docs/getting-started.md"
    (task,) = [b.code.splitlines() for b in blocks_of(ROOT / page)
               if b.lang == "sh" and "\nmkdir tasks\n" in b.code]
    # the venv is this test's own (on PATH); the server is the suite's, not `timers server`'s
    assert task[0] == ". .venv/bin/activate" and task[1].startswith("export TIMERS_REDIS_URL=")
    schedule = block(page, "import timers\n\ntid = timers.schedule(\"hello", "python")
    (step4,) = commands_of(block(page, "python schedule.py").code)
    (step5,) = commands_of(block(page, "timers listen").code)
    (step6,) = commands_of(block(page, "timers get").code)
    (shown,) = [b.code for b in blocks_of(ROOT / page) if b.code.startswith("id:  ")]
    shown_id = step6.split()[-1]

    here = tmp_path / "first"
    here.mkdir()
    assert run("\n".join(task[2:]), redis_url, cwd=here).returncode == 0
    (here / "schedule.py").write_text(schedule.code)
    scheduled = run(step4, redis_url, cwd=here)
    assert scheduled.returncode == 0, scheduled.stderr
    tid = scheduled.stdout.strip()
    assert re.fullmatch(r"[\w-]{14}", tid) and len(tid) == len(shown_id), tid

    out = here / "listen.out"
    with out.open("w") as stdout:
        listener = subprocess.Popen(["bash", "-e", "-c", step5], cwd=here, env=env_for(redis_url),
                                    stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        # the timer is due 10 s after it was scheduled; the listener must live till then
        poll(lambda: "hello ada" in out.read_text() or listener.poll() is not None, 30)
        assert listener.poll() is None, listener.communicate()[1]
        assert out.read_text() == "hello ada\n"
    finally:
        listener.send_signal(signal.SIGINT)  # Ctrl-C
        _, stderr = listener.communicate(timeout=30)
    assert listener.returncode == 0, stderr
    logged = stderr.splitlines()  # two log lines before it fired, as the page says
    assert "timers: starting on" in logged[0] and "listening:" in logged[1], stderr
    assert "1 ok, 0 failed" in stderr

    got = run(step6.replace(shown_id, tid), redis_url, cwd=here)
    assert got.returncode == 0, got.stderr
    fields = [line.split(":", 1) for line in got.stdout.splitlines()]
    assert [key for key, _ in fields] == [line.split(":", 1)[0] for line in shown.splitlines()]
    values = {key: value.strip() for key, value in fields}
    assert (values["id"], values["status"], values["task"], values["attempts"]) == (
        tid, "completed", "hello.greet", "1")


def commands_of(code: str) -> list[str]:
    """The commands of a shell block, comments dropped."""
    return [line for line in (re.sub(r"\s+#.*$", "", raw).strip() for raw in code.splitlines())
            if line]
