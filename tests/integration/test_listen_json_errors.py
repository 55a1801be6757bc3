"""Under ``timers listen --log-format json`` every line on stderr is JSON: the start-up
errors an operator searches for (no server, a tasks package that cannot be imported, a
usage error) and what Python itself would print (a warning at import) included."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.helpers import TIMERS_COMMAND, subprocess_env
from timers.dev.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def listen(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
           ) -> tuple[int, list[dict[str, object]]]:
    """Run ``timers listen ARGS``; its exit code and every stderr line parsed as JSON
    (the test fails on the first line that is not)."""
    environ = {**subprocess_env(), **(env or {})}
    done = subprocess.run([TIMERS_COMMAND, "listen", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=60, check=False)
    lines = []
    for line in done.stderr.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not JSON: {line!r}\n--- stderr:\n{done.stderr}")
    assert lines, "nothing on stderr"
    return done.returncode, lines


def refused() -> tuple[str, str]:
    port = free_port()
    return f"redis://127.0.0.1:{port}/0", f"cannot connect to Redis at 127.0.0.1:{port}"


@pytest.mark.parametrize("processes", ["1", "2"])
def test_no_server(processes: str) -> None:
    url, words = refused()
    code, lines = listen("--log-format", "json", "-p", processes, "--url", url,
                         "--tasks", "tests.retry_tasks", "--wait-for-redis", "1")
    assert code == 1
    *tries, last = lines
    assert [t["level"] for t in tries] == ["WARNING"] * len(tries) and len(tries) >= 2
    assert last["level"] == "ERROR" and last["message"] == (
        f"{words}: connection refused (waited 1 s: --wait-for-redis)")
    assert last["role"] == ("supervisor" if processes == "2" else "listener")


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_tasks_package_that_cannot_be_imported(redis_url: str, processes: str) -> None:
    code, lines = listen("--log-format", "json", "-p", processes, "--url", redis_url,
                         "--tasks", "no_such_tasks_package")
    assert code == 1
    assert [line["level"] for line in lines] == ["ERROR"]
    assert str(lines[0]["message"]).startswith(
        "tasks package 'no_such_tasks_package' cannot be imported: ModuleNotFoundError")


def test_json_from_the_environment_and_a_usage_error() -> None:
    code, lines = listen("--concurrency", "0", env={"TIMERS_LOG_FORMAT": "json"})
    assert code == 2 and len(lines) == 1 and lines[0]["level"] == "ERROR"
    assert "--concurrency" in str(lines[0]["message"])


def test_a_warning_at_import_is_a_json_line(redis_url: str, tmp_path: Path) -> None:
    package = tmp_path / "warned_tasks"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import warnings\nwarnings.warn('old_api() is deprecated', DeprecationWarning)\n"
        "warnings.simplefilter('default')\n"
        "warnings.warn('this task package warns', UserWarning)\n"
        "def hello() -> None:\n    pass\n")
    code, lines = listen("--log-format", "json", "--burst", "--url", redis_url,
                         "--tasks", "warned_tasks", cwd=tmp_path)
    assert code == 0
    (warned,) = [line for line in lines if "this task package warns" in str(line["message"])]
    assert (warned["level"], warned["logger"]) == ("WARNING", "py.warnings")
