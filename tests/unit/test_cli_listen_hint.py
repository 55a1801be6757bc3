"""``timers listen`` where its tasks package cannot be imported: the one line says how to
name the right one (``--tasks`` / ``$TIMERS_TASKS``) when neither named it, and where it was
looked for. The package is checked before the server is reached: nothing connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from timers.cli import app
from timers.cli.errors import run_app
from timers.cli.listen import where_tasks_come_from

NOWHERE = "redis://127.0.0.1:1/0"


@pytest.fixture(autouse=True)
def empty_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIMERS_TASKS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return tmp_path


def test_no_tasks_package_named_suggests_naming_one() -> None:
    # (the default package, tasks, is this repository's: importable in the test process,
    # so the line is checked on its own; tests/integration/test_listen_hint.py meets it)
    said = where_tasks_come_from("tasks package 'tasks' cannot be imported: "
                                 "ModuleNotFoundError: No module named 'tasks'", None, "/srv/app")
    assert said.endswith("; name your tasks package with --tasks myapp.tasks or "
                         "TIMERS_TASKS=myapp.tasks (looked for on PYTHONPATH, then in /srv/app)")


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_named_package_that_is_missing_says_where_it_was_looked_for(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        empty_directory: Path, how: str) -> None:
    argv = ["listen", "--url", NOWHERE, "--burst", "--wait-for-redis", "0"]
    if how == "option":
        argv += ["--tasks", "myapp.tasks"]
    else:
        monkeypatch.setenv("TIMERS_TASKS", "myapp.tasks")
    assert run_app(app, argv) == 1
    err = capsys.readouterr().err
    assert "tasks package 'myapp.tasks' cannot be imported" in err
    assert "--tasks myapp.tasks or" not in err  # named already: no advice to name it
    assert err.rstrip().endswith(f"(looked for on PYTHONPATH, then in {empty_directory})")
